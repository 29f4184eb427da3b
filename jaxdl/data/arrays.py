"""Datasets held in memory as arrays: each split's images kept raw (often
uint8) and normalized per channel, with the training split's mean and std,
when a batch is gathered (float32 NHWC images, int32 labels)."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from jaxdl.data.base import Dataset

_STATS_EXAMPLES = 10_000  # normalization stats come from the first ones


def _moments(chunks: Iterable[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and std over NHWC chunks, accumulated in float64."""
  count, total, squares = 0, 0.0, 0.0
  for chunk in chunks:
    x = chunk.astype(np.float64).reshape(-1, chunk.shape[-1])
    count += x.shape[0]
    total = total + x.sum(0)
    squares = squares + np.square(x).sum(0)
  mean = total / count
  std = np.sqrt(np.maximum(squares / count - np.square(mean), 0.0))
  std = np.where(std > 1e-6, std, 1.0)  # a constant channel: only centre it
  return mean.astype(np.float32), std.astype(np.float32)


class ArraySplit:
  """An in-memory split; images stay raw (often uint8) until gathered."""

  def __init__(self, images: np.ndarray, labels: np.ndarray, scale: float,
               mean: np.ndarray, std: np.ndarray):
    self.images, self.labels = images, labels.astype(np.int32)
    # (x * scale - mean) / std as one multiply-add.
    self._mul = (scale / std).astype(np.float32)
    self._add = (-mean / std).astype(np.float32)

  def __len__(self) -> int:
    return len(self.labels)

  def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    indices = np.asarray(indices)
    x = self.images[indices].astype(np.float32)
    x *= self._mul
    x += self._add
    return x, self.labels[indices]


def _array_dataset(name: str, train: tuple[np.ndarray, np.ndarray, float],
                   test: tuple[np.ndarray, np.ndarray, float],
                   num_classes: int) -> Dataset:
  """A Dataset of (images NHWC, labels, scale) pairs held in memory."""
  x, _, scale = train
  head = x[:_STATS_EXAMPLES]
  mean, std = _moments(head[i:i + 1000] * np.float32(scale)
                       for i in range(0, len(head), 1000))
  return Dataset(name=name, train=ArraySplit(*train, mean, std),
                 test=ArraySplit(*test, mean, std),
                 image_shape=tuple(int(d) for d in x.shape[1:]),
                 num_classes=num_classes)
