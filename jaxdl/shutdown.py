"""How an interrupted jaxdl process ends: its signal acted on outside the
garbage collector and finalizers (where an exception is only printed), and
within a grace period, whatever its other threads do."""
from __future__ import annotations

import gc
import os
import sys
import threading
import time


def exit_within(seconds: float, code: int) -> None:
  """Ends the process with `code` if it has not exited within `seconds`. An
  interrupt that lands while orbax starts an asynchronous checkpoint can
  leave orbax's threads waiting for a signal that never comes, and a wait
  for them (Python's exit, a checkpoint's close) would never end."""
  def end():
    time.sleep(seconds)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  threading.Thread(target=end, name="jaxdl-exit", daemon=True).start()


class Collecting:
  """Whether Python's garbage collector is running (its callbacks, weakref
  callbacks and finalizers run then, and an exception raised in them is
  only printed): set by a gc callback before every other, cleared by one
  after every other (kept last: a library imported later, jax, appends its
  own)."""
  now = False

  @staticmethod
  def start(phase: str, info) -> None:
    if phase == "start":
      Collecting.now = True
      callbacks = gc.callbacks
      if callbacks[-1] is not Collecting.stop and Collecting.stop in callbacks:
        # (the gc is at this callback, the first: moving a later one is safe)
        callbacks.remove(Collecting.stop)
        callbacks.append(Collecting.stop)

  @staticmethod
  def stop(phase: str, info) -> None:
    if phase == "stop":
      Collecting.now = False

  @staticmethod
  def watch() -> None:
    """Installs the two callbacks."""
    gc.callbacks.insert(0, Collecting.start)
    gc.callbacks.append(Collecting.stop)

  @staticmethod
  def unwatch() -> None:
    for callback in (Collecting.start, Collecting.stop):
      if callback in gc.callbacks:
        gc.callbacks.remove(callback)


def in_finalizer(frame) -> bool:
  """Whether `frame` runs inside a `__del__` (a finalizer that a reference
  count reaching zero ran, outside the garbage collector)."""
  while frame is not None:
    if frame.f_code.co_name == "__del__":
      return True
    frame = frame.f_back
  return False


def deferred(signum: int, frame) -> bool:
  """For a signal handler: True where the signal landed in the garbage
  collector or a finalizer (which would only print the handler's exception
  and go on, e.g. in jax's gc callback or an asyncio loop's __del__); the
  same signal comes again, shortly, out of it. Collecting.watch() must be
  installed for the collector's case."""
  if Collecting.now or in_finalizer(frame):
    threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
    return True
  return False
