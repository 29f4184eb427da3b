"""The worker axis that collective algorithms reduce over.

M workers are laid out as D devices (a shard_map mesh axis) times L workers
per device (a vmap axis), worker index = d * L + l. JAX cannot reduce over a
mesh axis and a vmap axis in one collective, so each collective here runs as
two single-axis collectives, the local one first. The sim engine uses the
same class with no device axis (all workers vmapped on one device); one
worker has no axes at all and every collective is the identity.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax


@dataclasses.dataclass(frozen=True)
class WorkerAxis:
  size: int                     # M, the number of workers
  device: str | None = None     # mesh axis name over devices, if any
  local: str | None = None      # vmap axis name over a device's workers, if any
  local_size: int = 1           # L

  def _axes(self):
    return [a for a in (self.local, self.device) if a is not None]

  def psum(self, tree):
    """Sum over all workers (every worker gets the sum)."""
    for axis in self._axes():
      tree = lax.psum(tree, axis)
    return tree

  def all_gather(self, x: jax.Array) -> jax.Array:
    """Every worker's `x`, stacked in worker order: ``(M, *x.shape)``."""
    if self.local:
      x = lax.all_gather(x, self.local)                 # (L, ...)
    else:
      x = x[None]
    if self.device:
      x = lax.all_gather(x, self.device, tiled=True)    # (D * L, ...)
    return x

  def psum_scatter(self, x: jax.Array, dimension: int = 0) -> jax.Array:
    """Sums x (its `dimension` divisible by M) over workers; worker i keeps
    block i along it."""
    if self.device:
      x = lax.psum_scatter(x, self.device, scatter_dimension=dimension, tiled=True)
    if self.local:
      x = lax.psum_scatter(x, self.local, scatter_dimension=dimension, tiled=True)
    return x
