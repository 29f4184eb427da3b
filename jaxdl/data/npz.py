"""A user's .npz of x_train, y_train, x_test, y_test: images or feature
vectors, each array checked before any is used."""
from __future__ import annotations

import os
import zipfile
from typing import Any

import numpy as np

from jaxdl.data.arrays import _array_dataset
from jaxdl.data.base import Dataset
from jaxdl.errors import ConfigError


_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def load_npz(path: str) -> Dataset:
  """A user's .npz with x_train, y_train, x_test, y_test (ND, NHW or NHWC)."""
  def bad(what: str) -> ConfigError:
    return ConfigError("dataset", f"npz:{path}", what)

  if not os.path.isfile(path):
    raise bad(f"no file at {path}; expected a .npz with keys "
              f"{', '.join(_NPZ_KEYS)}")
  try:
    npz = np.load(path, allow_pickle=False)
    arrays = None  # np.load gives a plain array for a .npy
    if not isinstance(npz, np.ndarray):
      with npz:
        arrays = {key: npz[key] for key in npz.files}
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    raise bad(f"a .npz file written by np.savez without object arrays ({e})")
  if arrays is None:
    raise bad("a .npz file; this is a single .npy array")
  for key in _NPZ_KEYS:
    if key not in arrays:
      raise bad(f"{key} is missing; the file has {sorted(arrays)}, expected "
                f"{', '.join(_NPZ_KEYS)}")
  splits = [_check_npz_split(arrays, part, bad) for part in ("train", "test")]
  (x_train, y_train, _), (x_test, y_test, _) = splits
  if x_test.shape[1:] != x_train.shape[1:]:
    raise bad(f"x_test holds {x_test.shape[1:]} examples but x_train "
              f"{x_train.shape[1:]}; they must match")
  num_classes = max(int(y_train.max()), int(y_test.max())) + 1
  if "num_classes" in arrays:
    k = arrays["num_classes"]
    if k.shape != () or k.dtype.kind not in "iu" or k < 1:
      raise bad(f"num_classes is {k!r}; expected one positive integer")
    num_classes = int(k)
  for key, y in (("y_train", y_train), ("y_test", y_test)):
    if y.min() < 0 or y.max() >= num_classes:
      raise bad(f"{key} has labels in [{y.min()}, {y.max()}]; expected "
                f"integers in [0, {num_classes})")
  return _array_dataset(f"npz:{path}", splits[0], splits[1], num_classes)


def _check_npz_split(arrays: dict[str, np.ndarray], part: str,
                     bad: Any) -> tuple[np.ndarray, np.ndarray, float]:
  """Checks x_{part} and y_{part}; returns (images NHWC, labels, scale)."""
  x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
  if x.ndim not in (2, 3, 4):
    raise bad(f"x_{part} has shape {x.shape}; expected N x D features, "
              "N x H x W or N x H x W x C images")
  if x.dtype != np.uint8 and x.dtype.kind != "f":
    raise bad(f"x_{part} has dtype {x.dtype}; expected uint8 (0..255) or "
              "float images")
  if not len(x):
    raise bad(f"x_{part} is empty; expected at least one image")
  if y.ndim != 1 or y.dtype.kind not in "iu":
    raise bad(f"y_{part} has shape {y.shape} and dtype {y.dtype}; expected "
              "a 1-D array of integer labels")
  if len(y) != len(x):
    raise bad(f"y_{part} has {len(y)} labels but x_{part} has {len(x)} "
              "images")
  non_finite = x.size - np.count_nonzero(np.isfinite(x)) if x.dtype.kind == "f" else 0
  if non_finite:
    raise bad(f"x_{part} holds {non_finite} values that are NaN or infinite; "
              "expected finite numbers")
  if x.ndim == 2:  # features: a 1 x 1 "image" of D channels, each standardized
    images = x[:, None, None, :]
  elif x.ndim == 3:
    images = x[..., None]
  else:
    images = x
  return images, y, (1 / 255 if x.dtype == np.uint8 else 1.0)
