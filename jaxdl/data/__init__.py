"""Datasets by name, and deterministic per-worker streams over them."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from jaxdl.data import sources
from jaxdl.data.base import Dataset, Split
from jaxdl.data.fields import ArrayFields, FunctionData, ImageFields, IterableData
from jaxdl.data.text import CORPORA, TextDataset, load_text
from jaxdl.data.streams import (SlicedStreams, Streams, WorkerStreams, check_workers,
                                make_streams, partition_batch)
from jaxdl.errors import ConfigError
from jaxdl.registry import Registry

__all__ = ["CORPORA", "DATASETS", "ArrayFields", "Dataset", "FunctionData", "ImageFields", "IterableData",
           "Split", "Streams", "TextDataset", "WorkerStreams", "check_image_size", "check_name",
           "check_workers", "describe_datasets", "load_dataset", "make_streams",
           "partition_batch", "batch_sizes"]


@dataclasses.dataclass(frozen=True)
class LoadOptions:
  """What load_dataset passes on to a registered loader."""
  data_dir: str | None = None
  synthetic_shape: tuple[int, ...] = (32, 32, 3)
  synthetic_classes: int = 10


DATASETS: Registry[Callable[[LoadOptions], Dataset]] = Registry("dataset")

DATASETS.register("digits", sources.load_digits.__doc__)(
    lambda opts: sources.load_digits())
DATASETS.register("mnist", sources.load_mnist.__doc__)(
    lambda opts: sources.load_mnist(opts.data_dir))
DATASETS.register("fashion_mnist", sources.load_fashion_mnist.__doc__)(
    lambda opts: sources.load_fashion_mnist(opts.data_dir))
DATASETS.register("python_docs", "Text: the Python reference's topic pages (466 KB, "
                  "PSF License), character windows of 64 for --model transformer.")(
    lambda opts: load_text("python_docs"))
DATASETS.register("synthetic", "Random 32x32x3 images (--image-size N: NxNx3) for "
                  "throughput work; nothing to learn.")(
    lambda opts: sources.load_synthetic(opts.synthetic_shape,
                                        opts.synthetic_classes))

_PREFIXED = (("tfds:NAME", "Any tfds image classification dataset prepared "
              "as array_record in --data-dir, e.g. tfds:cifar10."),
             ("npz:PATH", "A .npz with x_train, y_train, x_test, y_test "
              "(uint8 or float images N x H x W [x C], or float features N x D "
              "for --model mlp; integer labels)."))


def batch_sizes(config) -> tuple[int, ...]:
  """Each worker's batch size in a run's config (a RunConfig): --batch-sizes,
  or the global batch split by --worker-speeds, or --batch-size for everyone."""
  m, data = config.algorithm.workers, config.data
  if data.batch_sizes is not None:
    if len(data.batch_sizes) != m or any(b <= 0 for b in data.batch_sizes):
      raise ConfigError("batch_sizes", data.batch_sizes,
                        f"{m} positive sizes, one per worker (--workers {m})")
    return tuple(data.batch_sizes)
  speeds = config.cluster.worker_speeds
  if speeds is not None:
    if len(speeds) != m:
      raise ConfigError("worker_speeds", speeds, f"{m} speeds, one per worker")
    return partition_batch(data.batch_size * m, speeds)
  return (data.batch_size,) * m


def check_name(name: str) -> None:
  """Raises the ConfigError for a name that no loader takes; reads no data."""
  prefix, _, rest = name.partition(":")
  if not (name in DATASETS or (prefix in ("tfds", "npz") and rest)):
    raise ConfigError("dataset", name, "one of " + ", ".join(
        DATASETS.names() + [prefixed for prefixed, _ in _PREFIXED]))


SYNTHETIC_MAX_BYTES = 4 * 2**30
"""The synthetic set is drawn lazily, image by image; its largest array is an
evaluation batch of 1000 float32 images, which --image-size N (N x N x 3)
must keep within this many bytes: N <= 598."""
SYNTHETIC_EVAL_BATCH = 1000


def synthetic_max_size() -> int:
  """The largest --image-size of the synthetic dataset (SYNTHETIC_MAX_BYTES)."""
  return math.isqrt(SYNTHETIC_MAX_BYTES // (SYNTHETIC_EVAL_BATCH * 3 * 4))


def check_image_size(name: str, image_size: int | None) -> None:
  """Refuses a synthetic --image-size whose images would not fit in memory
  (SYNTHETIC_MAX_BYTES), from the shape alone."""
  if name != "synthetic" or not isinstance(image_size, int) or image_size < 1:
    return
  batch_bytes = SYNTHETIC_EVAL_BATCH * image_size * image_size * 3 * 4
  if batch_bytes > SYNTHETIC_MAX_BYTES:
    raise ConfigError("image_size", image_size, f"at most {synthetic_max_size()} for "
                      f"--dataset synthetic ({SYNTHETIC_EVAL_BATCH} float32 images of "
                      f"{image_size}x{image_size}x3 take {batch_bytes / 2**30:.0f} GiB; "
                      f"the limit is {SYNTHETIC_MAX_BYTES // 2**30} GiB)")


def load_dataset(name: str, data_dir: str | None = None,
                 image_size: int | None = None,
                 synthetic_shape: tuple[int, ...] = (32, 32, 3),
                 synthetic_classes: int = 10) -> Dataset:
  """Loads a dataset by name: a registered one, tfds:NAME or npz:PATH.

  `image_size` resizes and centre-crops tfds images (needed when their sizes
  vary); the other datasets have fixed shapes and refuse it.
  """
  if name.startswith("tfds:") and name[5:]:
    return sources.load_tfds(name[5:], data_dir, image_size)
  check_image_size(name, image_size)
  if name == "synthetic" and image_size is not None:
    synthetic_shape = (image_size, image_size, 3)
  elif image_size is not None:
    raise ConfigError("image_size", image_size,
                      f"left unset for {name}; only tfds: and synthetic datasets take it")
  if name.startswith("npz:") and name[4:]:
    return sources.load_npz(name[4:])
  check_name(name)
  return DATASETS.get(name)(LoadOptions(data_dir, tuple(synthetic_shape),
                                        synthetic_classes))


def describe_datasets() -> list[tuple[str, str]]:
  """(name, one-line description) of every dataset, for `jaxdl list`."""
  return [(n, DATASETS.doc(n)) for n in DATASETS.names()] + list(_PREFIXED)
