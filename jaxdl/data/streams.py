"""Per-worker data streams: each worker reads its own shard, deterministically.

A worker's batch at a step is a pure function of (seed, worker, step), so a
run that restarts from a checkpoint at step t reads exactly the batches it
would have read without the restart, and simulated and real clusters agree.
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import numpy as np

from jaxdl.data.base import Split
from jaxdl.errors import ConfigError


def _largest_remainder(total: int, weights: Sequence[float],
                       minimum: int) -> tuple[int, ...]:
  """Splits `total` in proportion to `weights`, each part at least `minimum`."""
  w = np.asarray(weights, np.float64)
  quota = total * w / w.sum()
  parts = np.maximum(np.floor(quota).astype(np.int64), minimum)
  # Ties go to the lower index (stable sort), so the result is deterministic.
  while parts.sum() < total:
    parts[np.argsort(-(quota - parts), kind="stable")[0]] += 1
  while parts.sum() > total:
    # Raising small parts to `minimum` overshot: take back from the parts that
    # are furthest above their quota.
    excess = np.where(parts > minimum, parts - quota, -np.inf)
    parts[np.argsort(-excess, kind="stable")[0]] -= 1
  return tuple(int(p) for p in parts)


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
  return _largest_remainder(int(global_batch), speeds, minimum=1)


class WorkerStreams:
  """Training batches for M workers, each drawing from its own shard.

  The training set is permuted once with `seed` and cut into M contiguous
  shards of sizes proportional to the batch sizes, so every worker runs
  through its shard in the same number of steps. Each epoch a worker reshuffles
  its shard with `default_rng([seed, worker, epoch])`.
  """

  def __init__(self, split: Split, batch_sizes: Sequence[int], seed: int):
    self.split = split
    self.batch_sizes = tuple(batch_sizes)
    self.seed = seed
    n, m = len(split), len(self.batch_sizes)
    if m == 0 or m > n:
      raise ConfigError("workers", m, f"between 1 and {n}, the size of the "
                        "training set")
    for b in self.batch_sizes:
      if isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1:
        raise ConfigError("batch_size", b, "a positive integer per worker")
    self.batch_sizes = tuple(int(b) for b in self.batch_sizes)
    sizes = _largest_remainder(n, self.batch_sizes, minimum=1)
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

  @property
  def num_workers(self) -> int:
    return len(self.batch_sizes)

  def epoch_of(self, step: int) -> int:
    return step // self.steps_per_epoch

  def indices(self, worker: int, step: int) -> np.ndarray:
    """Training-set indices of `worker`'s batch at `step`."""
    if not 0 <= worker < self.num_workers:
      raise IndexError(f"worker {worker} of {self.num_workers}")
    if step < 0:
      raise IndexError(f"step {step} is negative")
    epoch, within = divmod(step, self.steps_per_epoch)
    cached = self._cache.get(worker)
    if cached is None or cached[0] != epoch:
      rng = np.random.default_rng([self.seed, worker, epoch])
      cached = (epoch, rng.permutation(self.shards[worker]))
      self._cache[worker] = cached
    b = self.batch_sizes[worker]
    return cached[1][within * b:(within + 1) * b]

  def batch(self, worker: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) of `worker` at `step`; depends on nothing else."""
    return self.split.gather(self.indices(worker, step))

  def global_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    """All workers' batches at `step`, concatenated in worker order."""
    parts = [self.batch(w, step) for w in range(self.num_workers)]
    return (np.concatenate([x for x, _ in parts]),
            np.concatenate([y for _, y in parts]))

  def stacked_batch(self, step: int, workers: Sequence[int] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Workers' batches at `step` (all workers, or those listed), padded to the
    largest batch size and stacked; see `stacked_batches`."""
    workers = range(self.num_workers) if workers is None else workers
    return self.stacked_batches([(w, step) for w in workers])

  def weights(self) -> np.ndarray:
    """(M, b_max) float32: each worker's example weights, 1/B for its real
    examples (B = sum of all batch sizes) and 0 for padding to b_max."""
    b_max, total = max(self.batch_sizes), sum(self.batch_sizes)
    return np.stack([np.where(np.arange(b_max) < b, 1.0 / total, 0.0)
                     for b in self.batch_sizes]).astype(np.float32)

  def stacked_batches(self, pairs: Sequence[tuple[int, int]]
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The batches of (worker, step) pairs, padded to the largest batch size
    and stacked: images (N, b_max, H, W, C), labels (N, b_max) and weights
    (N, b_max), 1/B for real examples (B = sum of all batch sizes), 0 for padding.
    """
    b_max, all_weights = max(self.batch_sizes), self.weights()
    images, labels, weights = [], [], []
    for worker, step in pairs:
      b = self.batch_sizes[worker]
      x, y = self.batch(worker, step)
      if b < b_max:  # np.pad copies even when there is nothing to pad
        x = np.pad(x, [(0, b_max - b)] + [(0, 0)] * (x.ndim - 1))
        y = np.pad(y, (0, b_max - b))
      images.append(x)
      labels.append(y)
      weights.append(all_weights[worker])
    return np.stack(images), np.stack(labels), np.stack(weights)
