"""scikit-learn's 8x8 digits, read from the table it ships."""
from __future__ import annotations

import gzip
import importlib.util
import os

import numpy as np

from jaxdl.data.arrays import _array_dataset
from jaxdl.data.base import Dataset


def _digits_table() -> np.ndarray:
  """The 1,797 x 65 table (64 pixels, then the label) that scikit-learn
  ships, read from its file: importing sklearn (scipy among it) takes
  seconds, reading the file milliseconds. Through sklearn's own loader if
  the file is not where it was."""
  spec = importlib.util.find_spec("sklearn")  # finds it without importing it
  for folder in (spec.submodule_search_locations or []) if spec else []:
    path = os.path.join(folder, "datasets", "data", "digits.csv.gz")
    if os.path.isfile(path):
      with gzip.open(path, "rt", encoding="utf-8") as f:
        return np.loadtxt(f, delimiter=",")
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  return np.concatenate([digits.data, digits.target[:, None]], axis=1)


def load_digits() -> Dataset:
  """sklearn's 1,797 8x8 digits; a fixed 1,437/360 split, whatever the seed."""
  table = _digits_table()
  images = table[:, :-1].reshape(-1, 8, 8).astype(np.uint8)[..., None]  # pixel values 0..16
  labels = table[:, -1].astype(np.int32)
  # Seed 0, not the run's seed: every run is scored on the same test set.
  order = np.random.default_rng(0).permutation(len(labels))
  train, test = order[:1437], order[1437:]
  return _array_dataset("digits", (images[train], labels[train], 1 / 16),
                        (images[test], labels[test], 1 / 16), 10)
