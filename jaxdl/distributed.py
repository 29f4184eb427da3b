"""Several processes in one run: jax.distributed set-up and host-side helpers."""
from __future__ import annotations

import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxdl.errors import ConfigError


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
  jax.distributed.initialize(address, num_processes=count, process_id=index)


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
