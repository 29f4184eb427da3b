"""The small processes a ray run's driver starts beside Ray: the probe of a
cluster's address and token, and the watchdog of a local instance.

Each runs by path (``python -P ray_sidecar.py probe ADDRESS`` or ``watch
DRIVER_PID``), not as part of the jaxdl package: it imports the standard
library alone (the probe, Ray's client too), and starts in a fraction of a
second. The driver's side is `jaxdl.engines.ray_cluster`.
"""
from __future__ import annotations

import os
import select
import signal
import sys

JOINABLE, NO_TOKEN, REFUSED, NOT_RAY = 0, 10, 11, 12
"""The probe's exit codes: the cluster takes this machine's token (or asks
for none); token authentication is on and Ray finds no token here; the
cluster refused the token; what answers is not a Ray cluster."""

WATCH_INTERVAL_S = 0.5
"""Seconds between the watchdog's looks at the processes."""


def probe(address: str) -> int:
  """How the Ray cluster at `address` answers this machine's token, as Ray's
  own client finds it (RAY_AUTH_MODE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH,
  ~/.ray/auth_token): one of the exit codes above. Ray's messages, and the
  reason, go to stderr."""
  from ray._raylet import AuthenticationTokenLoader, GcsClient
  from ray.exceptions import AuthenticationError
  try:  # in token mode, raises where there is no token (Ray's client would abort)
    AuthenticationTokenLoader.instance().has_token()
  except AuthenticationError as e:
    print(e, file=sys.stderr)
    return NO_TOKEN
  try:
    GcsClient(address=address, cluster_id=None)  # asks the cluster for its id
  except AuthenticationError as e:
    print(e, file=sys.stderr)
    return REFUSED
  except Exception as e:  # noqa: BLE001 (whatever fails, it is not a cluster to join)
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    return NOT_RAY
  return JOINABLE


def processes() -> dict[int, tuple[int, int]]:
  """Every process's parent and start time (clock ticks after boot: a pid
  reused by a later process has another), from /proc."""
  table = {}
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat", "rb") as f:
          fields = f.read().rpartition(b")")[2].split()  # the name may hold spaces
      except OSError:  # it ended meanwhile
        continue
      table[int(name)] = (int(fields[1]), int(fields[19]))
  return table


def _add_descendants(table: dict[int, tuple[int, int]], recorded: dict[int, int]) -> None:
  """Adds to `recorded` (pid -> start time) every process in `table` that
  descends from one of it."""
  grown = True
  while grown:
    grown = False
    for pid, (parent, start) in table.items():
      if pid not in recorded and parent in recorded and parent in table and (
          table[parent][1] == recorded[parent]):
        recorded[pid] = start
        grown = True


def watch(driver: int) -> None:
  """Kills the processes of the driver's local Ray instance once the driver
  has ended, however it ended (SIGKILL included), or once it closes this
  process's stdin (it has shut Ray down: what is left goes).

  Ray's own processes (the GCS, the raylet) die with the driver, but the
  raylet's agents outlive it by a minute: they see the raylet die, then try
  to report it to the GCS, which died too. So this records Ray's processes
  while the driver lives: its children started after this process, until
  the driver writes a line (its Ray instance has started: this answers
  with one once it has recorded them), and every descendant of theirs."""
  me = os.getpid()
  table = processes()
  born, driver_start = table[me][1], table[driver][1]
  recorded: dict[int, int] = {}  # pid -> start time
  started = sealing = False
  while table.get(driver, (0, None))[1] == driver_start:
    if not started:
      recorded.update({pid: start for pid, (parent, start) in table.items()
                       if parent == driver and start >= born and pid != me})
    _add_descendants(table, recorded)
    if sealing:
      started, sealing = True, False
      sys.stdout.write("\n")
      sys.stdout.flush()
    elif select.select([sys.stdin], [], [], WATCH_INTERVAL_S)[0]:
      if not os.read(sys.stdin.fileno(), 512):  # the driver ended, or closed it
        break
      sealing = not started
    table = processes()
  table = processes()
  for pid, start in recorded.items():
    if table.get(pid, (0, None))[1] == start:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:  # it ended meanwhile
        pass


if __name__ == "__main__":
  command, argument = sys.argv[1:3]
  sys.exit(probe(argument) if command == "probe" else watch(int(argument)))
