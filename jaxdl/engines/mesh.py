"""The mesh engine: a collective algorithm in SPMD over the devices of a mesh.

M workers run on D devices, L = M / D per device: `jax.shard_map` over the
mesh axis, `jax.vmap` over each device's workers, the algorithm's collectives
over both through a `WorkerAxis`. D is the largest divisor of M not above the
number of devices, so `--workers 16` runs on 8 devices as 8 x 2. Several
processes (jax.distributed) form one mesh over all their devices; each process
feeds the batches of the workers on its own devices.
"""
from __future__ import annotations

import collections
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxdl.algorithms import Algorithm, Batch, Problem, WorkerAxis
from jaxdl.data import WorkerStreams

DEVICE_AXIS, LOCAL_AXIS = "workers", "local"


def compile_init(init, *args, out_shardings=None):
  """Compiles an initialization function once, cheaply.

  Op by op, every parameter's initializer would compile on its own; under one
  jit the random-number code still dominates compile time on CPU, and it needs
  no backend optimization: it runs once.
  """
  options = {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else {}
  jitted = jax.jit(init, out_shardings=out_shardings)
  return jitted.lower(*args).compile(compiler_options=options)


def device_count_for(num_workers: int, available: int) -> int:
  """The largest divisor of M that is at most the number of devices."""
  return max(d for d in range(1, min(num_workers, available) + 1) if num_workers % d == 0)


class MeshEngine:
  """Runs a collective algorithm's step for all workers as one SPMD program."""

  # Steps dispatched ahead of the host; bounded because many collectives in
  # flight can deadlock forced CPU devices and gloo processes (JAX-NOTES).
  MAX_IN_FLIGHT = 4

  def __init__(self, algorithm: Algorithm, problem: Problem, streams: WorkerStreams, config):
    self.algorithm, self.problem, self.streams, self.config = algorithm, problem, streams, config
    self.num_workers = m = streams.num_workers
    devices = jax.devices()
    d = device_count_for(m, len(devices))
    self.mesh = jax.make_mesh((d,), (DEVICE_AXIS,), devices=devices[:d],
                              axis_types=(jax.sharding.AxisType.Auto,))
    self.axis = WorkerAxis(size=m, device=DEVICE_AXIS, local=LOCAL_AXIS, local_size=m // d)
    self.sharded = NamedSharding(self.mesh, P(DEVICE_AXIS))
    self.replicated = NamedSharding(self.mesh, P())
    self._local_workers = self._workers_of_this_process()
    self._in_flight: collections.deque = collections.deque()

    worker_step = functools.partial(algorithm.step, problem, config, axis=self.axis)

    def device_step(states, batch, step):
      states, metrics = jax.vmap(worker_step, in_axes=(0, 0, None),
                                 axis_name=LOCAL_AXIS)(states, batch, step)
      # Metrics are shares of the global batch's mean: sum them over workers.
      return states, jax.tree.map(lambda x: jax.lax.psum(x.sum(0), DEVICE_AXIS), metrics)

    self.jitted_step = jax.jit(jax.shard_map(
        device_step, mesh=self.mesh, in_specs=(P(DEVICE_AXIS), P(DEVICE_AXIS), P()),
        out_specs=(P(DEVICE_AXIS), P()), check_vma=False),
        # Explicit, so the state comes back exactly as it went in (on one
        # device XLA would otherwise simplify some specs and force a retrace).
        out_shardings=(self.sharded, self.replicated), donate_argnums=0)
    self._evaluated = jax.jit(functools.partial(algorithm.evaluated, problem, config),
                              out_shardings=self.replicated)

  def _workers_of_this_process(self) -> np.ndarray:
    per_device = self.axis.local_size
    mine = [i for i, dev in enumerate(self.mesh.devices.flat)
            if dev.process_index == jax.process_index()]
    return np.array([i * per_device + l for i in mine for l in range(per_device)])

  def init(self, key: jax.Array):
    m, algorithm, problem, config = self.num_workers, self.algorithm, self.problem, self.config

    def init_all(key):
      return jax.vmap(lambda w: algorithm.init(problem, config, key, w, m))(jnp.arange(m))
    return compile_init(init_all, key, out_shardings=self.sharded)(key)

  def batch(self, step: int) -> Batch:
    """The global batch of `step`, each process supplying its own workers' part."""
    local = self.streams.stacked_batch(step, self._local_workers)
    position = {int(w): i for i, w in enumerate(self._local_workers)}

    def assemble(array):
      def part(index):
        workers = range(self.num_workers)[index[0]]
        return array[[position[w] for w in workers]]
      shape = (self.num_workers,) + array.shape[1:]
      return jax.make_array_from_callback(shape, self.sharded, part)
    return Batch(*map(assemble, local))

  def step(self, state, step: int):
    """Advances `state` by training step `step` (its data is a function of it)."""
    state, metrics = self.jitted_step(state, self.batch(step), jnp.int32(step))
    self._in_flight.append(metrics)
    if len(self._in_flight) > self.MAX_IN_FLIGHT:
      jax.block_until_ready(self._in_flight.popleft())
    return state, metrics

  def evaluated(self, state):
    """(params, model_state) of the evaluated model, as host arrays."""
    return jax.device_get(self._evaluated(state))

  def info(self) -> dict:
    model_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(
        jax.eval_shape(lambda: self.problem.model.init(jax.random.key(0))[0])))
    return {"engine": "mesh", "devices": self.mesh.devices.size,
            "workers_per_device": self.axis.local_size,
            "processes": jax.process_count(),
            "batch_sizes": list(self.streams.batch_sizes),
            "bytes_communicated_per_step": self.algorithm.bytes_per_step(
                self.config, model_bytes, self.num_workers)}
