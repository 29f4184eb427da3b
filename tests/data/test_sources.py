"""The dataset loaders of jaxdl.data.sources: digits, IDX, tfds, npz, synthetic."""
from __future__ import annotations

import gzip
import io
import json
import os
import shutil

import numpy as np
import pytest

from jaxdl.data import load_dataset
from jaxdl.data.sources import load_synthetic
from jaxdl.errors import ConfigError


def _all(split):
  return split.gather(np.arange(len(split)))


def _assert_normalized(split):
  x, _ = _all(split)
  np.testing.assert_allclose(x.mean((0, 1, 2)), 0, atol=1e-4)
  np.testing.assert_allclose(x.std((0, 1, 2)), 1, atol=1e-3)


def test_digits_shapes_and_normalization():
  ds = load_dataset("digits")
  assert (len(ds.train), len(ds.test)) == (1437, 360)
  assert ds.image_shape == (8, 8, 1) and ds.num_classes == 10
  x, y = ds.test.gather(np.arange(5))
  assert x.shape == (5, 8, 8, 1) and x.dtype == np.float32
  assert y.dtype == np.int32 and set(_all(ds.train)[1]) == set(range(10))
  _assert_normalized(ds.train)


def test_digits_split_ignores_global_seeds():
  loaded = []
  for seed in (1, 2):
    np.random.seed(seed)
    ds = load_dataset("digits")
    loaded.append(_all(ds.train) + _all(ds.test))
  for a, b in zip(*loaded, strict=True):
    np.testing.assert_array_equal(a, b)


def _write_idx(path, array, gz):
  header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  data = header + array.astype(np.uint8).tobytes()
  with open(path, "wb") as f:
    f.write(gzip.compress(data) if gz else data)


def _write_mnist(directory, n_train=30, n_test=10, gz=True):
  rng = np.random.default_rng(0)
  arrays = {}
  for prefix, n in (("train", n_train), ("t10k", n_test)):
    images = rng.integers(0, 256, (n, 6, 5), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    # Mix gzipped and raw files: both must be read.
    _write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte"
                            + (".gz" if gz else "")), images, gz)
    _write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte"),
               labels, False)
    arrays[prefix] = (images, labels)
  return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_idx_reader(tmp_path, gz):
  arrays = _write_mnist(str(tmp_path), gz=gz)
  ds = load_dataset("mnist", data_dir=str(tmp_path))
  assert (len(ds.train), len(ds.test), ds.image_shape) == (30, 10, (6, 5, 1))
  x, y = _all(ds.test)
  np.testing.assert_array_equal(y, arrays["t10k"][1])
  # Undo the normalization: the raw pixels come back.
  train_raw = arrays["train"][0].astype(np.float64) / 255
  restored = x[..., 0] * train_raw.std() + train_raw.mean()
  np.testing.assert_allclose(restored * 255, arrays["t10k"][0], atol=1e-3)
  _assert_normalized(ds.train)


@pytest.mark.parametrize("damage", ["magic", "truncated", "label"])
def test_idx_reader_rejects_bad_files(tmp_path, damage):
  _write_mnist(str(tmp_path), gz=False)
  path = tmp_path / "train-images-idx3-ubyte"
  data = bytearray(path.read_bytes())
  if damage == "magic":
    data[2] = 0x0D  # float32 type code
  elif damage == "truncated":
    data = data[:-7]
  else:
    path = tmp_path / "train-labels-idx1-ubyte"
    data = bytearray(path.read_bytes())
    data[-1] = 10
  path.write_bytes(bytes(data))
  with pytest.raises(ConfigError, match="data-dir"):
    load_dataset("fashion_mnist", data_dir=str(tmp_path))


def test_idx_missing_files_say_what_is_expected(tmp_path):
  with pytest.raises(ConfigError) as info:
    load_dataset("fashion_mnist", data_dir=str(tmp_path))
  message = str(info.value)
  assert str(tmp_path / "train-images-idx3-ubyte") in message
  assert "t10k-labels-idx1-ubyte" in message
  assert "apt-get install dataset-fashion-mnist" in message
  with pytest.raises(ConfigError, match="train-images-idx3-ubyte"):
    load_dataset("mnist", data_dir=str(tmp_path))


@pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_debian_fashion_mnist():
  ds = load_dataset("fashion_mnist")
  assert (len(ds.train), len(ds.test)) == (60000, 10000)
  assert ds.image_shape == (28, 28, 1) and ds.num_classes == 10
  x, _ = ds.train.gather(np.arange(10000))
  assert abs(x.mean()) < 1e-3 and abs(x.std() - 1) < 1e-3
  assert np.bincount(_all(ds.test)[1]).tolist() == [1000] * 10


@pytest.mark.parametrize("name,shape", [("tfds:cifar10", (32, 32, 3)),
                                        ("tfds:mnist", (28, 28, 1))])
def test_tfds_mock(tmp_path, name, shape):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=16):
    ds = load_dataset(name, data_dir=str(tmp_path))
    x, y = ds.train.gather(np.array([3, 0, 15]))
    xt, yt = ds.test.gather(np.arange(4))
  assert ds.image_shape == shape and ds.num_classes == 10
  assert x.shape == (3, *shape) and xt.shape == (4, *shape)
  assert x.dtype == np.float32 and y.dtype == np.int32
  assert 0 <= min(y.min(), yt.min()) and max(y.max(), yt.max()) < 10
  with tfds.testing.mock_data(num_examples=16):
    _assert_normalized(ds.train)


def test_tfds_variable_sizes_need_image_size(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=6):
    ds = load_dataset("tfds:imagenet2012", str(tmp_path), image_size=20)
    x, y = ds.train.gather(np.arange(6))
    assert x.shape == (6, 20, 20, 3) and ds.num_classes == 1000
    assert y.max() < 1000
    with pytest.raises(ConfigError, match="image-size"):
      load_dataset("tfds:imagenet2012", str(tmp_path))


def test_tfds_not_prepared_or_unknown(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(ConfigError) as info:
    load_dataset("tfds:cifar10", data_dir=str(tmp_path))
  message = str(info.value)
  assert "not prepared" in message and str(tmp_path) in message
  assert "tfds build cifar10" in message and "array_record" in message
  with pytest.raises(ConfigError, match="tfds:cifar10"):
    load_dataset("tfds:no_such_dataset_xyz", data_dir=str(tmp_path))


@pytest.fixture(scope="module")
def tiny_tfds_dir(tmp_path_factory):
  """A real (not mocked) array_record tfds dataset, built without TF."""
  tfds = pytest.importorskip("tensorflow_datasets")
  from PIL import Image  # pylint: disable=g-import-not-at-top

  class JaxdlTinyImages(tfds.core.GeneratorBasedBuilder):
    """Variable-size RGB images with train and validation splits only."""
    VERSION = tfds.core.Version("1.0.0")
    # A module outside any package: tfds then looks for no resources beside it
    # (inside a package it needs importlib_resources, which it does not install).
    __module__ = "jaxdl_test_tiny_images"

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=(
          tfds.features.FeaturesDict({
              "image": tfds.features.Image(shape=(None, None, 3)),
              "label": tfds.features.ClassLabel(num_classes=3)})))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(0, 12),
              "validation": self._generate_examples(1, 5)}

    def _generate_examples(self, seed, n):
      rng = np.random.default_rng(seed)
      for i in range(n):
        # PNG bytes: encoding a numpy image would need TensorFlow.
        buf = io.BytesIO()
        pixels = rng.integers(0, 256, (*rng.integers(9, 30, 2), 3), np.uint8)
        Image.fromarray(pixels).save(buf, format="PNG")
        buf.seek(0)
        yield i, {"image": buf, "label": i % 3}

  data_dir = str(tmp_path_factory.mktemp("tfds"))
  tfds.disable_progress_bar()
  JaxdlTinyImages(data_dir=data_dir,
                  file_format="array_record").download_and_prepare()
  return data_dir


def test_tfds_prepared_array_record(tiny_tfds_dir):
  ds = load_dataset("tfds:jaxdl_tiny_images", tiny_tfds_dir, image_size=8)
  assert (len(ds.train), len(ds.test)) == (12, 5)  # test falls back to val
  assert ds.image_shape == (8, 8, 3) and ds.num_classes == 3
  x, y = ds.test.gather(np.arange(5))
  assert x.shape == (5, 8, 8, 3) and sorted(y) == [0, 0, 1, 1, 2]
  _assert_normalized(ds.train)


def test_tfds_prepared_as_tfrecord_says_rebuild(tiny_tfds_dir, tmp_path):
  copy = str(tmp_path / "dd")
  shutil.copytree(tiny_tfds_dir, copy)
  info_path = os.path.join(copy, "jaxdl_tiny_images", "1.0.0",
                           "dataset_info.json")
  with open(info_path) as f:
    info = dict(json.load(f), fileFormat="tfrecord")
  with open(info_path, "w") as f:
    json.dump(info, f)
  with pytest.raises(ConfigError, match="--file_format array_record"):
    load_dataset("tfds:jaxdl_tiny_images", copy, image_size=8)


def _npz_arrays(**changes):
  rng = np.random.default_rng(0)
  arrays = {"x_train": rng.integers(0, 256, (20, 5, 4), dtype=np.uint8),
            "y_train": np.arange(20) % 4,
            "x_test": rng.integers(0, 256, (6, 5, 4), dtype=np.uint8),
            "y_test": np.arange(6) % 4}
  arrays.update(changes)
  return {k: v for k, v in arrays.items() if v is not None}


def test_npz_happy_paths(tmp_path):
  path = str(tmp_path / "d.npz")
  np.savez(path, **_npz_arrays())
  ds = load_dataset(f"npz:{path}")
  assert ds.image_shape == (5, 4, 1) and ds.num_classes == 4
  assert (len(ds.train), len(ds.test)) == (20, 6)
  _assert_normalized(ds.train)
  rng = np.random.default_rng(1)
  np.savez(path, **_npz_arrays(
      x_train=rng.normal(3, 2, (20, 5, 4, 3)).astype(np.float32),
      x_test=rng.normal(3, 2, (6, 5, 4, 3)), num_classes=np.int64(7)))
  ds = load_dataset(f"npz:{path}")
  assert ds.image_shape == (5, 4, 3) and ds.num_classes == 7
  x, y = ds.test.gather(np.arange(6))
  assert x.dtype == np.float32 and y.dtype == np.int32
  _assert_normalized(ds.train)


def test_npz_tabular_features_train_an_mlp_and_refuse_image_models(tmp_path):
  """N x D features: each feature standardized on its own; an mlp learns a
  linear rule; a conv model is refused, naming --model."""
  from jaxdl import RunConfig, run
  rng = np.random.default_rng(0)
  x = rng.normal(0, 1, (600, 6)) * [1, 10, 100, 1, 1, 1] + [0, 5, -50, 0, 0, 0]
  y = (x[:, 0] + x[:, 1] / 10 - (x[:, 2] + 50) / 100 > 0).astype(np.int64)
  path = tmp_path / "tab.npz"
  np.savez(path, x_train=x[:500].astype(np.float32), y_train=y[:500],
           x_test=x[500:].astype(np.float32), y_test=y[500:])
  ds = load_dataset(f"npz:{path}")
  assert ds.image_shape == (1, 1, 6) and ds.num_classes == 2
  _assert_normalized(ds.train)
  summary = run(RunConfig.make(dataset=f"npz:{path}", model="mlp", epochs=3, lr=0.1,
                               out=str(tmp_path / "run"), progress=False))
  assert summary["test_accuracy"] >= 0.9, summary
  with pytest.raises(ConfigError, match="^--model='cnn' is not valid: mlp"):
    run(RunConfig.make(dataset=f"npz:{path}", model="cnn", out=str(tmp_path / "cnn"),
                       progress=False))
  assert not (tmp_path / "cnn").exists()


_BAD_NPZ = {
    "missing": (dict(y_test=None), "y_test is missing"),
    "ndim": (dict(x_train=np.zeros(20, np.uint8)), "x_train has shape"),
    "nan": (dict(x_train=np.full((20, 5, 4), np.nan, np.float32)), "x_train holds 400 values"),
    "inf": (dict(x_test=np.array([np.inf, -np.inf] + [0.0] * 118).reshape(6, 5, 4)),
            "x_test holds 2 values that are NaN or infinite"),
    "dtype": (dict(x_test=np.zeros((6, 5, 4), np.int32)), "x_test has dtype"),
    "float_labels": (dict(y_train=np.zeros(20)), "y_train has shape"),
    "2d_labels": (dict(y_test=np.zeros((6, 1), int)), "y_test has shape"),
    "length": (dict(y_train=np.zeros(19, int)), "y_train has 19 labels"),
    "negative": (dict(y_test=np.array([0, 1, -1, 0, 1, 2])), "y_test has"),
    "range": (dict(y_test=np.arange(6), num_classes=np.int64(4)),
              "y_test has labels in"),
    "num_classes": (dict(num_classes=np.float32(4)), "num_classes is"),
    "empty": (dict(x_test=np.zeros((0, 5, 4), np.uint8),
                   y_test=np.zeros(0, int)), "x_test is empty"),
    "image_shape": (dict(x_test=np.zeros((6, 4, 5), np.uint8)), "must match"),
}


@pytest.mark.parametrize("case", sorted(_BAD_NPZ))
def test_npz_bad_cases(tmp_path, case):
  changes, expected = _BAD_NPZ[case]
  path = str(tmp_path / "d.npz")
  np.savez(path, **_npz_arrays(**changes))
  with pytest.raises(ConfigError, match=expected):
    load_dataset(f"npz:{path}")


def test_npz_missing_or_unreadable_file(tmp_path):
  path = str(tmp_path / "nope.npz")
  with pytest.raises(ConfigError, match="no file at " + path):
    load_dataset(f"npz:{path}")
  (tmp_path / "text.npz").write_text("not a zip")
  with pytest.raises(ConfigError, match=r"a \.npz file"):
    load_dataset(f"npz:{tmp_path / 'text.npz'}")
  np.save(tmp_path / "one.npy", np.zeros(3))
  with pytest.raises(ConfigError, match=r"single \.npy array$"):
    load_dataset(f"npz:{tmp_path / 'one.npy'}")


def test_synthetic_is_deterministic_and_lazy():
  a, b = load_dataset("synthetic"), load_dataset("synthetic")
  assert (len(a.train), len(a.test)) == (50000, 10000)
  assert a.image_shape == (32, 32, 3)
  idx = np.array([49999, 0, 7])
  for x, y in zip(a.train.gather(idx), b.train.gather(idx), strict=True):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a.train.gather([0])[0], a.test.gather([0])[0])
  np.testing.assert_array_equal(a.train.gather([7])[0][0],
                                a.train.gather(idx)[0][2])
  big = load_dataset("synthetic", synthetic_shape=(224, 224, 3),
                     synthetic_classes=1000)
  x, y = big.train.gather(np.arange(4))
  assert x.shape == (4, 224, 224, 3) and x.dtype == np.float32
  assert y.dtype == np.int32 and 0 <= y.min() and y.max() < 1000
  x, y = a.train.gather(np.arange(2000))
  assert abs(x.mean()) < 0.05 and abs(x.std() - 1) < 0.05
  assert set(y) == set(range(10))
  assert load_dataset("synthetic", image_size=20).image_shape == (20, 20, 3)
  for shape in ((32, 32), (0, 32, 3)):  # the shape comes from --image-size
    with pytest.raises(ConfigError, match="--image-size=") as info:
      load_dataset("synthetic", synthetic_shape=shape)
    assert info.value.field == "image_size"
  with pytest.raises(ConfigError, match="--image-size="):
    load_dataset("synthetic", image_size=0)
  with pytest.raises(ValueError, match="num_classes") as info:  # no flag sets it
    load_synthetic(num_classes=0)
  assert not isinstance(info.value, ConfigError)
