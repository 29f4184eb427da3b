"""Batches by index on the device, for the sim engine's ops.

An in-memory training split up to RESIDENT_BYTES lives on the device once
(normalized on the host: the same floats as a per-batch gather), and an op's
batches are rows of it; other data (larger, or a function's or an
iterable's) are gathered on the host into a per-step table.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.data import Streams

RESIDENT_BYTES = 1 << 30  # training splits up to this size live on the device


class DeviceBatches:
  """Batches by index: rows of a device-resident split, or of a step's table."""

  def __init__(self, streams: Streams, capacity: int):
    self.streams, self.b_max = streams, streams.capacity
    self.num_workers = streams.num_workers
    example = streams.example
    self.resident = False
    if streams.in_memory:
      split, n = streams.split, len(streams.split)
      self.resident = n * sum(v[0].nbytes for v in example.values()) <= RESIDENT_BYTES
    if self.resident:  # one gather of everything: the same floats, row by row
      fields = split.gather(np.arange(n))
      # A zero row for padding, as np.pad gives.
      self.pad = n
      self.data = {k: jnp.asarray(np.concatenate([v, np.zeros_like(v[:1])]))
                   for k, v in fields.items()}
    else:
      self.rows = self.num_workers * self.b_max
      self.size = capacity * self.rows + 1
      self.pad = self.size - 1  # a zero row
      self.example = example

  def start(self) -> None:
    if not self.resident:
      self.table = {k: np.zeros((self.size,) + v.shape[1:], v.dtype)
                    for k, v in self.example.items()}
      self.used = 0

  def indices(self, pairs) -> np.ndarray:
    """(K, b_max) rows of the batches `pairs` ((worker, step) or None: padding,
    a zero row), K = len(pairs) <= M."""
    if not self.resident:
      return self._gathered(pairs)
    out = np.full((len(pairs), self.b_max), self.pad, np.int32)
    for v, pair in enumerate(pairs):
      if pair is not None:
        rows = self.streams.indices(*pair)
        out[v, :len(rows)] = rows
    return out

  def _gathered(self, pairs) -> np.ndarray:
    base = self.used * self.rows
    self.used += 1
    out = np.full((len(pairs), self.b_max), self.pad, np.int32)
    for v, pair in enumerate(pairs):
      if pair is not None:
        fields = self.streams.batch(*pair)
        size = len(next(iter(fields.values())))
        rows = base + v * self.b_max + np.arange(size)
        for k, table in self.table.items():
          table[rows] = fields[k]
        out[v, :size] = rows
    return out

  def step_data(self):
    return self.data if self.resident else jax.device_put(self.table)
