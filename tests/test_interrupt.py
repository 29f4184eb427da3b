"""An interrupted `jaxdl compare` leaves no process behind: Ctrl-C (SIGINT),
SIGTERM and a SIGKILL of compare's process alone each end its pool processes
(and multiprocessing's resource tracker) within seconds, and a rerun reuses
the cells that finished."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import jaxdl_command
from tests import marks

# Two training cells long enough to be running when the signal comes, and
# their timing cells (dry runs), which finish before it in the third job.
ARGS = ["compare", "--algorithms", "asp", "ar_sgd", "--workers", "2", "--steps", "100000",
        "--model", "mlp", "--no-progress", "--no-report", "--jobs", "3"]


def _descendants(pid: int) -> set[int]:
  children = {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
  return children.union(*(_descendants(c) for c in children if Path(f"/proc/{c}").exists()))


def _alive(pid: int) -> bool:
  try:
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
  except (FileNotFoundError, IndexError):
    return False


def _statuses(out: Path) -> dict:
  try:
    return {name: cell["status"] for name, cell in
            json.loads((out / "cells.json").read_text()).items()}
  except (FileNotFoundError, json.JSONDecodeError):
    return {}


def _wait(predicate, seconds: float) -> bool:
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if predicate():
      return True
    time.sleep(0.1)
  return predicate()


@pytest.mark.parametrize("signum", [marks.slow(signal.SIGINT),
                                    signal.SIGTERM,
                                    marks.slow(signal.SIGKILL)],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_an_interrupted_compare_leaves_no_process(tmp_path, signum):
  out = tmp_path / "cmp"
  process = subprocess.Popen(jaxdl_command(*ARGS, "--out", str(out)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    timing = {"asp-m2-56gbps-timing": "done", "ar_sgd-m2-56gbps-timing": "done"}
    assert _wait(lambda: _statuses(out) == timing, 120), _statuses(out)
    children = _descendants(process.pid)
    assert len(children) >= 2  # the pool (and the resource tracker)
    process.send_signal(signum)
    _, err = process.communicate(timeout=30)
    assert _wait(lambda: not any(_alive(c) for c in children), 10), \
        [Path(f"/proc/{c}/cmdline").read_text() for c in children if _alive(c)]
  finally:
    process.kill()
    process.wait()
  if signum != signal.SIGKILL:
    assert process.returncode == 130
    assert err.strip().splitlines()[-1] == ("jaxdl compare: interrupted (finished cells are "
                                           "kept: rerun the command to run the rest)")
    assert "Traceback" not in err
  # What finished is kept for the rerun to reuse; the interrupted cells resume.
  assert _statuses(out) == timing
  assert len(list(out.glob("*-timing/summary.json"))) == 2
  assert not list(out.glob("*-m2/summary.json"))


@pytest.mark.parametrize("where", ["gc callback", "weakref callback",
                                   "gc callback appended later"])
def test_an_interrupt_during_garbage_collection_is_raised_after_it(capsys, where):
  """Python only prints an exception raised while its garbage collector
  runs (in a gc callback, jax has one; a weakref callback; a finalizer): a
  SIGTERM or Ctrl-C that lands there is raised again after it, not lost or
  printed as a traceback. So too in a callback added after jaxdl's (jax's,
  imported by a command), at the collection's end."""
  import gc
  import weakref

  from jaxdl import cli
  from jaxdl.shutdown import Collecting

  class Cycle:
    pass

  def interrupt(*args):
    signal.raise_signal(signal.SIGTERM)  # its handler runs here, during the collection
  late = where == "gc callback appended later"
  callback = lambda phase, info: interrupt() if phase == ("stop" if late else "start") else None
  previous = signal.signal(signal.SIGTERM, cli._interrupt)
  gc.callbacks[:0] = [Collecting.start] + ([callback] if where == "gc callback" else [])
  gc.callbacks.append(Collecting.stop)
  if late:
    gc.callbacks.append(callback)
  try:
    with pytest.raises(KeyboardInterrupt):
      if where == "weakref callback":
        garbage = Cycle()
        garbage.self = garbage  # freed by the collector alone
        watch = weakref.ref(garbage, interrupt)  # noqa: F841 (called as it is freed)
        del garbage
      gc.collect()
      for _ in range(2000):  # the signal again, 50 ms later
        time.sleep(0.001)
  finally:
    for cb in (Collecting.start, callback, Collecting.stop):
      if cb in gc.callbacks:
        gc.callbacks.remove(cb)
    signal.signal(signal.SIGTERM, previous)
  assert "Traceback" not in capsys.readouterr().err


def test_a_signal_in_a_finalizer_is_deferred_not_lost():
  """A finalizer run by a reference count reaching zero (an asyncio loop's
  __del__ at an interrupted compare's exit) would only print a
  KeyboardInterrupt raised in it: the handler sees it is in one."""
  import sys

  from jaxdl.shutdown import in_finalizer

  seen = []

  class Finalized:
    def __del__(self):
      seen.append(in_finalizer(sys._getframe()))

  Finalized()  # no reference kept: its __del__ runs at once
  assert seen == [True] and not in_finalizer(sys._getframe())


@pytest.mark.slow
def test_a_stopped_cell_ends_its_process(tmp_path):
  """compare's SIGTERM to a pool process running a cell ends that process
  at once: it never goes back to the pool's call queue, which the stop of
  another pool process may have left between a message's length and its
  body (a traceback instead of a stop). The pool is not shut down here, so
  only the cell's own stop can end it."""
  import concurrent.futures as futures
  import multiprocessing

  from jaxdl.compare import pool as cells
  from jaxdl.config import RunConfig

  run = tmp_path / "run"
  config = RunConfig.make(algorithm="asp", workers=2, steps=100000, model="mlp",
                          out=str(run), progress=False)
  pool = futures.ProcessPoolExecutor(1, multiprocessing.get_context("spawn"),
                                     initializer=cells._worker_init, initargs=(os.getpid(),))
  try:
    cell = pool.submit(cells._run_cell, config.to_dict())
    assert _wait(lambda: (run / "config.json").exists(), 120)
    (process,) = pool._processes.values()
    process.terminate()
    # Not join(): the pool's own thread may reap the process first, and a
    # join then returns with no exit code; the code shows once that thread
    # has stored it.
    assert _wait(lambda: process.exitcode is not None, 30)
    assert process.exitcode == 128 + signal.SIGTERM
    with pytest.raises(futures.process.BrokenProcessPool):
      cell.result(timeout=30)
  finally:
    pool.shutdown(wait=True, cancel_futures=True)


def test_a_stopped_cell_ends_its_process_though_its_cleanup_never_ends():
  """A pool process stopped with SIGTERM ends with 143 within STOP_SECONDS
  even when the cell's cleanup waits forever (a checkpoint's close on orbax's
  threads that the signal left stuck)."""
  script = """if True:
    import threading, time
    from jaxdl.compare import pool
    pool.STOP_SECONDS = 1.0
    pool._worker_init(pool.os.getppid())
    try:
      print("running", flush=True)
      time.sleep(60)
    finally:
      threading.Event().wait()  # a cleanup that never ends
  """
  process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
  try:
    assert process.stdout.readline() == "running\n"
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM
    assert time.monotonic() - start < 10
  finally:
    process.kill()
    process.wait()


def test_a_cell_stopped_during_garbage_collection_ends_at_once():
  """compare's SIGTERM to a pool process that lands in a gc callback (jax's
  runs at every collection) is not printed and lost there, leaving the cell
  running until the grace timer kills it: the process ends with 143 at
  once, nothing printed."""
  script = """if True:
    import gc, signal, time
    from jaxdl.compare import pool
    pool.STOP_SECONDS = 30.0
    pool._worker_init(pool.os.getppid())
    def callback(phase, info):  # appended after jaxdl's, as jax's is
      if phase == "start":
        gc.callbacks.remove(callback)
        signal.raise_signal(signal.SIGTERM)  # its handler runs here, in the collection
    gc.callbacks.append(callback)
    gc.collect()
    time.sleep(60)
  """
  start = time.monotonic()
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=90)
  assert done.returncode == 128 + signal.SIGTERM
  assert time.monotonic() - start < 20, "ended by the grace timer, not by the stop"
  assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_interrupted_command_exits_though_a_thread_never_ends():
  """An interrupt whose exit would wait forever on another thread (orbax's,
  after an interrupted asynchronous checkpoint) ends the process with 130
  once the grace period is over."""
  script = """if True:
    import sys, threading
    from jaxdl import cli
    cli.EXIT_GRACE_S = 1.0
    threading.Thread(target=threading.Event().wait).start()  # never ends, not a daemon
    def interrupted(argv):
      raise KeyboardInterrupt
    cli.COMMANDS["interrupted"] = interrupted
    sys.argv = ["jaxdl", "interrupted"]
    sys.exit(cli.main())
  """
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=60)
  assert done.returncode == 130
  assert done.stderr.strip().splitlines()[-1] == "jaxdl interrupted: interrupted"
