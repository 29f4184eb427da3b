"""Small models for small images: a multilayer perceptron and a small CNN."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdl.models.layers import BatchNorm, BatchStats


def pool_if_wider(x: jax.Array, window: int = 2) -> jax.Array:
  """Max-pools ``window``x``window``, stride ``window``, unless H or W is 1.

  Skipping the pool at 1x1 lets the same architecture run on tiny inputs such
  as 8x8 digits, where the usual number of halvings would shrink the map to 0.
  """
  if min(x.shape[-3], x.shape[-2]) <= 1:
    return x
  return nnx.max_pool(x, (window, window), strides=(window, window))


def pooled_hw(h: int, w: int, num_pools: int, window: int = 2) -> tuple[int, int]:
  """The (H, W) left after ``num_pools`` calls of `pool_if_wider`."""
  for _ in range(num_pools):
    if min(h, w) > 1:
      h, w = h // window, w // window
  return h, w


def global_avg_pool(x: jax.Array) -> jax.Array:
  """Averages over H and W: BxHxWxC -> BxC."""
  return jnp.mean(x, axis=(-3, -2))


class MLP(nnx.Module):
  """Flatten, then dense layers with ReLU, then a dense layer to the classes."""

  def __init__(self, image_shape: tuple[int, int, int], num_classes: int,
               hidden: Sequence[int] = (256, 128), *, rngs: nnx.Rngs):
    widths = [math.prod(image_shape), *hidden]
    self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs)
                            for a, b in zip(widths[:-1], widths[1:])])
    self.head = nnx.Linear(widths[-1], num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, train: bool = False,
               stats: BatchStats | None = None) -> jax.Array:
    del train, stats  # no batch norm, no dropout
    x = x.reshape(x.shape[0], -1)
    for layer in self.hidden:
      x = nnx.relu(layer(x))
    return self.head(x)

  def pieces(self) -> list[tuple[nnx.Module, Callable]]:
    """The model as a sequence (jaxdl.parallel.pipeline.model_stages): each
    hidden layer (the first flattening the image), the head."""
    dense = lambda m, x: nnx.relu(m(x.reshape(x.shape[0], -1)))
    return [*[(layer, dense) for layer in self.hidden], (self.head, lambda m, x: m(x))]


class CNN(nnx.Module):
  """Two 3x3 conv(+batch norm)+ReLU+2x2 max-pool stages (32, 64 channels),
  dense 128, dense.

  The feature map is flattened rather than averaged: on 8x8 digits it is 2x2,
  and keeping where a stroke lies is worth the few extra weights (~53k total
  on 8x8x1 with 10 classes). Meant for small images; the first dense layer
  grows with the image area.
  """

  def __init__(self, image_shape: tuple[int, int, int], num_classes: int,
               channels: Sequence[int] = (32, 64), dense: int = 128, *,
               batch_norm: bool = False, rngs: nnx.Rngs):
    h, w, c = image_shape
    widths = [c, *channels]
    self.convs = nnx.List([nnx.Conv(a, b, (3, 3), use_bias=not batch_norm, rngs=rngs)
                           for a, b in zip(widths[:-1], widths[1:])])
    self.norms = nnx.List([BatchNorm(b, rngs=rngs) for b in channels] if batch_norm else [])
    hp, wp = pooled_hw(h, w, len(channels))
    self.dense = nnx.Linear(hp * wp * widths[-1], dense, rngs=rngs)
    self.head = nnx.Linear(dense, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, train: bool = False,
               stats: BatchStats | None = None) -> jax.Array:
    for i, conv in enumerate(self.convs):
      x = conv(x)
      if self.norms:
        x = self.norms[i](x, train, stats)
      x = pool_if_wider(nnx.relu(x))
    x = x.reshape(x.shape[0], -1)
    x = nnx.relu(self.dense(x))
    return self.head(x)

  def pieces(self) -> list[tuple[nnx.Module, Callable]]:
    """The model as a sequence (jaxdl.parallel.pipeline.model_stages): each
    convolution (with its batch norm) and its pooling, the dense layer, the
    head; each called as `call(module, x, train, stats)`."""
    def conv(m, x, train=False, stats=None):
      x = m[0](x)
      return pool_if_wider(nnx.relu(m[1](x, train, stats) if self.norms else x))
    dense = lambda m, x, train=False, stats=None: nnx.relu(m(x.reshape(x.shape[0], -1)))
    head = lambda m, x, train=False, stats=None: m(x)
    convs = [nnx.List([c, self.norms[i]] if self.norms else [c])
             for i, c in enumerate(self.convs)]
    return [*[(c, conv) for c in convs], (self.dense, dense), (self.head, head)]
