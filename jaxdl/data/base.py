"""What the rest of jaxdl sees of a dataset: random-access train and test splits."""
from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np


class Split(Protocol):
  """Random access to one split of an image-classification dataset."""

  def __len__(self) -> int: ...

  def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Returns (images_NxHxWxC float32, normalized; labels_N int32)."""
    ...


@dataclasses.dataclass(frozen=True)
class Dataset:
  name: str
  train: Split
  test: Split
  image_shape: tuple[int, int, int]  # (H, W, C)
  num_classes: int
