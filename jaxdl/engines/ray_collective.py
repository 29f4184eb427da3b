"""The processes of a collective algorithm's run on ray (bsp, ar_sgd,
local_sgd): `Process`, joined by jax.distributed and running the mesh
engine's step; `OwnProgramsProcess`, one worker's share of the step, meeting the
others' collectives at an exchange actor (--partition, --compute-time).
"""
from __future__ import annotations

import socket as sockets
import time
from typing import Any

import jax
import numpy as np

from jaxdl.distributed import host_copy
from jaxdl.engines.base import process_identity
from jaxdl.engines.mesh import MeshEngine
from jaxdl.engines.own_programs import ProgramWorker


class Process:
  """One process of a collective algorithm's run (bsp, ar_sgd, local_sgd):
  a jax.distributed process with one device and one worker, running the
  mesh engine's step (the algorithm's own, its collectives across the
  processes) in step with the others."""

  def __init__(self, fields, index: int, count: int):
    """`fields`: the engine's slice of the config (RayFields), whose recipe
    it rebuilds the run from once it has joined the others."""
    self.fields, self.index, self.count = fields, index, count

  def identity(self) -> dict[str, Any]:
    return process_identity(f"worker {self.index}")

  def address(self) -> str:
    """Process 0: a free address on its host for the processes' coordinator."""
    import ray
    host = ray.util.get_node_ip_address()
    with sockets.socket() as s:
      s.bind((host, 0))
      return f"{host}:{s.getsockname()[1]}"

  def join(self, address: str, timeout_s: float) -> None:
    """Joins the run's other processes at `address`, then builds the engine."""
    jax.distributed.initialize(address, num_processes=self.count, process_id=self.index,
                               initialization_timeout=max(1, round(timeout_s)),
                               coordinator_bind_address=address if self.index == 0 else None)
    built = self.fields.recipe.rebuild()
    # (the workers' models each on one device: the ray engine splits none)
    self.engine = MeshEngine(built.algorithm, built.problem, built.streams)

  def init(self, key_data: np.ndarray) -> None:
    """The state at step 0, from the run's key; and the step compiled and run
    once on a copy of it, its result dropped (with the others: it is a
    collective), so that no step's time holds its compile or its first run,
    which is not a steady one."""
    self.state = self.engine.init(jax.random.wrap_key_data(np.asarray(key_data)))
    jax.block_until_ready(self.engine.step(jax.tree.map(lambda x: x.copy(), self.state), 0))

  def begin(self, state) -> None:
    """Continues from a checkpoint's state (host arrays)."""
    put = lambda x, s: jax.make_array_from_callback(np.shape(x), s, lambda i: np.asarray(x)[i])
    shardings = jax.tree.map(lambda x: x.sharding, self.state)
    self.state = jax.tree.map(put, state, shardings)

  def step(self, step: int, gather: bool):
    """Takes step `step` with the others: (its seconds from this call to the
    step's end; on process 0, the metrics and the state as host arrays if
    `gather`: gathering is a collective, all take part)."""
    start = time.perf_counter()
    self.state, metrics = self.engine.step(self.state, step)
    metrics, state = host_copy((metrics, self.state if gather else None))
    return time.perf_counter() - start, (metrics, state) if self.index == 0 else None

  def state(self):
    """The state as host arrays, on process 0 (a collective: all take part)."""
    state = host_copy(self.state)
    return state if self.index == 0 else None


class OwnProgramsProcess(ProgramWorker):
  """A `ProgramWorker` as a process of its own (--engine ray): it builds its
  algorithm and data stream from the recipe of its slice of the config
  (`fields`), and meets the other workers' collectives at the run's
  exchange actor, found by its name."""

  def __init__(self, fields, worker: int, exchange: str):
    import ray
    built = fields.recipe.rebuild()
    actor = ray.get_actor(exchange)
    meet = lambda op, key, w, leaves: ray.get(actor.collective.remote(op, key, w, leaves))
    super().__init__(fields, built.algorithm, built.problem, built.streams, worker, meet)

  def identity(self) -> dict[str, Any]:
    return process_identity(f"worker {self.w}")
