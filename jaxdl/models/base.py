"""What the rest of jaxdl sees of a model: pure init and apply functions."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

import jax

if TYPE_CHECKING:  # layers imports flax, which only NNX models need
  from jaxdl.models.layers import BatchStats

Params = Any      # a pytree of arrays (nested dicts)
ModelState = Any  # a pytree of non-trained arrays, e.g. batch-norm statistics


@dataclasses.dataclass(frozen=True)
class Model:
  """A model as two pure functions.

  init(key) -> (params, model_state)
  apply(params, model_state, images_BxHxWxC, train, stats=None)
      -> (logits_BxK, model_state)

  In training mode apply returns the updated model state (batch-norm running
  statistics); in evaluation mode it returns the state it was given. ``stats``,
  a `BatchStats`, tells batch norm in training which examples are padding and
  how to sum its statistics over workers; None: every example is real and each
  worker uses its own batch. Models without batch norm ignore it. Both pytrees
  are nested dicts of arrays, so they travel through jit, vmap, shard_map,
  optax and orbax unchanged.
  """
  name: str
  init: Callable[[jax.Array], tuple[Params, ModelState]]
  apply: Callable[..., tuple[jax.Array, ModelState]]
  num_classes: int
  image_shape: tuple[int, int, int]


def from_nnx(name: str, build: Callable[[Any], Any], num_classes: int,
             image_shape: tuple[int, int, int]) -> Model:
  """Wraps a Flax NNX module factory ``build(rngs) -> module`` as a `Model`.

  The module must be called as ``module(images, train=bool, stats=...)``, with
  ``stats`` a `BatchStats` or None, and hold only ``nnx.Param`` and
  ``nnx.BatchStat`` variables. Splitting and merging happen at trace time
  only, so the jitted computation is the module's own.
  """
  from flax import nnx  # local: only models built from NNX need it

  abstract = nnx.eval_shape(lambda: build(nnx.Rngs(0)))
  graphdef = nnx.split(abstract, nnx.Param, nnx.BatchStat)[0]

  def init(key):
    module = build(nnx.Rngs(params=key))
    _, params, stats = nnx.split(module, nnx.Param, nnx.BatchStat)
    return nnx.to_pure_dict(params), nnx.to_pure_dict(stats)

  def apply(params, model_state, images, train, stats: BatchStats | None = None):
    _, params_state, stats_state = nnx.split(abstract, nnx.Param, nnx.BatchStat)
    nnx.replace_by_pure_dict(params_state, params)
    nnx.replace_by_pure_dict(stats_state, model_state)
    module = nnx.merge(graphdef, params_state, stats_state, copy=True)
    logits = module(images, train=train, stats=stats)
    if not train:
      return logits, model_state
    return logits, nnx.to_pure_dict(nnx.split(module, nnx.Param, nnx.BatchStat)[2])

  return Model(name=name, init=init, apply=apply, num_classes=num_classes,
               image_shape=tuple(image_shape))
