"""The processes that run a comparison's cells: a pool of spawned processes,
each running cell after cell, and how an interrupt stops them.

Ctrl-C reaches the whole process group, but only compare's process acts on
it: it stops the pool's processes (SIGTERM, then SIGKILL past STOP_SECONDS),
whose cells stay unfinished and resume from their last checkpoint on the next
run. A pool process dies with compare's process, even by SIGKILL.
"""
from __future__ import annotations

import atexit
import concurrent.futures as futures
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from jaxdl.compare.grid import Cell, Grid
from jaxdl.compare.grids import load_experiment
from jaxdl.config import RunConfig
from jaxdl.runner import run
from jaxdl.shutdown import Collecting, deferred, exit_within

# Seconds an interrupted cell has to stop cleanly before it is killed.
STOP_SECONDS = 5.0


def outcome(summary: dict) -> dict:
  """A finished cell's record in cells.json: done, or diverged and where."""
  if summary.get("status") == "diverged":
    return {"status": "diverged", "divergence": summary.get("divergence")}
  metric = summary.get("target_metric", "test_accuracy")
  return {"status": "done", metric: summary.get(metric)}


def default_jobs() -> int:
  """One process per CPU core, at most 8."""
  return max(1, min(8, len(os.sched_getaffinity(0))))


def run_cells(grid: Grid, cells: list[Cell], out: Path, jobs: int, experiment: str | None,
              started: Callable[[Cell], None], finished: Callable[[Cell, dict], None]) -> None:
  """Runs `cells` of `grid` into `out`, `jobs` at once, each in a process of
  the pool; calls `started` as a cell is handed to one, `finished` with its
  record (cells.json's). A process that dies fails its cell; a new pool runs
  the rest. An exception here (Ctrl-C, or SIGTERM through the CLI) stops
  every process before it propagates."""
  queue, pool, running = list(cells), None, {}
  try:
    while queue or running:
      if pool is None:
        pool = futures.ProcessPoolExecutor(jobs, multiprocessing.get_context("spawn"),
                                           initializer=_worker_init, initargs=(os.getpid(),))
      while queue and len(running) < jobs:
        cell = queue.pop(0)
        running[pool.submit(_run_cell, grid.config(cell, out).to_dict(), experiment)] = cell
        started(cell)
      done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
      broken = False
      for future in done:
        cell = running.pop(future)
        try:
          result = future.result()
        except futures.process.BrokenProcessPool:  # a process died: its cells fail
          result, broken = {"status": "failed", "error": "the worker process died"}, True
        finished(cell, result)
      if broken:  # a new pool for the rest
        pool.shutdown(cancel_futures=True)
        pool = None
  except BaseException:  # no cell runs on
    if pool is not None:
      _stop(pool)
      pool = None
    raise
  finally:
    if pool is not None:  # its processes end as the caller goes on (the report)
      pool.shutdown(wait=False, cancel_futures=True)


def _run_cell(config_dict: dict, experiment: str | None = None) -> dict:
  """Runs in a pool process: one cell, errors returned as text (a ConfigError
  does not survive pickling). The experiment file is loaded first, so the
  algorithms it registers exist in this process too."""
  t0 = time.perf_counter()
  try:
    if experiment:
      load_experiment(experiment)
    summary = run(RunConfig.from_dict(config_dict))
  except _Stopped as stop:
    _exit(stop.code)
  except Exception as e:  # a failed cell is reported, the others go on
    return {"status": "failed", "error": f"{type(e).__name__}: {e}".splitlines()[0],
            "traceback": traceback.format_exc(), "seconds": time.perf_counter() - t0}
  return {**outcome(summary), "seconds": time.perf_counter() - t0}


def _worker_init(parent: int) -> None:
  # Several processes on one accelerator: none may take most of its memory.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  # Ctrl-C reaches the whole process group: compare's process alone decides
  # (_stop). SIGTERM ends the running cell and its process (_exit). If
  # compare's process dies, even by SIGKILL, the kernel kills this one
  # (Linux's parent-death signal).
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, _end_cell)
  Collecting.watch()  # a SIGTERM in jax's gc callback is not lost (_end_cell)
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass  # not Linux: an interrupt still stops the pool; a SIGKILL of compare does not
  if os.getppid() != parent:  # compare died before the signal was set
    os._exit(1)


class _Stopped(SystemExit):
  """compare's SIGTERM to a pool process: its cell stops unfinished."""


def _end_cell(signum, frame) -> None:
  # An asynchronous checkpoint the cell was writing dies with its process
  # (orbax logs its thread's error at shutdown): the next run resumes from the
  # last complete one. The pool itself may send SIGTERM again (as it finds
  # itself broken), once the process is ending: that one is ignored. The
  # cell's cleanup has STOP_SECONDS: a wait on orbax's threads that the
  # signal left stuck never ends. A SIGTERM that lands in the garbage
  # collector (jax's gc callback), where _Stopped would only be printed and
  # the cell would run on, comes again out of it.
  if deferred(signum, frame):
    return
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  exit_within(STOP_SECONDS, 128 + signum)
  logging.getLogger("absl").setLevel(logging.CRITICAL)
  raise _Stopped(128 + signum)


def _exit(code: int) -> None:
  """Ends a stopped cell's process, its atexit cleanup done, without going
  back to the pool's call queue: another pool process stopped while reading
  it may have taken a message's length and left its body, and a reader after
  it would take those bytes for the next length (a traceback, not a stop)."""
  atexit._run_exitfuncs()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def _stop(pool: futures.ProcessPoolExecutor) -> None:
  """Stops the pool's processes within STOP_SECONDS: their cells stay
  unfinished (the next run resumes them from their last checkpoint)."""
  processes = list((pool._processes or {}).values())  # no public handle before 3.14
  for process in processes:
    process.terminate()
  pool.shutdown(wait=False, cancel_futures=True)
  deadline = time.monotonic() + STOP_SECONDS
  for process in processes:
    process.join(max(0.0, deadline - time.monotonic()))
  for process in processes:
    if process.is_alive():  # busy in native code (a compilation) past the deadline
      process.kill()
      process.join()
