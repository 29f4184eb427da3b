"""Per-worker streams (jaxdl.data.streams): shards, batches, weights, batch splits."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdl.data import ImageFields, WorkerStreams, partition_batch
from jaxdl.data.sources import ArraySplit
from jaxdl.errors import ConfigError


def _index_split(n):
  """A split whose label is the example's index, to check sharding."""
  return ImageFields(ArraySplit(np.zeros((n, 1, 1, 1), np.uint8), np.arange(n), 1.0,
                                np.zeros(1), np.ones(1)))


def test_shards_are_disjoint_and_proportional():
  streams = WorkerStreams(_index_split(1000), [32, 48, 48], seed=0)
  assert [len(s) for s in streams.shards] == [250, 375, 375]
  assert streams.steps_per_epoch == 7
  union = np.concatenate(streams.shards)
  assert len(np.unique(union)) == 1000 and union.max() < 1000
  seen = [set() for _ in range(3)]
  for step in range(streams.steps_per_epoch):
    for worker in range(3):
      y = streams.batch(worker, step)["label"]
      assert len(y) == streams.batch_sizes[worker]
      assert set(y) <= set(streams.shards[worker]) and not set(y) & seen[worker]
      seen[worker] |= set(y)


def test_batches_are_pure_functions_of_seed_worker_step():
  a = WorkerStreams(_index_split(500), [16, 16], seed=5)
  b = WorkerStreams(_index_split(500), [16, 16], seed=5)
  # Visit a in a scrambled order: the per-worker cache must not leak.
  for step in (40, 3, 17, 3, 0):
    np.testing.assert_array_equal(a.batch(1, step)["label"], b.batch(1, step)["label"])
  np.testing.assert_array_equal(b.batch(0, 0)["label"], WorkerStreams(
      _index_split(500), [16, 16], seed=5).batch(0, 0)["label"])
  other = WorkerStreams(_index_split(500), [16, 16], seed=6)
  assert not np.array_equal(a.batch(0, 0)["label"], other.batch(0, 0)["label"])
  both = a.global_batch(9)
  x, y = both["image"], both["label"]
  assert x.shape == (32, 1, 1, 1)
  np.testing.assert_array_equal(
      y, np.concatenate([a.batch(0, 9)["label"], a.batch(1, 9)["label"]]))


def test_each_epoch_reshuffles_the_shard():
  streams = WorkerStreams(_index_split(40), [10, 10], seed=0)
  assert streams.steps_per_epoch == 2
  assert [streams.epoch_of(s) for s in (0, 1, 2, 5)] == [0, 0, 1, 2]
  epochs = [np.concatenate([streams.batch(0, 2 * e + i)["label"] for i in (0, 1)])
            for e in range(3)]
  for order in epochs:
    assert sorted(order) == sorted(streams.shards[0])
  assert not np.array_equal(epochs[0], epochs[1])
  assert not np.array_equal(epochs[1], epochs[2])


def test_worker_streams_errors():
  with pytest.raises(ConfigError, match="at most 34 for worker 0"):
    WorkerStreams(_index_split(100), [40, 40, 40], seed=0)
  with pytest.raises(ConfigError, match="--workers=4"):
    WorkerStreams(_index_split(3), [1, 1, 1, 1], seed=0)
  with pytest.raises(ConfigError, match="batch-size"):
    WorkerStreams(_index_split(10), [2, 0], seed=0)
  with pytest.raises(ConfigError, match="workers"):
    WorkerStreams(_index_split(10), [], seed=0)


def test_partition_batch():
  assert partition_batch(128, [1, 1, 2]) == (32, 32, 64)
  assert partition_batch(10, [1, 1, 1]) == (4, 3, 3)
  assert partition_batch(10, [100, 1, 1]) == (8, 1, 1)
  assert partition_batch(4, [1, 1, 1, 1]) == (1, 1, 1, 1)
  rng = np.random.default_rng(0)
  for _ in range(50):
    speeds = rng.uniform(0.1, 5, rng.integers(1, 9))
    batch = int(rng.integers(len(speeds), 1000))
    parts = partition_batch(batch, speeds)
    assert sum(parts) == batch and min(parts) >= 1
    quota = batch * speeds / speeds.sum()
    assert np.all(np.abs(np.array(parts) - quota) < 1 + 1e-9) or min(quota) < 1
  for batch, speeds in ((2, [1, 1, 1]), (8, []), (8, [1, -1]),
                        (8, [1, float("nan")]), (8.5, [1, 1])):
    with pytest.raises(ConfigError):
      partition_batch(batch, speeds)


@pytest.mark.parametrize("batch_sizes", [(16,), (16, 16), (32, 48, 48), (3, 1, 5, 2)])
def test_weights_are_one_over_the_global_batch_and_zero_for_padding(batch_sizes):
  streams = WorkerStreams(_index_split(400), batch_sizes, seed=0)
  weights = streams.weights()
  total, b_max = sum(batch_sizes), max(batch_sizes)
  assert weights.shape == (len(batch_sizes), b_max) and weights.dtype == np.float32
  for row, b in zip(weights, batch_sizes, strict=True):
    np.testing.assert_allclose(row[:b], 1 / total)
    np.testing.assert_array_equal(row[b:], 0.0)  # padding
    assert row.sum() == pytest.approx(b / total, rel=1e-6)
  assert weights.sum() == pytest.approx(1.0, rel=1e-6)


def test_stacked_batch_pads_to_the_largest_and_carries_the_weights():
  streams = WorkerStreams(_index_split(400), [3, 5, 2], seed=1)
  fields, weights, ids = streams.stacked_batch(4)
  images, labels = fields["image"], fields["label"]
  np.testing.assert_array_equal(ids, [[0, 4], [1, 4], [2, 4]])
  assert images.shape == (3, 5, 1, 1, 1) and labels.shape == weights.shape == (3, 5)
  np.testing.assert_array_equal(weights, streams.weights())
  for worker, b in enumerate(streams.batch_sizes):
    np.testing.assert_array_equal(labels[worker, :b], streams.batch(worker, 4)["label"])
    np.testing.assert_array_equal(labels[worker, b:], 0)
    np.testing.assert_array_equal(images[worker, b:], 0)
  # A subset of the workers, in the order asked, with their own weights.
  some, some_weights, some_ids = streams.stacked_batch(4, [2, 0])
  np.testing.assert_array_equal(some["label"], labels[[2, 0]])
  np.testing.assert_array_equal(some_ids, [[2, 4], [0, 4]])
  np.testing.assert_array_equal(some_weights, weights[[2, 0]])
