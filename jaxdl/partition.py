"""How a synchronous step's global batch is partitioned among its workers.

Heterogeneous workers (the Choi seed's CPU and GPU workers) finish equal
batches at different times, and a synchronous step waits for the last. A
partition gives each worker a share of the global batch B:

  static        fixed sizes (--batch-sizes, or B / M each);
  proportional  the static sizes for a warm-up of `every` steps, then a
                partition from the batch times measured over it, kept for the
                rest of the run;
  adaptive      partitions after the first step from its batch times, then
                again every `every` steps from each worker's last `window`
                batches (a moving window, so that a worker whose speed
                changes is followed).

Each worker's batch time is fitted as a fixed part plus a part per example
(`Partitioner.costs`). Proportional's partition equalizes the predicted times:
in proportion to the throughputs (examples per second) where there is no
fixed part. Adaptive's also weighs how the times vary: a step waits for the
slowest of M batches whose times scatter around their means (the seed's
1.4-2.5 s around 1.9 s), and the partition that minimizes the expected slowest
is not the one that equalizes the means. From the equal-means partition it moves
one example at a time while the expected slowest, over each worker's
measured times relative to its fit (`Partitioner.spreads`, independent
across workers), falls (`quickest`): a worker whose time per example is
large gives a few examples to the fast ones. With times that do not scatter
this is the equal-means partition, or an integer partition of the same slowest time.

B is fixed: the sizes always sum to B, each at least one example, and an
example's weight in the update is 1/B whatever worker computed it, so the
update is the global batch's mean gradient however the batch is partitioned.

A `Partitioner` is host state: the engine that times the batches owns one
and feeds it each step's batch times; the sizes it returns are recorded in
the trace, so a run's partitions replay without the times that chose them.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import numbers
from typing import Sequence

import numpy as np

from jaxdl.errors import ConfigError

POLICIES = ("static", "proportional", "adaptive")


@dataclasses.dataclass(frozen=True)
class Policy:
  kind: str = "static"
  every: int = 5
  """proportional: the warm-up's steps; adaptive: steps between partitions."""
  window: int = 20
  """adaptive: each worker's batches in the moving window its cost is fitted over."""

  def __post_init__(self):
    if self.kind not in POLICIES:
      raise ConfigError("partition", self.kind, "one of " + ", ".join(POLICIES))
    for field, value in (("rebalance_every", self.every), ("rebalance_window", self.window)):
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(field, value, "an integer >= 1 (steps)" if field.endswith("every")
                          else "an integer >= 1 (batches per worker)")

  @classmethod
  def of(cls, config) -> Policy:
    """The policy of a run's config (a RunConfig: its --partition,
    --rebalance-every and --rebalance-window, for its --workers), checked."""
    c = config.cluster
    policy = cls(c.partition, c.rebalance_every, c.rebalance_window)
    policy.check_workers(config.algorithm.workers)
    return policy

  def check_workers(self, workers: int) -> None:
    """Refuses a partition that changes among fewer than two workers: one holds
    the whole global batch, and there is nothing to partition."""
    if self.kind != "static" and workers < 2:
      raise ConfigError("partition", self.kind, f"static with --workers {workers}: "
                        "proportional and adaptive partition the global batch among 2 workers "
                        "or more")


def largest_remainder(total: int, weights: Sequence[float],
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


class Partitioner:
  """The sizes in force (`sizes`) and what chooses the next: fed each step's
  batch times (`observe`), it says when the policy partitions B anew."""

  def __init__(self, policy: Policy, sizes: Sequence[int]):
    self.policy, self.sizes = policy, tuple(int(b) for b in sizes)
    self.total = sum(self.sizes)
    window = policy.every if policy.kind == "proportional" else policy.window
    # per worker: (examples, seconds) of its most recent batches
    self.recent = [collections.deque(maxlen=window) for _ in self.sizes]
    self.observed = 0  # steps observed so far

  def costs(self) -> np.ndarray:
    """(M, 2): each worker's batch cost, seconds = a + c x examples, fitted
    over its recent batches. A real worker pays a fixed a per step (dispatch,
    its collectives' calls) that a throughput alone would credit to the
    larger batch, which would then grow without end. Where its sizes did not
    vary by 10% or more, or the fit is not a cost (c <= 0 or a < 0): a = 0
    and c its seconds per example."""
    out = []
    for r in self.recent:
      b, t = np.asarray([x for x, _ in r], np.float64), np.asarray([y for _, y in r])
      a, c = 0.0, t.sum() / b.sum()
      if np.ptp(b) >= 0.1 * b.mean() and len(b) > 3:
        (slope, intercept), cov = np.polyfit(b, t, 1, cov=True)
        if slope > 0 and intercept > 2 * np.sqrt(cov[1, 1]):
          a, c = intercept, slope
      out.append((a, c))
    return np.asarray(out)

  def spreads(self, costs: np.ndarray) -> list[np.ndarray]:
    """Per worker: its recent batch times over what its fitted cost predicts."""
    return [np.asarray([t / (a + c * b) for b, t in r]) for r, (a, c) in zip(self.recent, costs)]

  def due(self, observed: int) -> bool:
    """Whether the policy may partition B anew once `observed` steps are observed."""
    kind, every = self.policy.kind, self.policy.every
    return (kind == "proportional" and observed == every) or (
        kind == "adaptive" and (observed == 1 or observed % every == 0))

  def observe(self, seconds: Sequence[float]) -> tuple[int, ...] | None:
    """Records the step just taken: each worker's seconds for its batch of
    `sizes`. The sizes of the steps from the next on if the policy partitions B
    again now (they become `sizes`), else None."""
    if len(seconds) != len(self.sizes) or not all(t > 0 for t in seconds):
      raise ValueError(f"batch seconds {list(seconds)}: one > 0 per worker")
    for r, b, t in zip(self.recent, self.sizes, seconds):
      r.append((b, float(t)))
    self.observed += 1
    if not self.due(self.observed):
      return None
    costs = self.costs()
    sizes = (quickest(self.total, costs, self.spreads(costs)) if self.policy.kind == "adaptive"
             else balanced(self.total, costs))
    if sizes == self.sizes:
      return None
    self.sizes = sizes
    return sizes


def balanced(total: int, costs: np.ndarray) -> tuple[int, ...]:
  """Sizes summing to `total`, each at least one, whose predicted seconds
  a_m + c_m b_m are equal (costs: (M, 2) rows (a, c)); with every a = 0,
  sizes in proportion to the throughputs 1 / c."""
  a, c = costs[:, 0], costs[:, 1]
  ones = np.zeros(len(a), bool)  # workers held at one example
  for _ in range(len(a)):
    rest = total - ones.sum()
    time = (rest + np.sum(a[~ones] / c[~ones])) / np.sum(1.0 / c[~ones])
    quota = np.where(ones, 1.0, (time - a) / c)
    if np.all(quota >= 1):
      break
    ones |= quota < 1
  return largest_remainder(total, quota, minimum=1)


def expected_slowest(means: np.ndarray, spreads: Sequence[np.ndarray]) -> float:
  """E[max_m means_m r_m] for independent r_m, each uniform over the values
  `spreads[m]` (exact: the maximum's distribution is the product of the
  workers' distribution functions)."""
  times = [np.sort(m * np.asarray(r, np.float64)) for m, r in zip(means, spreads)]
  values = np.unique(np.concatenate(times))
  cdf = np.prod([np.searchsorted(t, values, side="right") / len(t) for t in times], axis=0)
  return float(values @ np.diff(cdf, prepend=0.0))


def quickest(total: int, costs: np.ndarray, spreads: Sequence[np.ndarray]) -> tuple[int, ...]:
  """Sizes summing to `total`, each at least one, of a small expected slowest
  batch time: from `balanced`'s partition, the best move of one example from one
  worker to another while it lowers `expected_slowest` of the times
  a_m + c_m b_m scattered by `spreads` (a local minimum, deterministic)."""
  a, c = costs[:, 0], costs[:, 1]
  sizes = np.asarray(balanced(total, costs))
  best = expected_slowest(a + c * sizes, spreads)
  moves = [np.eye(len(sizes), dtype=int)[j] - np.eye(len(sizes), dtype=int)[i]
           for i in range(len(sizes)) for j in range(len(sizes)) if i != j]
  while True:
    allowed = [move for move in moves if np.all(sizes + move >= 1)]
    scores = [expected_slowest(a + c * (sizes + move), spreads) for move in allowed]
    if not scores or min(scores) >= best * (1 - 1e-12):
      return tuple(int(b) for b in sizes)
    sizes, best = sizes + allowed[int(np.argmin(scores))], min(scores)


class Partitions:
  """A run's partitions over its steps: the sizes from step 0 on, and each
  change ("partition" events of its trace) from its step on."""

  def __init__(self, sizes: Sequence[int], changes: Sequence[tuple[int, Sequence[int]]] = ()):
    self.starts = [0] + [int(step) for step, _ in changes]
    self.all = [tuple(int(b) for b in sizes)] + [tuple(int(b) for b in s) for _, s in changes]
    if any(b < c for b, c in zip(self.starts[1:], self.starts)) or any(
        sum(s) != sum(self.all[0]) or len(s) != len(self.all[0]) for s in self.all):
      raise ValueError(f"partitions {list(zip(self.starts, self.all))}: in step order, each "
                       f"of {len(self.all[0])} sizes summing to {sum(self.all[0])}")

  @classmethod
  def of(cls, sizes: Sequence[int], events) -> Partitions:
    """The partitions a trace's events record, from `sizes` at step 0."""
    return cls(sizes, [(e.iteration, e.sizes) for e in events if e.kind == "partition"])

  def sizes(self, step: int) -> tuple[int, ...]:
    """The workers' batch sizes at `step`."""
    return self.all[bisect.bisect_right(self.starts, step) - 1]

  @property
  def capacity(self) -> int:
    """The largest batch any worker takes in the run."""
    return max(max(s) for s in self.all)
