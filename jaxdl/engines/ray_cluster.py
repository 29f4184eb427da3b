"""Where a ray run's processes live: a cluster joined with its token, or a
local instance whose processes end with the driver.

Joining `--ray-address HOST:PORT` turns Ray's token authentication on
(RAY_AUTH_MODE=token) unless the user set RAY_AUTH_MODE. Before Ray joins
(which retries a refused token for 20 s, printing a line a second), a
probe asks the cluster once: a missing or refused token, or an address that
answers but is not a Ray cluster, is one line naming what to fix, with
Ray's own messages in a log file that the line names.

While a run is on a joined cluster, a thread watches its head (`HeadWatch`):
once the head's GCS has accepted no connection for HEAD_TIMEOUT_S (its
machine or its GCS went down), the run cannot go on, and the driver ends
with one line rather than wait on Ray's calls (Ray's client waits 60 s for
the GCS, then aborts the process).

A local instance's processes end with the driver however it ends: a
watchdog process (`jaxdl.engines.ray_sidecar`) kills those that would
outlive it.
"""
from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import ClassVar

from jaxdl.engines import ray_sidecar
from jaxdl.errors import ConfigError

ADDRESS_HELP = "the address HOST:PORT of a running Ray cluster (`ray start --head`)"
AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_HELP = ("the head's token (`ray get-auth-token` there prints it) in ~/.ray/auth_token "
              "(readable by you only), in a file named by RAY_AUTH_TOKEN_PATH, or in "
              "RAY_AUTH_TOKEN")
ACK_TIMEOUT_S = 60.0
"""Seconds the watchdog may take to record a local instance's processes."""
PROBE_TIMEOUT_S = 60.0
"""Seconds the probe may take (Ray's client gives up on a silent address in 35)."""

HEAD_TIMEOUT_S = 10.0
"""Seconds a joined cluster's head may accept no connection before the run ends."""
HEAD_PROBE_S = 1.0
"""Seconds between two connections to the head, and the most one may take."""
HEAD_LOST = 1
"""The exit code of a driver whose cluster's head stopped answering."""

# An HTTP/2 client's first bytes, then an empty SETTINGS frame: a gRPC server
# (a Ray cluster's GCS) answers with a SETTINGS frame of its own.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
SETTINGS = 4


def check_address(address: str, timeout: float = 5.0) -> None:
  """A ConfigError unless a Ray cluster at HOST:PORT takes this machine's
  token (or asks for none); sets RAY_AUTH_MODE=token where it is unset."""
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise ConfigError("ray_address", address, ADDRESS_HELP)
  _check_answers(address, (host, int(port)), timeout)
  if os.environ.get(AUTH_MODE) is None:
    os.environ[AUTH_MODE] = "token"
    if "ray" in sys.modules:  # Ray reads its configuration when imported: again
      from ray._raylet import Config
      Config.initialize("")
  _check_token(address)


def own_node(address: str) -> str | None:
  """The address of the Ray node on this machine that a driver joining the
  cluster at `address` (HOST:PORT) attaches to: this machine's address on
  the way there, where a raylet here runs with it; None: Ray's own choice,
  the first raylet it finds here (the head's, if one is). Where one machine
  holds several nodes (a cluster of network namespaces, whose raylets are
  all seen), Ray's choice may be a node whose address this process does
  not have, where no actor's reply reaches it."""
  host, _, port = address.rpartition(":")
  try:
    family, _, _, _, where = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as route:  # sends nothing
      route.connect(where)
      here = route.getsockname()[0]
  except OSError:
    return None
  from ray._private import services
  return here if here in services._find_address_from_flag("--node_ip_address") else None


def _check_answers(address: str, where: tuple[str, int], timeout: float) -> None:
  """Something listens at `where` and speaks HTTP/2, as a Ray cluster's GCS
  does (given a silent address, Ray's client retried for 14 minutes and
  more)."""
  try:
    with socket.create_connection(where, timeout=timeout) as connection:
      if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return  # Ray's TLS: the probe finds out
      connection.sendall(HTTP2_PREFACE)
      head = b""
      while len(head) < 9:  # a frame's header: length (3), type, flags, stream (4)
        received = connection.recv(9 - len(head))
        if not received:
          break
        head += received
  except socket.timeout:
    head = b""
  except OSError as e:
    raise ConfigError("ray_address", address,
                      f"{ADDRESS_HELP}; nothing answers there ({e})") from None
  if len(head) < 9 or head[3] != SETTINGS:
    raise ConfigError("ray_address", address, f"{ADDRESS_HELP}; what answers there is not "
                      "one (it does not speak gRPC, as a Ray cluster's GCS does)")


def _check_token(address: str) -> None:
  """The probe's answer, as a ConfigError naming the token, where the
  cluster cannot be joined; Ray's messages stay in a log file."""
  fd, log = tempfile.mkstemp(prefix="jaxdl-ray-", suffix=".log")
  with os.fdopen(fd, "w") as stream:
    try:
      code = subprocess.run([sys.executable, "-P", ray_sidecar.__file__, "probe", address],
                            stdin=subprocess.DEVNULL, stdout=stream, stderr=stream,
                            timeout=PROBE_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
      code = ray_sidecar.NOT_RAY
  if code == ray_sidecar.JOINABLE:
    os.remove(log)
    return
  mode = os.environ[AUTH_MODE]
  if code == ray_sidecar.NO_TOKEN:
    why = f"token authentication is on ({AUTH_MODE}={mode}) and Ray finds no token here"
  elif code == ray_sidecar.REFUSED and mode.lower() != "token":
    why = f"the cluster asks for a token and {AUTH_MODE}={mode} sends none: unset it"
  elif code == ray_sidecar.REFUSED:
    why = f"the cluster refused the token {_token_source()}"
  else:
    what = "is not one" if code == ray_sidecar.NOT_RAY else f"could not be asked (code {code})"
    raise ConfigError("ray_address", address,
                      f"{ADDRESS_HELP}; what answers there {what} (Ray's messages: {log})")
  raise ConfigError("ray_address", address,
                    f"a Ray cluster that takes this machine's token: {why}; give it "
                    f"{TOKEN_HELP} (Ray's messages: {log})")


def _token_source() -> str:
  """Where Ray's client takes its token from, in Ray's order."""
  if os.environ.get("RAY_AUTH_TOKEN"):
    return "in RAY_AUTH_TOKEN"
  if os.environ.get("RAY_AUTH_TOKEN_PATH"):
    return f"in {os.environ['RAY_AUTH_TOKEN_PATH']} (RAY_AUTH_TOKEN_PATH)"
  return "in ~/.ray/auth_token"


class Watchdog:
  """A process (`ray_sidecar.watch`) that kills this process's local Ray
  instance once this process ends, however it ends: started before Ray,
  told when Ray has started (`started`), and stopped after Ray's own
  shutdown (`stop`: it kills what is left, and ends). Linux only (it reads
  /proc); elsewhere it does nothing."""
  active: ClassVar[Watchdog | None] = None
  """The watchdog of the local instance running now."""

  def __init__(self):
    self.process = None
    if os.path.isdir("/proc"):
      # its own session: a Ctrl-C at the terminal does not reach it
      self.process = subprocess.Popen(
          [sys.executable, "-P", ray_sidecar.__file__, "watch", str(os.getpid())],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)

  def started(self) -> None:
    """Ray's processes have started: later children of this process are not
    Ray's. Returns once the watchdog has recorded them."""
    if self.process is not None:
      try:
        self.process.stdin.write(b"started\n")
        self.process.stdin.flush()
      except BrokenPipeError:  # it has ended: the instance runs unwatched, as Ray starts it
        pass
      if select.select([self.process.stdout], [], [], ACK_TIMEOUT_S)[0]:
        self.process.stdout.readline()
    if Watchdog.active is not None:  # an earlier instance's, shut down meanwhile
      Watchdog.active.stop()
    Watchdog.active = self

  def stop(self, timeout: float = 30.0) -> None:
    """Kills what is left of the instance, once Ray has shut it down."""
    if self.process is not None:
      self.process.communicate(timeout=timeout)  # closes its stdin, waits for its end
      self.process = None
    if Watchdog.active is self:
      Watchdog.active = None


class HeadWatch:
  """A thread that ends this process, with one line on stderr and exit code
  HEAD_LOST, once the head of the cluster it joined (its GCS at `address`,
  HOST:PORT) has accepted no connection for HEAD_TIMEOUT_S: every Ray call
  would otherwise wait for it (a minute, then Ray aborts the process). What
  the run wrote stays: `--resume` continues it from its last checkpoint on
  a cluster that runs."""

  def __init__(self, address: str):
    host, _, port = address.rpartition(":")
    self.address, self.where = address, (host, int(port))
    self.answered = time.monotonic()
    self.ending = threading.Lock()  # one line, from one thread
    self.stopped = threading.Event()
    self.thread = threading.Thread(target=self._watch, name="jaxdl-head-watch", daemon=True)
    self.thread.start()

  def _watch(self) -> None:
    while not self.stopped.wait(HEAD_PROBE_S):
      self._answers()

  def _answers(self) -> bool:
    """Whether the head accepts a connection now; ends this process if it
    has accepted none for HEAD_TIMEOUT_S."""
    try:
      socket.create_connection(self.where, timeout=HEAD_PROBE_S).close()
      self.answered = time.monotonic()
      return True
    except OSError:
      if time.monotonic() - self.answered > HEAD_TIMEOUT_S and self.ending.acquire():
        sys.stdout.flush()
        print(f"jaxdl: error: the Ray cluster's head at {self.address} has accepted no "
              f"connection for {HEAD_TIMEOUT_S:g} s (its machine or its GCS is down): the run "
              "ends; --resume continues it from its last checkpoint on a running cluster "
              "(--ray-address)", file=sys.stderr, flush=True)
        os._exit(HEAD_LOST)
      return False

  def settle(self) -> None:
    """Returns once the head answers; ends this process if it does not
    within HEAD_TIMEOUT_S of its last answer (a run that failed as its head
    went down ends with the same line, not with the error of a Ray call)."""
    while not self._answers():
      time.sleep(HEAD_PROBE_S)

  def stop(self) -> None:
    self.stopped.set()
    self.thread.join()
