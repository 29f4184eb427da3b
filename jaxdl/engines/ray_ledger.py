"""What a ray run's central actor keeps, whatever the algorithm: `Ledger`,
the base of the parameter server (`jaxdl.engines.ray_server.Server`) and of
the coordinator of workers that keep their own models
(`jaxdl.engines.ray_coordinator.Coordinator`).

The central actor records each event with its wall time (seconds since the
run started), in the order the events' math ran, and ends the run once the
workers together have processed the budget of samples; what a worker does
after that is dropped, as an iteration still in flight at the end of a
simulated schedule is.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import jax
import numpy as np

from jaxdl.engines.base import process_identity
from jaxdl.engines.events import EventPrograms, initial_state, stack, take
from jaxdl.trace import Event


def _cpu_seconds() -> tuple[float, float | None]:
  """CPU seconds used so far by this process (all its threads) and by the
  whole machine (Linux; None elsewhere)."""
  try:
    with open("/proc/stat") as f:  # cpu user nice system idle iowait irq softirq ...
      user, nice, system, _, _, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    machine = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError):
    machine = None
  return time.process_time(), machine


class Ledger:
  """What a run's central actor keeps, whatever the algorithm: the events in
  the order their math ran, with wall times (seconds since the run started);
  the workers' clocks (updates so far); the budget of samples, and where each
  step ends (jaxdl.trace); each step's metric means."""

  def __init__(self, fields, observed: list[int]):
    """`fields`: the engine's slice of the config (RayFields), whose recipe
    it rebuilds the run from. `observed`: the steps at whose end the driver
    reads the state (the runner's log, evaluation and checkpoint steps); at
    others it gets the metrics alone."""
    built = fields.recipe.rebuild()
    self.observed = set(observed)
    self.algorithm, self.streams = built.algorithm, built.streams
    self.programs = EventPrograms(self.algorithm, self.streams, fields.servers)
    self.m, self.total = self.streams.num_workers, built.total_steps
    self.batch_sizes, self.global_batch = built.streams.batch_sizes, built.global_batch
    self.clocks = [0] * self.m
    self.events: list[Event] = []
    self.fetched = 0  # the events before this one are the driver's already, unchanged
    self.bytes_total = 0
    self.batch_seconds = [[0.0, 0] for _ in range(self.m)]  # per worker: sum, count
    self.done_steps, self.samples = 0, 0
    self.finished = False
    self.cpu_s = (0.0, None)  # (its own, the machine's) CPU seconds since `begin`
    self.sums, self.count, self.names = {}, 0, set()
    self.snapshots: dict[int, Any] = {}
    self.changed = asyncio.Condition()
    self.incarnation = [0] * self.m  # a worker's restarts: older calls are refused

  def identity(self) -> dict[str, Any]:
    return process_identity("server")

  def initialize(self, key_data: np.ndarray):
    """The state at step 0, from the run's key."""
    key = jax.random.wrap_key_data(np.asarray(key_data))
    self.server, workers = initial_state(self.algorithm, key, self.m)
    self.workers = [take(workers, w) for w in range(self.m)]
    return self.state()

  def begin(self, state, step: int) -> None:
    """Starts the clock; from a checkpoint's state at the end of step `step` > 0."""
    if step:
      self.restore(state, step)
    self.start, self.cpu_start = time.time(), _cpu_seconds()

  def state(self, server=None, workers=None, clocks=None):
    """The run's state, as host arrays: the server, every worker's state
    (stacked) and the workers' clocks (by default, now's)."""
    server = self.server if server is None else server
    workers = self.workers if workers is None else workers
    clocks = self.clocks if clocks is None else clocks
    return jax.device_get((server, stack(workers), np.asarray(clocks, np.int64)))

  def restore(self, state, step: int) -> None:
    """Continues from a checkpoint's state, taken at the end of step `step`."""
    self.server, workers, clocks = state
    self.workers = [take(workers, w) for w in range(self.m)]
    self.clocks = [int(c) for c in clocks]
    self.done_steps, self.samples = step, step * self.global_batch

  def _now(self) -> float:
    return time.time() - self.start

  def _stale(self, w: int, incarnation: int | None) -> bool:
    """Is this a call of worker w's process from before its restart?"""
    return incarnation is not None and incarnation != self.incarnation[w]

  def _event(self, kind: str, worker: int, **fields) -> None:
    self.events.append(Event(self._now(), kind, worker, **fields))

  async def _notify(self) -> None:
    async with self.changed:
      self.changed.notify_all()

  def _add(self, metrics: dict[str, float] | None) -> None:
    for k, v in (metrics or {}).items():
      self.sums[k] = self.sums.get(k, 0.0) + v
      self.names.add(k)
    self.count += metrics is not None

  def _update(self, w: int) -> None:
    """Counts an update of worker w ("apply" or "local"); at the end of a
    step, keeps its snapshot; ends the run after the last."""
    self.clocks[w] += 1
    self.samples += self.batch_sizes[w]
    while self.samples >= (self.done_steps + 1) * self.global_batch:
      # NaN for a step in which no gradient was computed (its updates' were
      # computed before it), as every engine reports one
      means = {k: self.sums[k] / self.count if self.count else float("nan")
               for k in self.names}
      self.sums, self.count = {}, 0
      workers = self._workers_at_end(self.done_steps) if (
          self.done_steps in self.observed) else None
      # The state's arrays as they are (immutable): stacked and copied when asked.
      self.snapshots[self.done_steps] = (self.server, workers, tuple(self.clocks), means)
      self.done_steps += 1
    self.finished = self.done_steps >= self.total
    if self.finished:  # the run's CPU seconds, read once, at its last update
      (own, machine), (own0, machine0) = _cpu_seconds(), self.cpu_start
      self.cpu_s = (own - own0, None if machine is None else machine - machine0)

  async def _snapshot(self, step: int):
    """(server, workers, clocks, metric means) at the end of step `step`,
    once it has ended and its workers' states are all there (workers: None
    at a step the driver does not read)."""
    complete = lambda: step in self.snapshots and (
        self.snapshots[step][1] is None or all(x is not None for x in self.snapshots[step][1]))
    async with self.changed:
      await self.changed.wait_for(complete)
    return self.snapshots.pop(step)

  async def step(self, step: int):
    """(state, metric means) at the end of step `step`; the state is None at
    a step the driver does not read."""
    server, workers, clocks, means = await self._snapshot(step)
    return None if workers is None else self.state(server, workers, clocks), means

  async def steps(self, first: int, last: int) -> list:
    """`step` of each of the steps first, ..., last (the driver's one call for them)."""
    return [await self.step(s) for s in range(first, last + 1)]

  def _timed(self, w: int, seconds: float) -> None:
    """Counts a batch of worker w that took `seconds` to compute."""
    self.batch_seconds[w][0] += seconds
    self.batch_seconds[w][1] += 1

  def trace(self, have: int = 0) -> tuple[int, list[Event], int, list, tuple, bool]:
    """The events the driver lacks, that already has the first `have`: (the
    index of the first sent, the events from there; the driver's from there
    on are replaced), bytes sent, mean seconds per batch per worker (None:
    none yet), the CPU seconds of this actor and of its machine until the
    last update, and whether the run is over (nothing more will change)."""
    start, self.fetched = min(have, self.fetched), len(self.events)
    means = [total / n if n else None for total, n in self.batch_seconds]
    return start, self.events[start:], self.bytes_total, means, self.cpu_s, self.finished
