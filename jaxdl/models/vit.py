"""A small vision transformer (Dosovitskiy et al. 2021), for the images of
the zoo's datasets: uniform blocks, which pipeline and tensor parallelism
split naturally."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxdl.models.transformer import Block


def patch_size(height: int, width: int) -> int:
  """Pixels per side of a patch: 4 below 128-pixel images (CIFAR's 32 x 32:
  64 tokens; digits' 8 x 8: 4, which learn them better than 16 tokens of 2
  x 2 pixels: 0.97 against 0.82 test accuracy after 10 epochs), 16 from 128
  on (ImageNet's 224 x 224: 196 tokens, as the paper's ViT-B/16)."""
  return 4 if min(height, width) < 128 else 16


class PatchEmbedding(nnx.Module):
  """Patches of `patch` x `patch` pixels embedded linearly to width `dim`,
  plus a learned embedding of each patch's position: images -> tokens."""

  def __init__(self, image_shape: tuple[int, int, int], patch: int, dim: int, *,
               rngs: nnx.Rngs):
    height, width, channels = image_shape
    tokens = (height // patch) * (width // patch)
    self.conv = nnx.Conv(channels, dim, kernel_size=(patch, patch), strides=(patch, patch),
                         padding="VALID", rngs=rngs)
    self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (tokens, dim)))

  def __call__(self, images: jax.Array) -> jax.Array:
    x = self.conv(images)  # (B, H / p, W / p, dim)
    return x.reshape(x.shape[0], -1, x.shape[-1]) + self.position[...]


class ViT(nnx.Module):
  """Patches of `patch` x `patch` pixels (default `patch_size`; an image's
  last rows and columns that fill no patch are left out) embedded linearly
  to width `dim`, learned position embeddings, `depth` pre-norm blocks
  (self-attention over all tokens with `heads` heads, a 4x MLP, each
  residual), a final layer norm, the mean of the tokens and a linear head.
  No batch norm and no dropout: training and evaluation compute the same."""

  def __init__(self, image_shape: tuple[int, int, int], num_classes: int, *,
               patch: int | None = None, dim: int = 64, depth: int = 4, heads: int = 4,
               rngs: nnx.Rngs):
    self.embed = PatchEmbedding(image_shape, patch or patch_size(*image_shape[:2]), dim,
                                rngs=rngs)
    self.blocks = nnx.List([Block(dim, heads, rngs=rngs) for _ in range(depth)])
    self.norm = nnx.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, num_classes, rngs=rngs)

  def __call__(self, images: jax.Array, train: bool = False, stats=None) -> jax.Array:
    del train, stats  # nothing differs in training; no batch norm
    x = self.embed(images)
    for block in self.blocks:
      x = block(x)
    return self.head(jnp.mean(self.norm(x), axis=1))

  def pieces(self) -> list[tuple[nnx.Module, Callable]]:
    """The model as a sequence (jaxdl.parallel.pipeline.model_stages): the
    patch embedding, each block, the pooled head."""
    return [(self.embed, lambda m, x: m(x)),
            *[(block, lambda m, x: m(x)) for block in self.blocks],
            (nnx.List([self.norm, self.head]),
             lambda m, x: m[1](jnp.mean(m[0](x), axis=1)))]
