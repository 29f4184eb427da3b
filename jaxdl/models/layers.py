"""Layers the models share: a batch norm that skips padding and syncs workers."""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx


# A pytree (mask a leaf, psum static), so it passes through jit and vmap: a
# vmapped mask is split per worker like the images it describes.
@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["mask"], meta_fields=["psum", "momentum"])
@dataclasses.dataclass(frozen=True)
class BatchStats:
  """How batch norm computes batch statistics in training.

  Attributes:
    mask: shape (B,), 1.0 for real examples and 0.0 for padding; padded
      examples do not enter the statistics. None: every example is real.
    psum: sums a pytree over all workers, for statistics synchronized across
      them (``--sync-bn``). None: each worker uses its own batch.
    momentum: replaces the layers' momentum of the running statistics; 0.0
      makes them this batch's statistics (what an Async-BN worker reports,
      ``--async-bn``). None: each layer's own.
  """
  mask: jax.Array | None = None
  psum: Callable[[Any], Any] | None = None
  momentum: float | None = None


class BatchNorm(nnx.Module):
  """Batch norm over all axes but the last, with masked and summed statistics.

  Same variables as ``nnx.BatchNorm`` (``scale``, ``bias``, ``mean``,
  ``var``), and without mask or psum the same numbers as
  ``nnx.BatchNorm(use_fast_variance=False)``. Unlike it, the statistics are
  reduced as sums (of x, of squared deviations, count) through a caller's
  function, since the worker axis may be more than one named axis.
  """

  def __init__(self, num_features: int, *, momentum: float = 0.9,
               epsilon: float = 1e-5, rngs: nnx.Rngs):
    self.mean = nnx.BatchStat(jnp.zeros((num_features,), jnp.float32))
    self.var = nnx.BatchStat(jnp.ones((num_features,), jnp.float32))
    # Two keys drawn, though ones and zeros ignore them, as nnx.BatchNorm
    # does: the layers built after this one keep their initial weights.
    self.scale = nnx.Param(nnx.initializers.ones(rngs.params(), (num_features,)))
    self.bias = nnx.Param(nnx.initializers.zeros(rngs.params(), (num_features,)))
    self.num_features = num_features
    self.momentum = momentum
    self.epsilon = epsilon

  def __call__(self, x: jax.Array, train: bool,
               stats: BatchStats | None = None) -> jax.Array:
    """Normalizes ``x`` (B, ..., C); in training, updates the running stats."""
    scale, bias = self.scale[...], self.bias[...]
    if train:
      mean, var = self._batch_stats(x, stats or BatchStats())
    else:
      mean, var = self.mean[...], self.var[...]
    mul = jax.lax.rsqrt(var + self.epsilon) * scale
    y = (x - mean) * mul + bias
    return y.astype(jnp.result_type(x, scale, bias))

  def _batch_stats(self, x: jax.Array,
                   stats: BatchStats) -> tuple[jax.Array, jax.Array]:
    # At least float32, as flax does: half-precision sums lose the variance.
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    axes = tuple(range(x.ndim - 1))
    per_example = math.prod(x.shape[1:-1])  # H*W, or 1 for (B, C)
    if stats.mask is None:
      m = jnp.ones((x.shape[0],) + (1,) * (x.ndim - 1), x.dtype)
    else:
      m = stats.mask.astype(x.dtype).reshape((-1,) + (1,) * (x.ndim - 1))
      # where, not only m * x: padding may hold inf or NaN, and 0 * inf = NaN.
      x = jnp.where(m != 0, x, 0)
    psum = stats.psum or (lambda tree: tree)
    s1, count = psum((jnp.sum(m * x, axes), jnp.sum(m) * per_example))
    safe = jnp.maximum(count, 1)
    mean = s1 / safe
    # Two passes: the variance as the mean square deviation from the mean.
    # The one-pass E[x^2] - E[x]^2 cancels catastrophically in float32 when
    # |mean| >> std (deep layers on small batches), and then summing the same
    # examples in another order (over workers, or one concatenated batch)
    # changed the variance by up to its own size.
    var = psum(jnp.sum(m * jnp.square(x - mean), axes)) / safe
    # A batch of padding only has no statistics: keep the running ones
    # rather than pull them towards zero.
    keep = count == 0
    momentum = self.momentum if stats.momentum is None else stats.momentum
    new_mean = momentum * self.mean[...] + (1 - momentum) * mean
    new_var = momentum * self.var[...] + (1 - momentum) * var
    self.mean[...] = jax.lax.stop_gradient(jnp.where(keep, self.mean[...], new_mean))
    self.var[...] = jax.lax.stop_gradient(jnp.where(keep, self.var[...], new_var))
    return mean, var
