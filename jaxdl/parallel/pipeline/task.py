"""A zoo model's classification task trained through a pipeline: the model
as its stages' rows, the loss's gradient from a schedule run over the
stage axis (a custom VJP, so an algorithm differentiates the loss as any
other), or, off that axis, from one device running the micro-batches in
turn: the same math."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdl.errors import ConfigError
from jaxdl.models import MODELS, Model, resolve_stem
from jaxdl.models.layers import BatchStats
from jaxdl.parallel.pipeline.executor import scheduled_gradients
from jaxdl.parallel.pipeline.stages import Stages, model_stages
from jaxdl.task import Task, classification, weighted_cross_entropy


STAGE_AXIS = "stages"
"""The mesh axis a pipelined model's stages lie along (jaxdl.engines.mesh)."""


@dataclasses.dataclass(frozen=True)
class PipelinedTask(Task):
  """A task whose loss runs a pipeline schedule, and the stages it runs."""
  stages: Stages | None = None


def _pipelined_model(name: str, num_classes: int, image_shape: Sequence[int], stem: str,
                     count: int):
  """The zoo model `name` as a `jaxdl.models.Model` whose parameters are its
  `count` stages' rows ({"stages": (count, L)}) and whose state, with batch
  norm, its stages' states' rows ({"stages": (count, S)}), applied as the
  stages one after the other (evaluation; training goes through
  `pipeline_task`'s loss), and its stages."""
  stem = resolve_stem(stem, tuple(image_shape))
  build = lambda rngs: MODELS.get(name)(tuple(image_shape), num_classes, stem, rngs=rngs)
  pieces = len(nnx.eval_shape(lambda: build(nnx.Rngs(0))).pieces())
  if count > pieces:
    raise ConfigError("stages", count, f"at most {pieces}: {name} is a sequence of {pieces} "
                      "pieces (layers or blocks), a stage at least one")
  stages = model_stages(build, jax.random.key(0), count, image_shape)[0]  # the structure

  def init(key):
    _, params, states = model_stages(build, key, count, image_shape)
    return {"stages": stages.rows(params)}, ({"stages": stages.state_rows(states)}
                                             if stages.stateful else {})

  def apply(params, model_state, images, train, stats=None):
    states = stages.states(model_state["stages"]) if stages.stateful else None
    y, states = stages.forward(stages.params(params["stages"]), states, images, train, stats)
    if train and stages.stateful:
      model_state = {"stages": stages.state_rows(states)}
    return y, model_state

  return Model(name=f"{name}/pipeline{count}", init=init, apply=apply,
               num_classes=num_classes, image_shape=tuple(image_shape)), stages


def _own_row(rows: jax.Array) -> jax.Array:
  """This device's stage's row: its block of the rows laid along the stage
  axis, or, given every stage's row (bsp's pull), its own, every row's
  gradient then summed over the stages (whole on every device)."""
  if rows.shape[0] == 1:
    return rows[0]
  return _gradient_summed_over_stages(rows)[jax.lax.axis_index(STAGE_AXIS)]


def pipeline_task(name: str, dataset, stem: str, count: int, microbatches: int,
                  kind: str):
  """Image classification (jaxdl.task.classification) of the zoo model
  `name` cut into `count` stages, each batch into `microbatches`, trained by
  the schedule `kind` ("gpipe" or "1f1b"): its loss and gradient come from
  `scheduled_gradients` (the loss's gradient is a custom VJP: the
  algorithm's own step takes it as any other). With batch norm, each
  micro-batch is normalized by its own statistics (as GPipe does), the
  running statistics moving once a micro-batch; on one device (the stage
  axis unbound) the micro-batches run in turn, the same math."""
  model, stages = _pipelined_model(name, dataset.num_classes, dataset.image_shape, stem, count)
  task = classification(model, dataset)
  micro_loss = lambda logits, aux: weighted_cross_entropy(logits, *aux)

  def loss(params, model_state, batch, key, stats=None):
    if not stages.stateful and not _bound(STAGE_AXIS):  # one device runs every stage
      return task.loss(params, model_state, batch, key, stats)
    cut = lambda a: a.reshape(microbatches, a.shape[0] // microbatches, *a.shape[1:])
    micro, aux = cut(batch["image"]), (cut(batch["label"]), cut(batch["weight"]))
    masks = cut(stats.mask if stats is not None and stats.mask is not None
                else jnp.ones(batch["weight"].shape, jnp.float32))
    momentum = stats.momentum if stats is not None else None
    stats_of = lambda masks: lambda i: BatchStats(mask=masks[i], momentum=momentum)
    if not _bound(STAGE_AXIS):  # with state: the micro-batches in turn
      states, total = stages.states(model_state["stages"]), 0.0
      for i in range(microbatches):
        logits, states = stages.forward(stages.params(params["stages"]), states, micro[i],
                                        True, stats_of(masks)(i))
        total = total + micro_loss(logits, jax.tree.map(lambda a: a[i], aux))
      return total, ({"stages": stages.state_rows(states)}, {})

    def forward(row, state_row, micro, aux, masks):
      total, grad, after = scheduled_gradients(
          stages, row, micro, aux, micro_loss, STAGE_AXIS, kind,
          state_row if stages.stateful else None, stats_of(masks))
      return (total, after), (grad, state_row, micro, aux, masks)

    value = jax.custom_vjp(lambda *args: forward(*args)[0])

    def backward(saved, cotangents):
      grad, *rest = saved
      zero = lambda a: (np.zeros(a.shape, jax.dtypes.float0)
                        if not jnp.issubdtype(a.dtype, jnp.inexact) else jnp.zeros_like(a))
      return (cotangents[0] * grad, *jax.tree.map(zero, rest))

    value.defvjp(forward, backward)
    state_rows = model_state["stages"] if stages.stateful else jnp.zeros((1, 0), stages.dtype)
    total, after = value(_own_row(params["stages"]), _own_state(state_rows), micro, aux, masks)
    return total, ({"stages": after[None]} if stages.stateful else model_state, {})

  fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
  return PipelinedTask(**{**fields, "loss": loss}, stages=stages)


def _own_state(rows: jax.Array) -> jax.Array:
  """This device's stage's state row: its block of the rows laid along the
  stage axis, or its own of every stage's row."""
  return rows[0] if rows.shape[0] == 1 else rows[jax.lax.axis_index(STAGE_AXIS)]


@jax.custom_vjp
def _gradient_summed_over_stages(x):
  """x; its cotangent summed over STAGE_AXIS."""
  return x


_gradient_summed_over_stages.defvjp(
    lambda x: (x, None), lambda _, g: (jax.lax.psum(g, STAGE_AXIS),))


def _bound(axis: str) -> bool:
  """Whether `axis` is a mesh axis of the computation being traced."""
  try:
    jax.lax.axis_index(axis)
  except NameError:
    return False
  return True
