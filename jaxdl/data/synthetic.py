"""Random images for throughput work: each example a function of its index,
nothing stored per example and nothing to learn."""
from __future__ import annotations

import numpy as np

from jaxdl.data.base import Dataset
from jaxdl.errors import ConfigError


class SyntheticSplit:
  """Random N(0, 1) images and labels, each a function of its own index.

  Example i is a window into one fixed noise vector at an offset drawn from
  default_rng([seed, stream, i]): copying a window is ~30x cheaper than
  drawing fresh normals, which matters at 224x224x3 for throughput work, and
  nothing per-example is stored.
  """

  def __init__(self, size: int, image_shape: tuple[int, int, int],
               num_classes: int, stream: int, seed: int = 0):
    self._size, self._shape = size, image_shape
    self._num_classes, self._key = num_classes, (seed, stream)
    self._dim = int(np.prod(image_shape))
    self._noise = np.random.default_rng(self._key).standard_normal(
        2 * self._dim, dtype=np.float32)

  def __len__(self) -> int:
    return self._size

  def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    indices = np.asarray(indices).reshape(-1)
    images = np.empty((len(indices), self._dim), np.float32)
    labels = np.empty(len(indices), np.int32)
    for j, i in enumerate(indices):
      if not 0 <= i < self._size:
        raise IndexError(f"index {i} out of range for {self._size} examples")
      rng = np.random.default_rng([*self._key, int(i)])
      labels[j] = rng.integers(self._num_classes)
      offset = rng.integers(self._dim)
      images[j] = self._noise[offset:offset + self._dim]
    return images.reshape(-1, *self._shape), labels


def load_synthetic(image_shape: tuple[int, ...] = (32, 32, 3),
                   num_classes: int = 10, train_size: int = 50_000,
                   test_size: int = 10_000) -> Dataset:
  """Random images for throughput work; nothing to learn."""
  shape = tuple(image_shape)
  if len(shape) != 3 or not all(isinstance(d, int) and d > 0 for d in shape):
    raise ConfigError("image_size", image_shape, "a positive size")
  if not isinstance(num_classes, int) or num_classes < 1:
    raise ValueError(f"num_classes {num_classes!r}: a positive integer")
  return Dataset(name="synthetic",
                 train=SyntheticSplit(train_size, shape, num_classes, 0),
                 test=SyntheticSplit(test_size, shape, num_classes, 1),
                 image_shape=shape, num_classes=num_classes)
