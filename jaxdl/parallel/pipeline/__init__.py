"""Pipeline parallelism: a model's stages on the devices of a stage axis.

A model split into p stages, stage s a function `fn_s(params_s, x) -> y` of
its own parameters (`stages`: `Stages`, `model_stages`), runs with stage s
on device s of a mesh axis; each global batch is cut into m micro-batches.
A schedule (`schedules`: GPipe, or 1F1B) says what each stage does in each
slot: a forward of a micro-batch (its output handed to the next stage,
`lax.ppermute`), a backward (its input's cotangent handed to the stage
before; the last stage's starts from the micro-batch's loss), or nothing
(the bubble: (p - 1) of m + p - 1). One executor runs any schedule
(`executor`: `scheduled_gradients`), a backward recomputing its stage's
forward from the input kept at the forward; the loss's gradient it returns
is a custom VJP, so an algorithm differentiates the loss as any other
(`task`: `pipeline_task`).

Stages with batch norm normalize each micro-batch by its own statistics (as
GPipe does) and move their running statistics at each forward, micro-batch
0 first; those statistics travel as (p, S) rows like the parameters. A step
then equals one device running the micro-batches in turn (`pipeline_task`'s
loss off the stage axis). `stage_seconds` (`timing`) times each stage's own
work of a step alone on its device: over a run's step time, each device's
busy fraction (jaxdl.engines.mesh).
"""
from __future__ import annotations

from jaxdl.parallel.pipeline.executor import scheduled_gradients
from jaxdl.parallel.pipeline.schedules import (BACKWARD, FORWARD, IDLE, SCHEDULES,
                                               bubble_fraction, held, schedule)
from jaxdl.parallel.pipeline.stages import Stages, balanced_groups, model_stages
from jaxdl.parallel.pipeline.task import STAGE_AXIS, PipelinedTask, pipeline_task
from jaxdl.parallel.pipeline.timing import stage_seconds

__all__ = ["BACKWARD", "FORWARD", "IDLE", "SCHEDULES", "STAGE_AXIS", "PipelinedTask", "Stages",
           "balanced_groups", "bubble_fraction", "held", "model_stages", "pipeline_task",
           "schedule", "scheduled_gradients", "stage_seconds"]
