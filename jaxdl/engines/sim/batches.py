"""Batches by index on the device, for the sim engine's ops.

An in-memory training split up to RESIDENT_BYTES lives on the device once
(normalized on the host: the same floats as a per-batch gather), and an op's
batches are rows of it; a larger one is gathered on the host into a per-step
table.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.data import WorkerStreams
from jaxdl.data.sources import ArraySplit

RESIDENT_BYTES = 1 << 30  # training splits up to this size live on the device


class DeviceBatches:
  """Batches by index: rows of a device-resident split, or of a step's table."""

  def __init__(self, streams: WorkerStreams, capacity: int):
    self.streams, self.b_max = streams, max(streams.batch_sizes)
    self.num_workers = streams.num_workers
    split, n = streams.split, len(streams.split)
    example = split.gather(np.arange(1))[0]
    self.resident = isinstance(split, ArraySplit) and n * example.nbytes <= RESIDENT_BYTES
    if self.resident:  # one gather of everything: the same floats, row by row
      images, labels = split.gather(np.arange(n))
      # A zero row for padding, as np.pad gives.
      self.pad = n
      self.data = (jnp.asarray(np.concatenate([images, np.zeros_like(images[:1])])),
                   jnp.asarray(np.concatenate([labels, np.zeros_like(labels[:1])])))
    else:
      self.rows = self.num_workers * self.b_max
      self.shape = (capacity * self.rows + 1, *example.shape[1:])

  def start(self) -> None:
    if not self.resident:
      self.table = (np.zeros(self.shape, np.float32), np.zeros(self.shape[0], np.int32))
      self.used = 0

  def indices(self, pairs) -> np.ndarray:
    """(M, b_max) rows of the workers' batches (padding: a zero row)."""
    if not self.resident:
      return self._gathered(pairs)
    out = np.full((self.num_workers, self.b_max), self.pad, np.int32)
    for v, pair in enumerate(pairs):
      if pair is not None:
        rows = self.streams.indices(*pair)
        out[v, :len(rows)] = rows
    return out

  def _gathered(self, pairs) -> np.ndarray:
    base = self.used * self.rows
    self.used += 1
    out = np.full((self.num_workers, self.b_max), self.shape[0] - 1, np.int32)
    for v, pair in enumerate(pairs):
      if pair is not None:
        x, y = self.streams.batch(*pair)
        rows = base + v * self.b_max + np.arange(len(y))
        self.table[0][rows], self.table[1][rows] = x, y
        out[v, :len(y)] = rows
    return out

  def step_data(self):
    return self.data if self.resident else jax.device_put(self.table)
