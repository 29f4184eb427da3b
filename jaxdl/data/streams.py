"""Per-worker data streams: each worker reads its own batches, deterministically.

A worker's batch at a step is a pure function of (seed, worker, step), so a
run that restarts from a checkpoint at step t reads exactly the batches it
would have read without the restart, and simulated and real clusters agree.
A batch is a dict of fields (jaxdl.data.fields); `make_streams` picks the
streams for a task's kind of data.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Iterator, Sequence

import numpy as np

from jaxdl.data.fields import Fields, FunctionData, IterableData, check_fields
from jaxdl.errors import ConfigError, TaskError
from jaxdl.partition import Partitions, largest_remainder


def partition_batch(global_batch: int,
                    speeds: Sequence[float]) -> tuple[int, ...]:
  """Splits a global batch over workers in proportion to their speeds.

  Largest-remainder rounding; every worker gets at least one example and the
  parts sum to exactly `global_batch`.
  """
  speeds = list(speeds)
  if not speeds or not all(
      isinstance(s, numbers.Real) and not isinstance(s, bool)
      and math.isfinite(s) and s > 0
      for s in speeds):
    raise ConfigError("worker_speeds", speeds,
                      "one positive finite number per worker")
  if (isinstance(global_batch, bool)
      or not isinstance(global_batch, numbers.Integral)
      or global_batch < len(speeds)):
    raise ConfigError("batch_size", global_batch,
                      f"an integer of at least {len(speeds)}, one example "
                      f"for each of the {len(speeds)} workers")
  return largest_remainder(int(global_batch), speeds, minimum=1)


def check_workers(data: Any, workers: int) -> None:
  """Refuses more workers than the training set has examples (a worker's
  shard holds at least one); data without a length (a FunctionData, an
  IterableData) bounds none. Asked before a batch size per worker is made."""
  if data is None or isinstance(data, (FunctionData, IterableData)):
    return
  n = len(data)
  if not 1 <= workers <= n:
    raise ConfigError("workers", workers, f"between 1 and {n}, the size of the training set")


def _check_batch_sizes(batch_sizes: Sequence[int]) -> tuple[int, ...]:
  if not batch_sizes:
    raise ConfigError("workers", 0, "at least 1")
  for b in batch_sizes:
    if isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1:
      raise ConfigError("batch_size", b, "a positive integer per worker")
  return tuple(int(b) for b in batch_sizes)


class Streams:
  """What every kind of stream gives the engines: each worker's batch at each
  of its steps (`batch`), and batches padded and stacked for a jitted call.

  Subclasses set `batch_sizes`, `seed`, `steps_per_epoch` and `task`, and
  define `batch`.
  """
  batch_sizes: tuple[int, ...]
  seed: int
  steps_per_epoch: int
  task: str = "custom"
  in_memory = False  # WorkerStreams over in-memory arrays: gathers by index

  @property
  def num_workers(self) -> int:
    return len(self.batch_sizes)

  def epoch_of(self, step: int) -> int:
    return step // self.steps_per_epoch

  def size(self, worker: int, step: int) -> int:
    """`worker`'s batch size at `step`."""
    return self.batch_sizes[worker]

  @property
  def capacity(self) -> int:
    """The largest batch of any worker at any step: what stacked batches are padded to."""
    return max(self.batch_sizes)

  def batch(self, worker: int, step: int) -> Fields:
    """The fields of `worker`'s batch at its `step`; depends on nothing else."""
    raise NotImplementedError

  @functools.cached_property
  def example(self) -> Fields:
    """Worker 0's first batch: what the fields look like."""
    return self.batch(0, 0)

  def _check_position(self, worker: int, step: int) -> None:
    if not 0 <= worker < self.num_workers:
      raise IndexError(f"worker {worker} of {self.num_workers}")
    if step < 0:
      raise IndexError(f"step {step} is negative")

  def global_batch(self, step: int) -> Fields:
    """All workers' batches at `step`, concatenated in worker order."""
    parts = [self.batch(w, step) for w in range(self.num_workers)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def stacked_batch(self, step: int, workers: Sequence[int] | None = None):
    """Workers' batches at `step` (all workers, or those listed), padded to the
    largest batch size and stacked; see `stacked_batches`."""
    workers = range(self.num_workers) if workers is None else workers
    return self.stacked_batches([(w, step) for w in workers])

  def weights(self) -> np.ndarray:
    """(M, b_max) float32: each worker's example weights, 1/B for its real
    examples (B = sum of all batch sizes) and 0 for padding to b_max
    (read-only: every batch's rows come from it)."""
    return self._weights

  @functools.cached_property
  def _weights(self) -> np.ndarray:
    weights = np.stack([self._row(b) for b in self.batch_sizes])
    weights.flags.writeable = False
    return weights

  def _row(self, b: int, length: int | None = None) -> np.ndarray:
    """A batch of b examples' weights, padded to `length` (default:
    `capacity`; read-only)."""
    length = self.capacity if length is None else length
    rows = self.__dict__.setdefault("_rows", {})
    if (b, length) not in rows:
      row = np.where(np.arange(length) < b, 1.0 / sum(self.batch_sizes), 0.0)
      rows[b, length] = row.astype(np.float32)
      rows[b, length].flags.writeable = False
    return rows[b, length]

  def padded_batch(self, worker: int, step: int,
                   length: int | None = None) -> tuple[Fields, np.ndarray]:
    """`worker`'s batch at `step` padded with zeros to `length` examples
    (default: `capacity`), and its weights: 1/B for its real examples (B =
    sum of all batch sizes), 0 for padding."""
    length = self.capacity if length is None else length
    b, batch = self.size(worker, step), self.batch(worker, step)
    if b < length:  # np.pad copies even when there is nothing to pad
      batch = {k: np.pad(v, [(0, length - b)] + [(0, 0)] * (v.ndim - 1))
               for k, v in batch.items()}
    return batch, self._row(b, length)

  def stacked_batches(self, pairs: Sequence[tuple[int, int]]
                      ) -> tuple[Fields, np.ndarray, np.ndarray]:
    """The batches of (worker, step) pairs, padded with zeros to `capacity`
    (b_max) and stacked: fields (N, b_max, ...), weights (N, b_max), 1/B
    for real examples (B = sum of all batch sizes) and 0 for padding, and
    ids (N, 2), each batch's (worker, step)."""
    fields, weights = zip(*(self.padded_batch(worker, step) for worker, step in pairs))
    stacked = {k: np.stack([f[k] for f in fields]) for k in fields[0]}
    return stacked, np.stack(weights), np.asarray(pairs, np.int32).reshape(-1, 2)


class WorkerStreams(Streams):
  """Training batches for M workers, each drawing from its own shard of a
  random-access split (``len`` and ``gather(indices) -> fields``).

  The training set is permuted once with `seed` and cut into M contiguous
  shards of sizes proportional to the batch sizes, so every worker runs
  through its shard in the same number of steps. Each epoch a worker reshuffles
  its shard with `default_rng([seed, worker, epoch])`.
  """

  def __init__(self, split, batch_sizes: Sequence[int], seed: int, task: str = "custom"):
    self.split, self.seed, self.task = split, seed, task
    self.in_memory = bool(getattr(split, "in_memory", False))
    n = len(split)
    check_workers(split, len(batch_sizes))
    self.batch_sizes = _check_batch_sizes(batch_sizes)
    sizes = largest_remainder(n, self.batch_sizes, minimum=1)
    for worker, (b, size) in enumerate(zip(self.batch_sizes, sizes)):
      if b > size:
        raise ConfigError("batch_size", b, f"at most {size} for worker "
                          f"{worker} (its shard of the {n}-example training "
                          "set)")
    order = np.random.default_rng(seed).permutation(n)
    bounds = np.cumsum((0,) + sizes)
    self.shards = tuple(order[lo:hi] for lo, hi in zip(bounds, bounds[1:]))
    self.steps_per_epoch = min(
        size // b for size, b in zip(sizes, self.batch_sizes))
    # worker -> (epoch, shard permuted for that epoch): consecutive steps
    # reuse it instead of permuting the shard again.
    self._cache: dict[int, tuple[int, np.ndarray]] = {}

  def indices(self, worker: int, step: int) -> np.ndarray:
    """Training-set indices of `worker`'s batch at `step`."""
    self._check_position(worker, step)
    epoch, within = divmod(step, self.steps_per_epoch)
    cached = self._cache.get(worker)
    if cached is None or cached[0] != epoch:
      rng = np.random.default_rng([self.seed, worker, epoch])
      cached = (epoch, rng.permutation(self.shards[worker]))
      self._cache[worker] = cached
    b = self.batch_sizes[worker]
    return cached[1][within * b:(within + 1) * b]

  def batch(self, worker: int, step: int) -> Fields:
    return self.split.gather(self.indices(worker, step))


class SlicedStreams(Streams):
  """Training batches for M workers whose shares of the global batch B may
  change between steps (--partition proportional or adaptive): the training
  set is permuted each epoch with `default_rng([seed, epoch])`, step s of the
  epoch takes its rows s * B, ..., (s + 1) * B - 1, and worker m takes its
  slice of them, in worker order, by the partition at step s
  (jaxdl.partition.Partitions). However B is split, a step's examples are
  those of one worker with batch B, the split only decides who computes
  which."""

  def __init__(self, split, partitions, seed: int, task: str = "custom"):
    self.split, self.seed, self.task = split, seed, task
    self.in_memory = bool(getattr(split, "in_memory", False))
    self.partitions = partitions
    self.batch_sizes = _check_batch_sizes(partitions.sizes(0))
    n, total = len(split), sum(self.batch_sizes)
    if total > n:
      raise ConfigError("batch_size", total, f"a global batch of at most {n} examples, the "
                        "size of the training set")
    self.steps_per_epoch = n // total
    self._cache: tuple[int, np.ndarray] | None = None  # (epoch, its permutation)

  def repartition(self, partitions) -> None:
    """The run's partitions, as its schedule or trace has them (same sizes at step 0)."""
    if partitions.sizes(0) != self.batch_sizes:
      raise ValueError(f"partitions from {partitions.sizes(0)}, not {self.batch_sizes}")
    self.partitions = partitions

  def size(self, worker: int, step: int) -> int:
    return self.partitions.sizes(step)[worker]

  @property
  def capacity(self) -> int:
    return self.partitions.capacity

  def indices(self, worker: int, step: int) -> np.ndarray:
    """Training-set indices of `worker`'s batch at `step`."""
    self._check_position(worker, step)
    epoch, within = divmod(step, self.steps_per_epoch)
    if self._cache is None or self._cache[0] != epoch:
      self._cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.split)))
    sizes = self.partitions.sizes(step)
    lo = within * sum(sizes) + sum(sizes[:worker])
    return self._cache[1][lo:lo + sizes[worker]]

  def batch(self, worker: int, step: int) -> Fields:
    return self.split.gather(self.indices(worker, step))


class FunctionStreams(Streams):
  """Batches from a task's function (worker, step, seed) -> fields."""

  def __init__(self, data: FunctionData, batch_sizes: Sequence[int], seed: int,
               task: str = "custom"):
    self.fn, self.seed, self.task = data.fn, seed, task
    self.batch_sizes = _check_batch_sizes(batch_sizes)
    self.steps_per_epoch = int(data.steps_per_epoch)

  def batch(self, worker: int, step: int) -> Fields:
    self._check_position(worker, step)
    return check_fields(self.fn(worker, step, self.seed), self.task,
                        f"the batch of worker {worker} at step {step}",
                        rows=self.batch_sizes[worker])


class IterableStreams(Streams):
  """Batches cut from an iterable's global batches, in order: worker m's
  k-th batch is its slice (workers in order) of the k-th global batch. A
  global batch stays in memory until every worker has taken its slice."""

  def __init__(self, data: IterableData, batch_sizes: Sequence[int], seed: int,
               task: str = "custom"):
    self.data, self.seed, self.task = data, seed, task
    self.batch_sizes = _check_batch_sizes(batch_sizes)
    length = data.steps_per_epoch or (len(data.iterable) if hasattr(data.iterable, "__len__")
                                      else None)
    self.steps_per_epoch = int(length or 100)
    self.bounds = np.cumsum((0,) + self.batch_sizes)
    self._iterator: Iterator | None = None
    self._next = 0  # the index of the next global batch the iterator gives
    self._floor: int | None = None
    self._held: dict[int, tuple[Fields, set[int]]] = {}  # k -> (batch, workers not served)

  def _global(self, k: int) -> Fields:
    fresh = False  # the iterator was just made: it has given nothing yet
    if k not in self._held:
      if k < self._next:  # a batch read past without keeping it: read again from the start
        self._iterator, self._next, self._floor = None, 0, k
      # Global batches from the smallest one asked for on are kept; those
      # before it are read past (a resumed run's).
      self._floor = k if self._floor is None else min(self._floor, k)
    while k not in self._held:
      if self._iterator is None:
        self._iterator, fresh = iter(self.data.iterable), True
      try:
        element = next(self._iterator)
      except StopIteration:
        if fresh:
          raise TaskError(self.task, "train data", "an iterable that gives its batches "
                          f"each time it is iterated; it gave none at global batch "
                          f"{self._next} (a one-shot iterator has one epoch and cannot "
                          "be resumed)") from None
        self._iterator = None  # the next epoch
        continue
      fresh = False
      fields = check_fields(element, self.task, f"train data, global batch {self._next}",
                            rows=int(self.bounds[-1]))
      if self._next >= self._floor:
        self._held[self._next] = (fields, set(range(self.num_workers)))
      self._next += 1
    return self._held[k][0]

  def batch(self, worker: int, step: int) -> Fields:
    self._check_position(worker, step)
    fields = self._global(step)
    lo, hi = self.bounds[worker], self.bounds[worker + 1]
    waiting = self._held[step][1]
    waiting.discard(worker)
    if not waiting:
      del self._held[step]
    return {k: v[lo:hi] for k, v in fields.items()}


def make_streams(data: Any, batch_sizes: Sequence[int], seed: int,
                 task: str = "custom", sliced: bool = False) -> Streams:
  """The streams of a task's training data (jaxdl.data.fields.to_data);
  `sliced`: a split of the global batch that may change (SlicedStreams,
  `batch_sizes` at step 0)."""
  if data is None:
    raise TaskError(task, "train data", "a dict of arrays, a FunctionData or an IterableData; "
                    "the task has none")
  if sliced:
    if isinstance(data, (FunctionData, IterableData)):
      raise TaskError(task, "train data", "arrays held in memory for --partition "
                      "proportional or adaptive (its batches are slices of one global "
                      f"batch, taken by index), not a {type(data).__name__}")
    return SlicedStreams(data, Partitions(batch_sizes), seed, task)
  if isinstance(data, FunctionData):
    return FunctionStreams(data, batch_sizes, seed, task)
  if isinstance(data, IterableData):
    return IterableStreams(data, batch_sizes, seed, task)
  return WorkerStreams(data, batch_sizes, seed, task)
