"""What each ray actor does for its own process, whatever its role.

An actor gets the ray engine's slice of the config (`RayFields`), and
builds its own algorithm, model and data stream from the run's recipe
there (the config and a script's task, sent once when the actor starts:
`fields.recipe.rebuild()`). A worker may put its threads on one core
(--pin-workers: `pin`). With --compute-time every worker emulates a device
of the simulator's cost model: it sleeps until each iteration's compute
has taken the modelled time
(`jaxdl.cluster.CostModel.compute_time(worker, iteration)`: --worker-speeds,
--jitter, stragglers; the sim engine's draws), if its real compute took
less (`emulated`, `padded`). The trace's compute durations are those padded
times.
"""
from __future__ import annotations

import os
import time

from jaxdl.engines.base import slowed
from jaxdl.engines.sim import cost_model


def emulated(fields, built):
  """The cost model whose compute times a worker emulates (--compute-time;
  `fields`: the engine's slice of the config), or None: it runs at its own
  speed. `built`: the run the worker rebuilt."""
  if fields.compute_time is None:
    return None
  return cost_model(fields, built.problem, built.streams)


def padded(cost, w: int, c: int, started: float) -> float:
  """Seconds of worker w's compute for its iteration c, begun at `started`
  (time.perf_counter()), padded to the simulator's compute_time(w, c) (its
  speed, jitter and stragglers: the same draws) if `cost` is not None."""
  return slowed(time.perf_counter() - started, None if cost is None else cost.compute_time(w, c))


def pin(fields, worker: int) -> None:
  """With --pin-workers (`fields`: the engine's slice of the config), puts
  every thread of this process (those XLA starts later too) on one core:
  worker w's, w mod the cores it may use (Linux)."""
  if not fields.pin_workers or not hasattr(os, "sched_setaffinity"):
    return
  cores = sorted(os.sched_getaffinity(0))
  core = {cores[worker % len(cores)]}
  for thread in os.listdir("/proc/self/task"):
    try:
      os.sched_setaffinity(int(thread), core)
    except OSError:  # a thread that has just ended
      pass
