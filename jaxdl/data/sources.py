"""Dataset loaders: sklearn digits, IDX files, tfds, a user's .npz, synthetic,
each in its own module (digits, idx, tfds, npz, synthetic).

Every split returns float32 NHWC images normalized per channel with the
training split's mean and std, and int32 labels.
"""
from __future__ import annotations

from jaxdl.data.arrays import ArraySplit
from jaxdl.data.digits import load_digits
from jaxdl.data.idx import load_fashion_mnist, load_idx, load_mnist, read_idx
from jaxdl.data.npz import load_npz
from jaxdl.data.synthetic import SyntheticSplit, load_synthetic
from jaxdl.data.tfds import TfdsSplit, load_tfds

__all__ = ["ArraySplit", "SyntheticSplit", "TfdsSplit", "load_digits", "load_fashion_mnist",
           "load_idx", "load_mnist", "load_npz", "load_synthetic", "load_tfds", "read_idx"]
