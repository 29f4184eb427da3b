"""Dataset loaders: sklearn digits, IDX files, tfds, a user's .npz, synthetic.

Every split returns float32 NHWC images normalized per channel with the
training split's mean and std, and int32 labels.
"""
from __future__ import annotations

import gzip
import importlib.util
import os
import zipfile
from typing import Any, Iterable

import numpy as np

from jaxdl.data.base import Dataset
from jaxdl.errors import ConfigError

_STATS_EXAMPLES = 10_000  # normalization stats come from the first ones
_TFDS_STATS_EXAMPLES = 1_000  # tfds decodes one by one: keep the sample small


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



def _fit(image: np.ndarray, size: int | None) -> np.ndarray:
  """Resizes the shorter side to `size`, then crops the centre square."""
  h, w = image.shape[:2]
  if size is None or (h, w) == (size, size):
    return image
  from PIL import Image  # pylint: disable=g-import-not-at-top
  scale = size / min(h, w)
  nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
  gray = image.shape[-1] == 1  # Pillow wants grayscale as H x W
  pil = Image.fromarray(image[..., 0] if gray else image)
  out = np.asarray(pil.resize((nw, nh), Image.Resampling.BILINEAR))
  top, left = (nh - size) // 2, (nw - size) // 2
  out = out[top:top + size, left:left + size]
  return out[..., None] if gray else out


class TfdsSplit:
  """Lazy random access to a tfds split, decoding one example at a time."""

  def __init__(self, source: Any, image_size: int | None,
               mean: np.ndarray, std: np.ndarray):
    self.source, self.image_size = source, image_size
    self._mul = (1 / 255 / std).astype(np.float32)
    self._add = (-mean / std).astype(np.float32)

  def __len__(self) -> int:
    return len(self.source)

  def raw(self, index: int) -> tuple[np.ndarray, int]:
    """The uint8 image (resized and cropped) and label of one example."""
    # One at a time: batched __getitems__ fails under tfds' mock data.
    example = self.source[int(index)]
    return _fit(np.asarray(example["image"]), self.image_size), int(
        example["label"])

  def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pairs = [self.raw(i) for i in np.asarray(indices).reshape(-1)]
    images = np.stack([x for x, _ in pairs]).astype(np.float32)
    images *= self._mul
    images += self._add
    return images, np.array([y for _, y in pairs], np.int32)


def _tfds_source(tfds: Any, name: str, split: str, data_dir: str | None):
  """tfds.data_source, with failures turned into ConfigErrors."""
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir,
                            download=False)
  except tfds.core.DatasetNotFoundError:
    raise ConfigError("dataset", f"tfds:{name}", "a tfds dataset name such "
                      "as tfds:cifar10") from None
  except Exception as e:  # pylint: disable=broad-except
    # tfds reports a missing dataset as an unsupported TFRECORD format.
    error = _unreadable(tfds, name, split, data_dir)
    if error is None:
      raise
    raise error from e


def _unreadable(tfds: Any, name: str, split: str,
                data_dir: str | None) -> ConfigError | None:
  """Why tfds cannot read `name` from `data_dir`, or None if unclear."""
  root = data_dir or tfds.core.constants.DATA_DIR
  build = (f"pip install 'jaxdl-train[tfds]' && tfds build {name} --data_dir "
           f"{root} --file_format array_record")
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    return ConfigError("data_dir", root, f"tfds:{name} is not prepared there;"
                       f" prepare it on a machine with network: {build}")
  fmt = builder.info.file_format
  if fmt is not None and fmt.value not in ("array_record", "parquet"):
    # Without TensorFlow only random-access formats can be read.
    return ConfigError("data_dir", root, f"tfds:{name} is prepared there as "
                       f"{fmt.value}, which needs TensorFlow; rebuild it as "
                       f"array_record: {build}")
  if split not in builder.info.splits:
    return ConfigError("dataset", f"tfds:{name}", f"a dataset with a {split!r}"
                       f" split; it has {', '.join(builder.info.splits)}")
  return None


def load_tfds(name: str, data_dir: str | None = None,
              image_size: int | None = None) -> Dataset:
  """Any tfds image-classification dataset prepared as array_record."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  if image_size is not None and (not isinstance(image_size, int)
                                 or image_size < 1):
    raise ConfigError("image_size", image_size, "a positive integer")
  train = _tfds_source(tfds, name, "train", data_dir)
  if not len(train):
    raise ConfigError("dataset", f"tfds:{name}", "a dataset with training "
                      "examples; its train split is empty")
  info = train.dataset_info
  features = info.features
  if ("image" not in features or "label" not in features
      or not hasattr(features["label"], "num_classes")):
    raise ConfigError("dataset", f"tfds:{name}", "a tfds image "
                      "classification dataset (features 'image' and 'label')")
  splits = list(info.splits)  # empty under tfds.testing.mock_data
  test_name = "test"
  if splits and "test" not in splits:
    test_name = "validation"  # e.g. imagenet2012 has no labelled test split
  test = _tfds_source(tfds, name, test_name, data_dir)
  if image_size is None and None in features["image"].shape[:2]:
    raise ConfigError("image_size", None, f"an integer such as 224: "
                      f"tfds:{name} has images of varying size")
  # Evenly spaced training examples: deterministic and spread over the set.
  count = min(len(train), _TFDS_STATS_EXAMPLES)
  sample = np.unique(np.linspace(0, len(train) - 1, count).astype(np.int64))
  raw = TfdsSplit(train, image_size, np.zeros(1), np.ones(1)).raw
  shape = raw(0)[0].shape
  mean, std = _moments(
      np.stack([raw(i)[0] for i in sample[lo:lo + 100]]) / np.float32(255)
      for lo in range(0, len(sample), 100))
  return Dataset(name=f"tfds:{name}",
                 train=TfdsSplit(train, image_size, mean, std),
                 test=TfdsSplit(test, image_size, mean, std),
                 image_shape=tuple(int(d) for d in shape),
                 num_classes=int(features["label"].num_classes))
