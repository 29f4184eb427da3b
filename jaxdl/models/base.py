"""What the rest of jaxdl sees of a model: pure init and apply functions."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdl.models.layers import BatchStats

Params = Any      # a pytree of arrays (nested dicts)
ModelState = Any  # a pytree of non-trained arrays, e.g. batch-norm statistics


@dataclasses.dataclass(frozen=True)
class Model:
  """A model as two pure functions.

  - init(key) -> (params, model_state)
  - apply(params, model_state, images_BxHxWxC, train, stats=None)
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


def nnx_functions(build: Callable[[Any], Any]) -> tuple[Callable, Callable]:
  """A Flax NNX module as ``(init, apply)``; ``build(rngs)`` makes the module.

  ``init(key) -> (params, model_state)``: the module's ``nnx.Param``
  variables and the rest of its state, as pure dicts. ``apply(params,
  model_state, *args, **kwargs) -> (output, model_state)`` calls the module
  on a copy rebuilt from them and returns the state it leaves. Splitting and
  merging happen at trace time only, so the jitted computation is the
  module's own.
  """
  abstract = nnx.eval_shape(lambda: build(nnx.Rngs(0)))
  graphdef = nnx.split(abstract, nnx.Param, ...)[0]

  def init(key):
    _, params, rest = nnx.split(build(nnx.Rngs(key)), nnx.Param, ...)
    return nnx.to_pure_dict(params), nnx.to_pure_dict(rest)

  def apply(params, model_state, *args, **kwargs):
    _, params_state, rest = nnx.split(abstract, nnx.Param, ...)
    nnx.replace_by_pure_dict(params_state, params)
    nnx.replace_by_pure_dict(rest, model_state)
    module = nnx.merge(graphdef, params_state, rest, copy=True)
    out = module(*args, **kwargs)
    return out, nnx.to_pure_dict(nnx.split(module, nnx.Param, ...)[2])

  return init, apply


def with_compute_dtype(model: Model, dtype: Any) -> Model:
  """``model`` computing in ``dtype`` (mixed precision): each apply casts the
  floating parameters and the images to it and returns float32 logits.

  The parameters stay float32, so their gradients, the optimizer's state and
  every average of workers' models are float32 too; the model state (batch-norm
  statistics) is not cast, and jaxdl's batch norm sums its statistics in at
  least float32. float32 returns ``model`` itself.
  """
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return model

  def cast(x):
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

  def apply(params, model_state, images, train, stats=None):
    logits, model_state = model.apply(jax.tree.map(cast, params), model_state, cast(images),
                                      train, stats)
    return logits.astype(jnp.float32), model_state

  return dataclasses.replace(model, apply=apply)


def from_nnx(name: str, build: Callable[[Any], Any], num_classes: int,
             image_shape: tuple[int, int, int]) -> Model:
  """Wraps a Flax NNX module factory ``build(rngs) -> module`` as a `Model`.

  The module must be called as ``module(images, train=bool, stats=...)``, with
  ``stats`` a `BatchStats` or None; its state besides ``nnx.Param`` is the
  model state (batch-norm statistics), returned as given in evaluation.
  """
  init, call = nnx_functions(build)

  def apply(params, model_state, images, train, stats: BatchStats | None = None):
    logits, updated = call(params, model_state, images, train=train, stats=stats)
    return logits, updated if train else model_state

  return Model(name=name, init=init, apply=apply, num_classes=num_classes,
               image_shape=tuple(image_shape))
