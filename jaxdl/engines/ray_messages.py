"""The ray engine's messages as they travel between its actors.

Every message travels as one buffer of its leaves' bytes (`packed`; a
compressed message's leaves are its payload's), which the receiver, knowing
the leaves' shapes, reads back (`unpacked`, `unpacked_tree`); a run's
`bytes_total` counts each message as Ray serializes it (`wire_bytes`).
"""
from __future__ import annotations

import math
import pickle
from typing import Sequence

import jax
import numpy as np


def wire_bytes(message) -> int:
  """The bytes of `message` serialized as Ray sends it: pickle protocol 5,
  its arrays' buffers out of band (the header plus the buffers)."""
  buffers = []
  header = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
  return len(header) + sum(b.raw().nbytes for b in buffers)


def packed(leaves: Sequence) -> np.ndarray:
  """A message's leaves (a payload's values and indices, ...) as one buffer
  of their bytes, in order: one array to serialize, whose header is paid
  once, not once a leaf (dozens of bytes each, as much as a small leaf's
  top-k payload). The receiver knows the leaves' shapes."""
  flat = [np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in jax.device_get(leaves)]
  return np.concatenate(flat) if flat else np.zeros(0, np.uint8)


def unpacked_tree(buffer: np.ndarray, like):
  """The tree shaped like `like` whose leaves `packed` put in `buffer`."""
  return jax.tree.unflatten(jax.tree.structure(like), unpacked(buffer, jax.tree.leaves(like)))


def unpacked(buffer: np.ndarray, like: Sequence) -> list:
  """The leaves that `packed` put in `buffer`, with the shapes and dtypes of
  `like`'s (arrays or jax.ShapeDtypeStruct)."""
  leaves, offset = [], 0
  for x in like:
    shape, dtype = tuple(x.shape), np.dtype(x.dtype)
    size = math.prod(shape)
    leaves.append(np.frombuffer(buffer, dtype, size, offset).reshape(shape))
    offset += size * dtype.itemsize
  return leaves
