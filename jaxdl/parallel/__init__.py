"""Model parallelism inside a worker: a model's stages over a device axis
(`pipeline`), or its layers' weights sharded over one (`tensor`).

`check` is the owner of the model section's parallelism fields."""
from __future__ import annotations

import jax

from jaxdl.config import TASK_PREFIX, ModelConfig, RunConfig
from jaxdl.data import batch_sizes
from jaxdl.errors import ConfigError
from jaxdl.models import MODELS
from jaxdl.parallel.pipeline import SCHEDULES
from jaxdl.parallel.tensor import TENSOR_MODELS

PARALLELISMS = ("data", "pipeline", "tensor")
OWN_FIELDS = {"pipeline": ("stages", "microbatches", "pipeline_schedule"),
              "tensor": ("tensor_parallel",)}
"""Each model parallelism's own fields: the other parallelisms leave them at
their defaults."""


def check(config: RunConfig) -> None:
  """--parallelism pipeline's and tensor's conditions: a zoo model with
  stages and shardings (in float32, without compression), micro-batches that
  divide the batch, workers x stages (or x tensor devices) devices; the
  other's flags left at their defaults. (The engine that runs it: the one
  that declares --parallelism its own field, jaxdl.engines; that k divides
  every sharded dimension: that engine, which builds the model.)"""
  m = config.model
  if m.parallelism not in PARALLELISMS:
    raise ConfigError("parallelism", m.parallelism, "one of " + ", ".join(PARALLELISMS))
  for parallelism, fields in OWN_FIELDS.items():
    for field in fields:
      value = getattr(m, field)
      if m.parallelism != parallelism and value != getattr(ModelConfig, field):
        raise ConfigError(field, value, f"its default ({getattr(ModelConfig, field)}) with "
                          f"--parallelism {m.parallelism} (it is --parallelism "
                          f"{parallelism}'s)")
  if m.parallelism == "data":
    return
  if m.compute_dtype != "float32":
    raise ConfigError("compute_dtype", m.compute_dtype, f"float32 with --parallelism "
                      f"{m.parallelism} (bfloat16 is for --parallelism data)")
  what = "a pipeline" if m.parallelism == "pipeline" else "a tensor sharding"
  if config.algorithm.compress != "none":
    raise ConfigError("compress", config.algorithm.compress, f"none with --parallelism "
                      f"{m.parallelism} ({what} lays the parameters out as padded rows or "
                      "shards; compression is for data parallelism)")
  models = tuple(MODELS.names()) if m.parallelism == "pipeline" else TENSOR_MODELS
  if m.model not in models or config.data.dataset.startswith(TASK_PREFIX):
    why = "a sequence of stages" if m.parallelism == "pipeline" else "layers with a sharding"
    raise ConfigError("model", m.model, "one of " + ", ".join(models)
                      + f" with --parallelism {m.parallelism} ({why})")
  if m.parallelism == "tensor":
    k = m.tensor_parallel
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
      raise ConfigError("tensor_parallel", k, "an integer >= 2 (the devices a worker's "
                        "weights are sharded over)")
    _check_devices(config, "tensor_parallel", k, "tensor devices")
    return
  if m.pipeline_schedule not in SCHEDULES:
    raise ConfigError("pipeline_schedule", m.pipeline_schedule, "one of " + ", ".join(SCHEDULES))
  if isinstance(m.stages, bool) or not isinstance(m.stages, int) or m.stages < 2:
    raise ConfigError("stages", m.stages, "an integer >= 2 (the devices a model is cut over)")
  if isinstance(m.microbatches, bool) or not isinstance(m.microbatches, int) or \
      m.microbatches < 1:
    raise ConfigError("microbatches", m.microbatches, "an integer >= 1")
  sizes = batch_sizes(config)
  if len(set(sizes)) > 1 or sizes[0] % m.microbatches:
    raise ConfigError("microbatches", m.microbatches, f"a divisor of every worker's batch "
                      f"({', '.join(map(str, sorted(set(sizes))))}): equal batches cut into "
                      "equal micro-batches")
  _check_devices(config, "stages", m.stages, "stages")


def _check_devices(config: RunConfig, field: str, row: int, unit: str) -> None:
  """Enough devices for every worker's row of `row` (the value of `field`)."""
  needed, have = config.algorithm.workers * row, len(jax.devices())
  if needed > have:
    most = have // config.algorithm.workers
    allowed = f"at most {most}" if most >= 2 else "2 or more devices a worker"
    raise ConfigError(field, row, f"{allowed}: {config.algorithm.workers} workers x "
                      f"{row} {unit} need {needed} devices, and this process has {have} "
                      "(on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N)")
