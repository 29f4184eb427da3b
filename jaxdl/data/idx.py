"""MNIST-style IDX files (MNIST, Fashion-MNIST): grayscale images, 10
classes, raw or gzipped, each file's header checked against its size."""
from __future__ import annotations

import gzip
import os

import numpy as np

from jaxdl.data.arrays import _array_dataset
from jaxdl.data.base import Dataset
from jaxdl.errors import ConfigError


_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_IDX_UBYTE = 0x08  # the IDX type code of unsigned bytes


def read_idx(path: str, ndim: int) -> np.ndarray:
  """Reads an IDX file of unsigned bytes with `ndim` dims, raw or gzipped."""
  with open(path, "rb") as f:
    data = f.read()
  if data[:2] == b"\x1f\x8b":
    try:
      data = gzip.decompress(data)
    except (OSError, EOFError) as e:
      raise ConfigError("data_dir", path, f"a readable gzip file ({e})")
  magic = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
  want = _IDX_UBYTE << 8 | ndim
  if magic != want:
    got = "too short" if magic is None else f"magic 0x{magic:08x}"
    raise ConfigError("data_dir", path, f"an IDX file of {ndim}-D unsigned "
                      f"bytes (magic 0x{want:08x}); this one is {got}")
  header = 4 + 4 * ndim
  dims = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
               for i in range(ndim))
  if len(data) != header + int(np.prod(dims)):
    raise ConfigError("data_dir", path, f"an IDX file whose header {dims} "
                      f"matches its size; it holds {len(data) - header} "
                      "bytes of data")
  return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def _find_idx(directory: str, base: str, name: str, hint: str) -> str:
  path = os.path.join(directory, base)
  for candidate in (path, path + ".gz"):
    if os.path.isfile(candidate):
      return candidate
  raise ConfigError("data_dir", directory, f"{name} needs "
                    f"{', '.join(_IDX_FILES)} (raw or .gz) there; neither "
                    f"{path} nor {path}.gz exists. {hint}")


def load_idx(name: str, directory: str, hint: str = "") -> Dataset:
  """Reads MNIST-style IDX files: grayscale images, 10 classes."""
  paths = [_find_idx(directory, base, name, hint) for base in _IDX_FILES]
  arrays = [read_idx(path, 3 if "images" in base else 1)
            for base, path in zip(_IDX_FILES, paths)]
  splits = []
  for i in (0, 2):
    (images, labels), path = arrays[i:i + 2], paths[i]
    if len(images) != len(labels) or not len(labels):
      raise ConfigError("data_dir", directory, f"{name}: as many images as "
                        f"labels, at least one; {path} holds {len(images)} "
                        f"images, {paths[i + 1]} {len(labels)} labels")
    if labels.max() >= 10:
      raise ConfigError("data_dir", directory, f"{name}: labels 0..9; "
                        f"{paths[i + 1]} has label {labels.max()}")
    splits.append((images[..., None], labels, 1 / 255))
  return _array_dataset(name, splits[0], splits[1], 10)


def load_mnist(data_dir: str | None = None) -> Dataset:
  """MNIST from its four IDX files (default dir ~/.cache/jaxdl/mnist)."""
  directory = data_dir or os.path.expanduser("~/.cache/jaxdl/mnist")
  return load_idx("mnist", directory, "Put the four MNIST files there, or "
                  "pass --data-dir DIR.")


_DEBIAN_FASHION = "/usr/share/datasets/fashion-mnist"


def load_fashion_mnist(data_dir: str | None = None) -> Dataset:
  """Fashion-MNIST from IDX files (default: Debian's dataset-fashion-mnist)."""
  directory = data_dir
  if directory is None:
    directory = (_DEBIAN_FASHION if os.path.isdir(_DEBIAN_FASHION) else
                 os.path.expanduser("~/.cache/jaxdl/fashion_mnist"))
  return load_idx("fashion_mnist", directory, "Put the four Fashion-MNIST "
                  "files there, or run `apt-get install dataset-fashion-mnist`"
                  f" (Debian/Ubuntu), which installs them in {_DEBIAN_FASHION}.")
