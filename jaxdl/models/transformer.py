"""A character-level transformer language model (decoder only, pre-norm)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class Block(nnx.Module):
  """Self-attention (causal with a causal `mask`; None: over all tokens) and
  a 4x MLP, each after a layer norm, each residual."""

  def __init__(self, dim: int, heads: int, *, rngs: nnx.Rngs):
    self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attention = nnx.MultiHeadAttention(num_heads=heads, in_features=dim, decode=False,
                                            rngs=rngs)
    self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
    self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
    self.down = nnx.Linear(4 * dim, dim, rngs=rngs)

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    x = x + self.attention(self.norm1(x), mask=mask)
    return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class CharTransformer(nnx.Module):
  """Token and learned position embeddings, `layers` blocks, a final layer
  norm and a linear head: tokens (B, T) -> logits (B, T, vocab)."""

  def __init__(self, vocab_size: int, context: int, dim: int = 64, heads: int = 4,
               layers: int = 2, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab_size, dim, rngs=rngs)
    self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (context, dim)))
    self.blocks = nnx.List([Block(dim, heads, rngs=rngs) for _ in range(layers)])
    self.norm = nnx.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, vocab_size, rngs=rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    length = tokens.shape[-1]
    x = self.embed(tokens) + self.position[:length]
    mask = nnx.make_causal_mask(jnp.ones(tokens.shape[-1:], jnp.int32))
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.norm(x))
