"""Several processes in one run: jax.distributed set-up and host-side helpers."""
from __future__ import annotations

import math
import os
import socket
import sys
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxdl.errors import ConfigError


def check(cfg) -> None:
  """The processes' flags, with or without a coordinator: --num-processes
  >= 1, --process-id an index among them, --coordinator-timeout > 0."""
  count, index = cfg.num_processes, cfg.process_id
  if count is not None and count < 1:
    raise ConfigError("num_processes", count, "an integer >= 1, or unset")
  if index is not None and (index < 0 or (count is not None and index >= count)):
    raise ConfigError("process_id", index, f"an index in [0, {count}), or unset"
                      if count else "an integer >= 0, or unset")
  if not (math.isfinite(cfg.coordinator_timeout) and cfg.coordinator_timeout > 0):
    raise ConfigError("coordinator_timeout", cfg.coordinator_timeout, "seconds > 0")
  if cfg.reduce not in ("host", "device"):
    raise ConfigError("reduce", cfg.reduce, "host or device")


def initialize(cfg) -> None:
  """Joins the processes of a multi-host run, from flags or the environment.

  With no coordinator address (flag or JAX_COORDINATOR_ADDRESS) the run is one
  process and nothing happens. Must run before JAX touches a device.
  """
  address = cfg.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if not address or jax.distributed.is_initialized():
    return
  count = cfg.num_processes or _env_int("JAX_NUM_PROCESSES", "num_processes")
  index = cfg.process_id if cfg.process_id is not None else _env_int("JAX_PROCESS_ID",
                                                                     "process_id")
  if not 0 <= index < count:
    raise ConfigError("process_id", index, f"an index in [0, {count})")
  check(cfg)
  if count > 1:
    print(f"process {index} of {count}: waiting up to {cfg.coordinator_timeout:g} s for the "
          f"others at {address}", file=sys.stderr)
    rendezvous(address, count, index, cfg.coordinator_timeout)
  jax.distributed.initialize(address, num_processes=count, process_id=index,
                             initialization_timeout=max(1, round(cfg.coordinator_timeout)))


def rendezvous(address: str, count: int, index: int, timeout: float) -> None:
  """Returns once all `count` processes have reached the coordinator's
  address, or raises the ConfigError that says how many did within `timeout`
  seconds. jax.distributed itself would abort the process (a C++ check
  failure) after minutes: this happens first, on the same port, which
  process 0 listens on until every other process has answered."""
  host, _, port_text = address.rpartition(":")
  if not host or not port_text.isdigit():
    raise ConfigError("coordinator_address", address, "host:port")
  port, deadline = int(port_text), time.monotonic() + timeout

  def late(what: str) -> ConfigError:
    return ConfigError("coordinator_address", address,
                       f"the address of process 0 that all {count} processes reach within "
                       f"--coordinator-timeout {timeout:g} s; {what} (start every process, "
                       "or run without --coordinator-address and --num-processes)")

  if index == 0:
    try:
      server = socket.create_server(("", port))
    except OSError as e:
      raise ConfigError("coordinator_address", address, f"a free port on this host ({e})")
    peers = []
    with server:
      while len(peers) < count - 1:
        remaining = deadline - time.monotonic()
        try:
          if remaining <= 0:
            raise TimeoutError
          server.settimeout(remaining)
          peers.append(server.accept()[0])
        except TimeoutError:
          raise late(f"{len(peers)} of the other {count - 1} came") from None
      for peer in peers:
        with peer:
          peer.sendall(b"go")
          peer.settimeout(max(1.0, deadline - time.monotonic()))
          try:
            peer.recv(1)  # the peer closes first: the port is free again at once
          except OSError:
            pass
    return
  while True:
    try:
      peer = socket.create_connection((host, port), timeout=1.0)
      break
    except OSError:
      if time.monotonic() > deadline:
        raise late(f"process {index} found no process 0 there") from None
      time.sleep(0.2)
  with peer:
    peer.settimeout(max(1.0, deadline - time.monotonic()))
    try:
      answer = peer.recv(2)
    except OSError:
      answer = b""
  if answer != b"go":
    raise late(f"process {index} reached it, but process 0 gave up waiting")


def _env_int(variable: str, field: str) -> int:
  value = os.environ.get(variable)
  if value is None or not value.isdigit():
    raise ConfigError(field, value, f"an integer, from --{field.replace('_', '-')} or "
                      f"{variable}, with a coordinator address")
  return int(value)


def is_main() -> bool:
  """Whether this process writes the run directory (process 0)."""
  return jax.process_index() == 0


def host_copy(tree):
  """The tree's arrays as numpy on this host; arrays spread over processes are
  gathered (a collective: every process must call it)."""
  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
      return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.tree.map(one, tree)


def worker_devices(names, count: int) -> list:
  """Each of `count` workers' device: `names` (--worker-devices, e.g. gpu
  cpu cpu or cpu:1; a platform and an index among its devices, 0 if none
  given), or unset: worker w on the default backend's device w mod its
  devices."""
  if names is not None and len(names) != count:
    raise ConfigError("worker_devices", tuple(names), f"{count} devices, one per worker")
  if names is None:
    devices = jax.devices()
    return [devices[w % len(devices)] for w in range(count)]
  out = []
  for name in names:
    platform, _, index = name.partition(":")
    try:
      available = jax.devices(platform)
      out.append(available[int(index or 0)])
    except (RuntimeError, ValueError, IndexError):
      raise ConfigError("worker_devices", tuple(names),
                        f"one device per worker, each PLATFORM[:INDEX] of this process's "
                        f"devices ({', '.join(sorted({d.platform for d in jax.devices()}))}"
                        f"{', cpu' if jax.default_backend() != 'cpu' else ''}): {name!r} "
                        "is not one") from None
  return out
