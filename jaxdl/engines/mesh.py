"""The mesh engine: a collective algorithm in SPMD over the devices of a mesh.

(Where the workers' shares of the batch differ in time, --partition
proportional or adaptive, --compute-time, --worker-devices: each worker runs
its own program in a thread of this process instead, jaxdl.engines.own_programs.)

M workers run on D devices, L = M / D per device: `jax.shard_map` over the
mesh axis, `jax.vmap` over each device's workers, the algorithm's collectives
over both through a `WorkerAxis`. D is the largest divisor of M not above the
number of devices, so `--workers 16` runs on 8 devices as 8 x 2. Several
processes (jax.distributed) form one mesh over all their devices; each process
feeds the batches of the workers on its own devices.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compilation_cache.compilation_cache import reset_cache
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxdl import distributed
from jaxdl.algorithms import Batch, Collective, Problem, WorkerAxis
from jaxdl.data import Streams
from jaxdl.engines import base
from jaxdl.engines.base import runs_own_programs
from jaxdl.engines.own_programs import MeshOwnPrograms, OwnProgramsFields
from jaxdl.errors import ConfigError
from jaxdl.parallel.pipeline import STAGE_AXIS, bubble_fraction, stage_seconds
from jaxdl.parallel.tensor import TENSOR_AXIS, dim_spec, indivisible, leaf_dims
from jaxdl.trace import Event

DEVICE_AXIS, LOCAL_AXIS = "workers", "local"


def device_count_for(num_workers: int, available: int) -> int:
  """The largest divisor of M that is at most the number of devices."""
  return max(d for d in range(1, min(num_workers, available) + 1) if num_workers % d == 0)


@contextlib.contextmanager
def outside_persistent_cache():
  """Compiles inside neither read nor write JAX's persistent compilation
  cache. A pipelined step's XLA CPU executable loaded from that cache
  crashed (a segfault in XLA's runtime, at the step's second call) in 15 of
  75 runs (jax 0.10.2, the ViT in 2 stages under local SGD), where compiled
  afresh it never did (0 of 28): a pipelined engine compiles its step here.
  (JAX reads the flag once per process, hence the resets; a compile in
  another thread meanwhile skips the cache too.)"""
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
    reset_cache()


def in_rows(spec: P) -> P:
  """A worker's leaf's `spec` for the leaf in rows (worker w's rows w s0 ...
  (w + 1) s0 - 1 of one array): its first dimension split over the workers
  first, then as `spec` splits it."""
  first = spec[0] if len(spec) else None
  return P(DEVICE_AXIS if first is None else (DEVICE_AXIS, first), *spec[1:])


class MeshState(NamedTuple):
  step: jax.Array  # int32: steps taken (replicated)
  workers: Any     # every worker's algorithm state, in rows (see MeshEngine)


@dataclasses.dataclass(frozen=True)
class MeshFields(OwnProgramsFields):
  """The config fields the mesh engine reads: a real engine's (its own programs'
  OwnProgramsFields), --workers and --sync-bn (checked against a model
  over several devices) and that model's layout."""
  workers: int
  sync_bn: bool
  parallelism: str
  stages: int
  microbatches: int
  tensor_parallel: int


class MeshEngine(base.LocalProcess):
  """Runs a collective algorithm's step for all workers as one SPMD program."""
  name = "mesh"
  families = (Collective,)
  fields = MeshFields
  own_fields = {
      "worker_devices": "it places each synchronous worker on a device of this process",
      "parallelism": "a worker's model over several devices: its stages or its layers' shardings",
  }
  placement = frozenset({"worker_devices"})

  @classmethod
  def check(cls, fields: MeshFields, spec) -> None:
    base.check_emulation(cls, fields)
    base.check_reduce(fields, spec, own_programs=True)
    if fields.worker_devices is not None:  # each names a device of this process
      distributed.worker_devices(fields.worker_devices, fields.workers)
    parallelism = fields.parallelism
    if parallelism != "data" and (runs_own_programs(fields) or fields.sync_bn):
      raise ConfigError("parallelism", parallelism, "data with --partition, --compute-time, "
                        "--worker-devices or --sync-bn (a model over several devices is one "
                        "SPMD program)")

  # Steps dispatched ahead of the host; bounded because many collectives in
  # flight can deadlock forced CPU devices and gloo processes (JAX-NOTES).
  MAX_IN_FLIGHT = 4

  def __new__(cls, algorithm: Collective, problem: Problem, streams: Streams,
              fields: MeshFields | None = None, *args, **kwargs):
    if fields is not None and runs_own_programs(fields):
      # each worker its own program, on its own share and device (jaxdl.engines.own_programs)
      return MeshOwnPrograms(algorithm, problem, streams, fields, *args, **kwargs)
    return super().__new__(cls)

  def __init__(self, algorithm: Collective, problem: Problem, streams: Streams,
               fields: MeshFields | None = None, total_steps: int | None = None):
    """`fields` None: each worker's model on one device (--parallelism data),
    the step one SPMD program (another engine's layout of the workers)."""
    del total_steps  # a step is a step: nothing to plan ahead
    self.algorithm, self.problem, self.streams = algorithm, problem, streams
    self.num_workers = m = streams.num_workers
    devices = jax.devices()
    # --parallelism pipeline: each worker's model over a row of p devices
    # (jaxdl.parallel.pipeline), one worker per row; --parallelism tensor: each
    # worker's weights sharded over a row of k devices (jaxdl.parallel.tensor)
    parallelism = fields.parallelism if fields is not None else "data"
    self.stages = p = fields.stages if parallelism == "pipeline" else 1
    self.microbatches = fields.microbatches if p > 1 else 1
    self.tensor = k = fields.tensor_parallel if parallelism == "tensor" else 1
    row = max(p, k)  # a worker's devices
    d = m if row > 1 else device_count_for(m, len(devices))
    second = (STAGE_AXIS,) if p > 1 else (TENSOR_AXIS,) if k > 1 else ()
    names = (DEVICE_AXIS, *second)
    self.mesh = jax.make_mesh((d, row)[:len(names)], names, devices=devices[:d * row],
                              axis_types=(jax.sharding.AxisType.Auto,) * len(names))
    per_device = m // d
    # On one device the step is a plain jit: no collective over a one-device
    # axis, and the same program (and bits) as the algorithm's step jitted by hand.
    self.axis = WorkerAxis(size=m, device=DEVICE_AXIS if d > 1 else None,
                           local_size=per_device, local=LOCAL_AXIS if per_device > 1 else None)
    self.sharded = NamedSharding(self.mesh, P(DEVICE_AXIS))
    self.replicated = NamedSharding(self.mesh, P())
    self._in_flight: collections.deque = collections.deque()
    # The trace of a real run: each step's dispatch, in wall seconds from the
    # engine's start (this process's steps: after a resume, the runner puts the
    # earlier steps' events first).
    self._events: list[Event] = []
    self._start = time.perf_counter()
    self._compiled = None  # the step's program, compiled by `init`
    self._stepped = False
    key = jax.random.key(0)
    self._worker_shapes = jax.eval_shape(lambda: algorithm.init(key, jnp.int32(0)))
    params, model_state = jax.eval_shape(problem.task.init, key) if row > 1 else (None, None)
    # A pipelined model's stage rows (and the optimizer state shaped like
    # them, and its stages' batch-norm states' rows) lie along the stage axis,
    # a row per device; the rest is replicated.
    rows = {params["stages"].shape, *[x.shape for x in jax.tree.leaves(model_state)]} \
        if p > 1 else set()
    staged = lambda x: x.shape in rows
    self._specs = jax.tree.map(
        lambda x: in_rows(P(STAGE_AXIS) if staged(x) else P()),
        self._worker_shapes)
    self._shardings = jax.tree.map(lambda spec: NamedSharding(self.mesh, spec), self._specs)
    if k > 1:  # split leaves along the tensor axis too (XLA partitions the step's math)
      wrong = indivisible(fields.model, params, k)
      if wrong:
        raise ConfigError("tensor_parallel", k, f"a divisor of every sharded dimension of "
                          f"{fields.model}'s layers: {wrong}")
      dims = leaf_dims(fields.model, params, self._worker_shapes)
      self._shardings = jax.tree.map(
          lambda d: NamedSharding(self.mesh, in_rows(dim_spec(d))), dims)
    self._local_shapes = jax.tree.map(  # a device's block of a worker's leaves
        lambda x: jax.ShapeDtypeStruct((1, *x.shape[1:]) if staged(x) else x.shape, x.dtype),
        self._worker_shapes)
    self._local_workers = self._workers_of_this_process()
    # (the tensor axis, if any, is left to XLA: manual over the others only)
    manual = {DEVICE_AXIS, STAGE_AXIS} & set(names)
    device_step = self._device_step if d == 1 and p == 1 else jax.shard_map(
        self._device_step, mesh=self.mesh,
        in_specs=(MeshState(P(), self._specs), P(DEVICE_AXIS)),
        out_specs=(MeshState(P(), self._specs), P()), axis_names=manual, check_vma=False)
    self.jitted_step = jax.jit(device_step,
        # Explicit, so the state comes back exactly as it went in (on one
        # device XLA would otherwise simplify some specs and force a retrace).
        out_shardings=(MeshState(self.replicated, self._shardings), self.replicated),
        donate_argnums=0)
    self._evaluated = jax.jit(
        lambda state: algorithm.evaluated(self._stacked(state.workers, m)),
        out_shardings=self.replicated)

  # Layout: worker w's leaf of shape (s0, ...) is rows w*s0 ... (w+1)*s0 - 1 of
  # one global array (a scalar leaf is element w), sharded over devices by
  # rows. With one worker per device a device's block IS the worker's leaf: no
  # new axis, no vmap, and no copies; a leading worker axis would cost XLA a
  # copy of every leaf per step (+50% on small models), and vmapping one worker
  # would turn convolutions into grouped ones (+8%).

  def _stacked(self, rows, count: int, shapes=None):
    """Rows of `count` workers -> the same leaves with a leading worker axis
    (`shapes`: a worker's leaves, default the whole worker's)."""
    return jax.tree.map(lambda x, s: x.reshape((count,) + s.shape), rows,
                        shapes or self._worker_shapes)

  @staticmethod
  def _rows(stacked):
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]) if x.ndim > 1 else x,
                        stacked)

  def _device_step(self, state: MeshState, batch: Batch):
    """One device's part of a step: its L workers' rows in, rows out."""
    worker_step = lambda worker, batch: self.algorithm.step(worker, batch, state.step,
                                                            self.axis)
    local = self.axis.local_size
    batch = jax.tree.map(lambda x: x.reshape((local, -1) + x.shape[1:]), batch)
    workers = self._stacked(state.workers, local, self._local_shapes)
    if self.axis.local is None:
      one = lambda t: jax.tree.map(lambda x: x[0], t)
      workers, metrics = jax.tree.map(lambda x: x[None], worker_step(one(workers), one(batch)))
    else:
      workers, metrics = jax.vmap(worker_step, axis_name=LOCAL_AXIS)(workers, batch)
    # Metrics are shares of the global batch's mean: sum them over workers.
    metrics = jax.tree.map(lambda x: x.sum(0), metrics)
    if self.axis.device:
      metrics = jax.lax.psum(metrics, DEVICE_AXIS)
    return MeshState(state.step + 1, self._rows(workers)), metrics

  def _workers_of_this_process(self) -> np.ndarray:
    per_device = self.axis.local_size
    devices = self.mesh.devices
    first = devices if devices.ndim == 1 else devices[:, 0]  # a worker's first device
    mine = [i for i, dev in enumerate(first.flat)
            if dev.process_index == jax.process_index()]
    return np.array([i * per_device + l for i in mine for l in range(per_device)])

  def init(self, key: jax.Array) -> MeshState:
    def init_all(key):
      workers = base.init_workers(self.algorithm.init, key, self.num_workers)
      return MeshState(jnp.zeros((), jnp.int32), self._rows(workers))
    shardings = MeshState(self.replicated, self._shardings)
    state = base.compile_init(init_all, key, out_shardings=shardings)(key)
    self._compile_step(state)
    return state

  def _compile_step(self, state: MeshState) -> None:
    """Compiles the step for `state` before the run's clock starts, so that
    a measured run's time is its steps' and no compile: the first step finds
    the program in memory. (Its memory analysis is the summary's.)"""
    arguments = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
        (state, self.batch(0)))
    with self._compiling(True):
      self._compiled = self.jitted_step.lower(*arguments).compile()

  def batch(self, step: int) -> Batch:
    """The global batch of `step` in rows, each process supplying its own workers'."""
    local = Batch(*self.streams.stacked_batch(step, self._local_workers))
    position = {int(w): i for i, w in enumerate(self._local_workers)}

    def assemble(array):
      per_worker = array.shape[1]

      def part(index):
        rows = range(self.num_workers * per_worker)[index[0]]
        workers = range(rows.start // per_worker, rows.stop // per_worker)
        return array[[position[w] for w in workers]].reshape((-1,) + array.shape[2:])
      shape = (self.num_workers * per_worker,) + array.shape[2:]
      return jax.make_array_from_callback(shape, self.sharded, part)
    return jax.tree.map(assemble, local)

  def step(self, state: MeshState, step: int):
    """Advances `state` by training step `step` (its data is a function of it)."""
    self._events.append(Event(time.perf_counter() - self._start, "step", -1, step))
    batch = self.batch(step)
    first, self._stepped = not self._stepped, True
    with self._compiling(first):  # (compiled by `init`, unless its shapes differ)
      state, metrics = self.jitted_step(state, batch)
    self._in_flight.append(metrics)
    if len(self._in_flight) > self.MAX_IN_FLIGHT:
      jax.block_until_ready(self._in_flight.popleft())
    return state, metrics

  def _compiling(self, compiles: bool):
    """Where the step compiles: a pipelined one outside the persistent cache."""
    return (outside_persistent_cache() if compiles and self.stages > 1
            else contextlib.nullcontext())

  def report(self, state) -> dict:
    del state  # collective algorithms keep no figures of their own
    return {}

  def jitted_functions(self) -> list:
    return [self.jitted_step]

  def trace(self) -> list[Event]:
    return self._events

  def worker_states(self, state: MeshState):
    """The algorithm's per-worker states, stacked over workers (for inspection)."""
    return self._stacked(jax.device_get(state.workers), self.num_workers)

  def evaluated(self, state: MeshState):
    """(params, model_state) of the evaluated model, as host arrays."""
    return jax.device_get(self._evaluated(state))

  def figures(self) -> dict:
    figures = base.figures(self.name, self.algorithm, self.problem, self.streams,
                           devices=self.mesh.devices.size,
                           workers_per_device=self.axis.local_size,
                           processes=jax.process_count())
    memory = None if self._compiled is None else self._compiled.memory_analysis()
    if memory is not None:  # one device's share of the step's program
      figures["memory_per_device_bytes"] = {
          "arguments": memory.argument_size_in_bytes, "outputs": memory.output_size_in_bytes,
          "temporaries": memory.temp_size_in_bytes, "aliased": memory.alias_size_in_bytes}
    if self.tensor > 1:
      figures["tensor_parallel"] = self.tensor
    if self.stages > 1:
      figures.update(stages=self.stages, microbatches=self.microbatches,
                     bubble_fraction_ideal=bubble_fraction(self.stages, self.microbatches),
                     **self._busy_figures())
    return figures

  def _busy_figures(self) -> dict:
    """A pipelined run's measured utilization: each stage's own work in a
    step, timed alone on its device (jaxdl.parallel.pipeline.stage_seconds),
    over the run's step time (the median time between the dispatches of
    steps after the first two, the host waiting on the devices, at most
    MAX_IN_FLIGHT steps ahead): each device's busy fraction, and the
    measured bubble, the devices' mean idle fraction (the ideal's bubble
    plus unequal stages, messages and the host's own time)."""
    times = [e.time for e in self._events if e.kind == "step"]
    if len(times) < 4:  # too few steps to time one
      return {}
    step_s = float(np.median(np.diff(times[2:])))
    work = stage_seconds(self.problem.task.stages, self.microbatches,
                         self.streams.batch_sizes[0] // self.microbatches,
                         list(self.mesh.devices[0]))
    busy = [w / step_s for w in work]
    return {"step_seconds": step_s, "stage_seconds": work, "busy_fraction_per_device": busy,
            "bubble_fraction_measured": 1 - float(np.mean(busy))}
