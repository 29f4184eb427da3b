"""The ray engine's processes: a parameter server and its workers.

Each actor builds its own algorithm, model and data stream from the run's
config (and a script's task, sent once when the actor starts), and runs the
algorithm's event functions as `jaxdl.engines.events.EventPrograms`: the
programs the sim engine replays. Nothing here is algorithm math.

The server applies every push on arrival, in the order pushes really
arrive, and records each event with its wall time (seconds since the run
started); under SSP it holds a worker's pull until the slowest clock allows
it. It ends the run once the workers together have processed the budget of
samples; a push that arrives after that is dropped, as an iteration still
in flight at the end of a simulated schedule is.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import jax
import numpy as np

from jaxdl.engines.base import process_identity
from jaxdl.engines.events import EventPrograms, initial_state, one_batch, stack, take
from jaxdl.trace import Event


def _built(config, task):
  from jaxdl.build import prepare  # heavy: only in the actors' processes
  return prepare(config, task=task)


def _nbytes(tree) -> int:
  return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree)))


class Server:
  """The parameter server of a centralized algorithm (asp, ssp, dc_asgd,
  lc_asgd): an asyncio actor, one method call at a time between awaits."""

  def __init__(self, config, task):
    built = _built(config, task)
    self.algorithm, self.streams = built.algorithm, built.streams
    self.programs = EventPrograms(self.algorithm, self.streams)
    self.m, self.total = self.streams.num_workers, built.total_steps
    self.batch_sizes, self.global_batch = built.streams.batch_sizes, built.global_batch
    self.bound = self.algorithm.staleness_bound
    self.incarnation = [0] * self.m  # a worker's restarts: older calls are dropped
    self.clocks = [0] * self.m
    self.events: list[Event] = []
    self.bytes_total = 0
    self.batch_seconds = [[] for _ in range(self.m)]
    self.done_steps, self.samples, self.version = 0, 0, 0
    self.finished = False
    self.sums, self.count = {}, 0
    self.snapshots: dict[int, Any] = {}
    self.changed = asyncio.Condition()

  def identity(self) -> dict[str, Any]:
    return process_identity("server")

  def initialize(self, key_data: np.ndarray):
    """The state at step 0, from the run's key."""
    key = jax.random.wrap_key_data(np.asarray(key_data))
    self.server, workers = initial_state(self.algorithm, key, self.m)
    self.workers = [take(workers, w) for w in range(self.m)]
    return self.state()

  def warm_up(self) -> None:
    """Compiles the pull and apply programs (their results are dropped)."""
    worker = self.programs.pull(self.server, self.workers[0], np.float32(0.0))
    jax.block_until_ready(self.programs.apply(self.server, worker, np.float32(0.0)))

  def begin(self, state, step: int) -> None:
    """Starts the clock; from a checkpoint's state at the end of step `step` > 0."""
    if step:
      self.restore(state, step)
    self.start = time.time()

  def state(self, server=None, workers=None, clocks=None):
    """The run's state, as host arrays: the server, every worker's last state
    at the server (stacked) and the workers' clocks (by default, now's)."""
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
    self.version = int(sum(self.clocks))

  def _now(self) -> float:
    return time.time() - self.start

  def _event(self, kind: str, worker: int, **fields) -> None:
    self.events.append(Event(self._now(), kind, worker, **fields))

  async def _notify(self) -> None:
    async with self.changed:
      self.changed.notify_all()

  def restarted(self, w: int) -> int:
    """Worker w's process failed and was restarted: its in-flight iteration is
    dropped, and it pulls again at its clock. Its new incarnation number."""
    self.incarnation[w] += 1
    self._event("restart", w, iteration=self.clocks[w])
    return self.incarnation[w]

  async def pull(self, w: int, seconds: float, incarnation: int = 0):
    """Worker w's next pull: (its state, its iteration), or None once the run
    is over (or for a call of a worker's earlier incarnation). `seconds`: its
    last measured transfer time, the pull's duration."""
    stale = lambda: incarnation != self.incarnation[w]
    if stale():
      return None
    c = self.clocks[w]
    if self.bound is not None and min(self.clocks) < c - self.bound:
      since = self._now()
      async with self.changed:
        await self.changed.wait_for(
            lambda: self.finished or min(self.clocks) >= c - self.bound)
      if stale():
        return None
      if not self.finished and self._now() > since:
        self._event("wait", w, iteration=c, duration=self._now() - since)
    if self.finished:
      return None
    d = np.float32(seconds)
    self.workers[w] = self.programs.pull(self.server, self.workers[w], d)
    self._event("pull", w, iteration=c, version=self.version, duration=float(d))
    self.bytes_total += _nbytes(self.workers[w])
    return jax.device_get(self.workers[w]), c

  async def push(self, w: int, c: int, worker, compute_s: float, transfer_s: float,
                 metrics: dict[str, float], incarnation: int = 0):
    """Applies worker w's iteration c on arrival, then serves its next pull."""
    if self.finished or incarnation != self.incarnation[w]:
      return None
    self.bytes_total += _nbytes(worker)
    d = np.float32(compute_s)
    self.server, self.workers[w] = self.programs.apply(self.server, worker, d)
    self.version += 1
    self._event("apply", w, iteration=c, version=self.version, duration=float(d))
    self.batch_seconds[w].append(compute_s)
    for k, v in metrics.items():
      self.sums[k] = self.sums.get(k, 0.0) + v
    self.count += 1
    self.clocks[w] += 1
    self.samples += self.batch_sizes[w]
    while self.samples >= (self.done_steps + 1) * self.global_batch:
      # The state's arrays as they are (immutable): stacked and copied when asked.
      means = {k: v / self.count for k, v in self.sums.items()}
      self.snapshots[self.done_steps] = (self.server, tuple(self.workers),
                                         tuple(self.clocks), means)
      self.sums, self.count = {}, 0
      self.done_steps += 1
    self.finished = self.done_steps >= self.total
    await self._notify()
    return None if self.finished else await self.pull(w, transfer_s, incarnation)

  async def step(self, step: int):
    """(state, metric means) at the end of step `step`, once it has ended."""
    async with self.changed:
      await self.changed.wait_for(lambda: step in self.snapshots)
    *state, means = self.snapshots.pop(step)
    return self.state(*state), means

  def trace(self) -> tuple[list[Event], int, list[list[float]], bool]:
    """The events so far, bytes sent, seconds per batch per worker, and
    whether the run is over (nothing more will change)."""
    return self.events, self.bytes_total, self.batch_seconds, self.finished


class Worker:
  """A worker: pulls, computes on what it pulled, pushes; until the server
  says the run is over."""

  def __init__(self, config, task, worker: int, server):
    built = _built(config, task)
    self.w, self.server, self.streams = worker, server, built.streams
    self.programs = EventPrograms(built.algorithm, built.streams)

  def identity(self) -> dict[str, Any]:
    return process_identity(f"worker {self.w}")

  def warm_up(self, state) -> None:
    """Compiles the gradient's program on the first batch (the result is dropped)."""
    jax.block_until_ready(self.programs.compute(state, one_batch(self.streams, self.w, 0)))

  def run(self, incarnation: int = 0) -> int:
    """Works until the run is over; the number of iterations it pushed.
    `incarnation`: how many times this worker's process was restarted."""
    import ray
    pushed, t = 0, time.perf_counter()
    reply = ray.get(self.server.pull.remote(self.w, 0.0, incarnation))
    while reply is not None:
      transfer = time.perf_counter() - t
      state, c = reply
      t = time.perf_counter()
      state, shares = self.programs.compute(state, one_batch(self.streams, self.w, c))
      state = jax.block_until_ready(state)
      compute = time.perf_counter() - t
      t = time.perf_counter()
      reply = ray.get(self.server.push.remote(
          self.w, c, jax.device_get(state), compute, transfer,
          self.programs.means(self.w, jax.device_get(shares)), incarnation))
      pushed += 1
    return pushed
