"""Discrete-event schedules: when each event of `jaxdl.trace` happens.

One function per algorithm shape, `(cost, length, **policy) -> Schedule`:
a list of events in the order the math must run them, with times from the
cost model, sorted by time with ties in causal order; a "pull"'s version
always equals the number of "apply" events before it. A synchronous
schedule's length is its number of global steps (jaxdl.cluster.sync_schedules),
an asynchronous one's a `Budget` (jaxdl.cluster.async_schedules). Here:
what every schedule shares.
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Iterable, Sequence

from jaxdl.trace import Event


class Schedule(list):
  """A list of events, plus the traffic that produced them."""

  def __init__(self, events: Iterable[Event] = (), bytes_total: float = 0.0,
               queued_s: Sequence[float] = (), batch_seconds: Sequence[Sequence[float]] = ()):
    super().__init__(events)
    self.bytes_total = float(bytes_total)  # bytes sent over all links
    self.queued_s = tuple(queued_s)        # per worker: seconds queued for busy links
    # per worker: each synchronous step's compute seconds (others: none kept)
    self.batch_seconds = tuple(tuple(t) for t in batch_seconds)


@dataclasses.dataclass(frozen=True)
class Budget:
  """When an asynchronous schedule ends: once the workers together have
  processed `samples` examples, worker w's iteration counting
  `batch_sizes[w]` (with no batch sizes, 1 each: a budget of updates)."""
  samples: int
  batch_sizes: tuple[int, ...] | None = None

  def __post_init__(self):
    ok = isinstance(self.samples, numbers.Integral) and self.samples >= 0
    _check("budget", self.samples, ok, "an integer >= 0 (samples, or updates)")

  def size(self, worker: int) -> int:
    return 1 if self.batch_sizes is None else self.batch_sizes[worker]

def _check(field: str, value, ok: bool, allowed: str) -> None:
  """An argument out of range: a programming error (users' settings are
  validated at the edge, by the algorithms' settings)."""
  if not ok:
    raise ValueError(f"{field}={value!r}: {allowed}")


def _other(u: float, worker: int, num_workers: int) -> int:
  """A uniformly random worker other than `worker`, from a uniform draw u in
  [0, 1) (numpy's: a multiple of 2**-53, so u * n rounds below n)."""
  k = int(u * (num_workers - 1))
  return k if k < worker else k + 1
