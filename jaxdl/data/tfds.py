"""Any tfds image-classification dataset prepared as array_record, read
without TensorFlow one example at a time (resized and centre-cropped to
--image-size where asked), normalized with a sample of its training split."""
from __future__ import annotations

from typing import Any

import numpy as np

from jaxdl.data.arrays import _moments
from jaxdl.data.base import Dataset
from jaxdl.errors import ConfigError

_TFDS_STATS_EXAMPLES = 1_000  # tfds decodes one by one: keep the sample small


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
