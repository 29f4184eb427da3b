"""Synchronous schedules: BSP at a parameter server, AR-SGD's ring
all-reduce and local SGD, a loop over global steps, each step's workers
meeting at a barrier (local SGD's every `period` steps)."""
from __future__ import annotations

import numbers
from typing import Callable

from jaxdl.cluster.cost import CostModel
from jaxdl.cluster.network import Network
from jaxdl.cluster.schedule import Schedule, _check
from jaxdl.trace import Event

SYNC_MODES = ("ps", "allreduce", "local")


def _check_iterations(iterations: int) -> None:
  _check("iterations", iterations, isinstance(iterations, numbers.Integral) and iterations >= 0,
         "an integer >= 0")


def synchronous(cost: CostModel, iterations: int, mode: str = "allreduce",
                period: int = 1, partitioner=None) -> Schedule:
  """BSP ("ps"), AR-SGD ("allreduce") or local SGD ("local", every `period` steps).

  One "step" event per global step, and a "wait" event for each worker idle at
  a barrier: from the end of its compute until the last worker's gradient is
  at the server ("ps") or until the slowest worker finishes ("allreduce").
  With compressed messages (`cost.message_bytes`), a push carries one and an
  all-reduce is an all-gather of them (`CostModel.allreduce`).

  `partitioner` (jaxdl.partition.Partitioner): the global batch's split
  changes during the run; a worker's compute time scales with its batch
  size (the cost model's times are for the sizes at step 0), the
  partitioner sees each step's times and a "partition" event records each
  new split, before the first step that uses it.
  """
  _check_iterations(iterations)
  _check("sync_mode", mode, mode in SYNC_MODES, "one of " + ", ".join(SYNC_MODES))
  _check("communication_period", period, isinstance(period, numbers.Integral) and period >= 1,
         "an integer >= 1 (local steps between averagings)")
  times = _partitioned(cost, partitioner)
  if mode == "ps":
    return _bsp(cost, iterations, times)
  m, clock, events, seconds = cost.num_workers, [0.0] * cost.num_workers, [], []
  (ring, round_bytes), rounds = cost.allreduce(), 0
  period = period if mode == "local" else 1
  for g in range(iterations):
    seconds.append(times(g, max(clock), events, seconds))
    clock = [t + s for t, s in zip(clock, seconds[-1])]
    if (g + 1) % period:  # local SGD between averagings: no barrier
      events.append(Event(max(clock), "step", -1, iteration=g))
      continue
    barrier = max(clock)
    events.extend(Event(barrier, "wait", w, iteration=g, duration=barrier - t)
                  for w, t in enumerate(clock) if t < barrier)
    clock, rounds = [barrier + ring] * m, rounds + 1
    events.append(Event(barrier + ring, "step", -1, iteration=g))
  # Ring all-reduce: each worker sends 2(M-1)/M of the model per round (or
  # M - 1 compressed messages: cost.allreduce).
  return Schedule(events, rounds * round_bytes, (0.0,) * m, list(zip(*seconds)))


def _partitioned(cost: CostModel, partitioner) -> Callable:
  """`times(g, now, events, seconds)`: each worker's compute seconds at step
  g, after those of the steps before (`seconds`). With a partitioner, step
  g - 1's times go to it first, and a new split it makes is recorded in
  `events` at time `now`, for step g on."""
  m = cost.num_workers
  if partitioner is None:
    return lambda g, now, events, seconds: [cost.compute_time(w, g) for w in range(m)]
  initial = partitioner.sizes

  def times(g, now, events, seconds):
    if seconds:
      sizes = partitioner.observe(seconds[-1])
      if sizes is not None:
        events.append(Event(now, "partition", -1, iteration=g, sizes=sizes))
    return [cost.compute_time(w, g) * b / b0
            for w, (b, b0) in enumerate(zip(partitioner.sizes, initial))]
  return times


def _bsp(cost: CostModel, iterations: int, times: Callable) -> Schedule:
  """BSP at a parameter server: push when done, apply when all are in, pull."""
  m, net, events, seconds = cost.num_workers, Network(cost), [], []
  ready = [0.0] * m  # replicas start equal: no pull before the first step
  for g in range(iterations):
    seconds.append(times(g, max(ready), events, seconds))
    done = [r + t for r, t in zip(ready, seconds[-1])]
    # Pushes reach the shared links in the order the workers finish.
    barrier = max(net.push(w, done[w]) for w in sorted(range(m), key=lambda w: (done[w], w)))
    events.extend(Event(barrier, "wait", w, iteration=g, duration=barrier - t)
                  for w, t in enumerate(done) if t < barrier)
    events.append(Event(barrier, "step", -1, iteration=g))
    if g + 1 < iterations:  # rotate who is served first, so no worker is favoured
      for j in range(m):
        ready[(g + j) % m] = net.pull((g + j) % m, barrier)
  return Schedule(events, net.bytes_total, net.queued_s, list(zip(*seconds)))
