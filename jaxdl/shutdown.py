"""How an interrupted jaxdl process ends: within a grace period, whatever
its other threads do."""
from __future__ import annotations

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
