"""A synchronous algorithm whose workers each run their own program.

On a mesh every worker runs one SPMD program, so every worker's batch has
one padded shape: a smaller share of the global batch saves nothing, and no
worker's batch time can be told apart. Where the shares differ in time (a
partition that changes, --partition proportional or adaptive; workers slowed
by an emulated compute time, --compute-time; workers on different kinds of
device) each worker runs the algorithm's own step as a program of its own,
on its own share of the global batch, and the step's collectives meet at an
`Exchange` (jaxdl.engines.host_axis). The algorithm's math is its own step,
unchanged.

`ProgramWorker` is a worker (host state: its algorithm state, its compiled
steps, its clock); `OwnProgramsRun` is what drives them, on any engine that can
call every worker's method at once (`_all`): the mesh engine's threads in one
process (`MeshOwnPrograms`), or the ray engine's processes
(`jaxdl.engines.ray_engine.RayOwnPrograms`).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import Any, Callable

import jax
import numpy as np

from jaxdl import distributed, trace
from jaxdl.algorithms import Batch, Collective
from jaxdl.cadence import Cadence
from jaxdl.engines import base
from jaxdl.engines.events import initial_state, stack, take
from jaxdl.engines.host_axis import Exchange, HostAxis, unmet
from jaxdl.engines.sim import CostFields, cost_model
from jaxdl.errors import ConfigError
from jaxdl.partition import Partitioner, Partitions

PAD_TO = 8
"""A worker's batch is padded to a multiple of this (weight 0), so that
small changes of its size reuse one compiled step."""


@dataclasses.dataclass(frozen=True)
class OwnProgramsFields(CostFields):
  """The config fields that a real engine (mesh, ray) reads to partition a
  synchronous algorithm's workers (base.runs_own_programs), to check and
  emulate their compute times (base.check_emulation: the cost model's
  fields) and to run them (`ProgramWorker`, `OwnProgramsRun`): where their
  collectives sum, the partition policy, the runner's cadence."""
  batch_sizes: tuple[int, ...] | None
  reduce: str
  worker_devices: tuple[str, ...] | None
  partition: str
  rebalance_every: int
  rebalance_window: int
  log_every: int
  eval_every: int
  checkpoint_every: int


def padded_size(b: int) -> int:
  """A batch of b examples' size padded to a multiple of PAD_TO."""
  return -(-b // PAD_TO) * PAD_TO


class ProgramWorker:
  """Worker `worker` of a synchronous algorithm (its engine's slice of the
  config `fields`, `problem`'s model and every worker's `streams`), running
  its step as a program of its own on its share of each global batch
  (padded to a multiple of PAD_TO), on `device` (None: the default one).
  `meet(op, key, worker, leaves)` takes its part of a collective to the
  exchange and returns the result (jaxdl.engines.host_axis.HostAxis).

  With --compute-time it is slowed for real: before the step's first
  collective (or at its end, if it has none), it sleeps until its batch has
  taken the simulator's modelled time for it (its speed, --jitter and
  stragglers, its share of the batch: jaxdl.engines.sim.cost_model), if its
  compute took less; its batch is then late at the exchange, as a slow
  device's would be."""

  def __init__(self, fields: OwnProgramsFields, algorithm, problem, streams, worker: int,
               meet: Callable, device=None):
    self.w, self.streams, self.algorithm = worker, streams, algorithm
    self.m = streams.num_workers
    self.static = streams.batch_sizes[worker]  # the size the modelled times are for
    self.cost = (None if fields.compute_time is None else
                 cost_model(fields, problem, streams))
    self.meet, self.device = meet, device
    axis = HostAxis(self.m, worker, self)
    self.jitted = jax.jit(lambda state, batch, t: self.algorithm.step(
        state, batch, t, axis.bind(t)))
    self.compiled: dict[int, Any] = {}  # padded batch size -> its compiled step
    self.mark = self.computed = self.compiling = 0.0
    self.target: float | None = None  # the modelled seconds of this step's batch, until slept
    self.alone = False  # in a step's untimed first run: collectives answered here (`ready`)
    self.first_runs = 0  # untimed first runs so far: one per compiled step
    # each field's example shape and dtype, for a first run's batch of zeros
    self.fields = {k: (v.shape[1:], v.dtype) for k, v in streams.example.items()}

  def _slowed(self) -> None:
    """Counts the compute since `mark`; sleeps what is left of the modelled time."""
    self.computed = base.slowed(self.computed + time.perf_counter() - self.mark, self.target)
    self.target = None

  def collective(self, op: str, key: tuple, worker: int, leaves: list):
    """A collective of this worker's step (from its host callback): at the
    exchange; in its untimed first run, answered here (`unmet`)."""
    if self.alone:
      return unmet(op, worker, self.m, leaves)
    self._slowed()
    result = self.meet(op, key, worker, leaves)
    self.mark = time.perf_counter()
    return result

  def _put(self, state) -> None:
    self.state = jax.device_put(state, self.device)

  def init(self, key_data: np.ndarray) -> None:
    """This worker's state at step 0, from the run's key."""
    workers = initial_state(self.algorithm, jax.random.wrap_key_data(np.asarray(key_data)),
                            self.m)[1]
    self._put(take(workers, self.w))

  def begin(self, workers) -> None:
    """Continues from a checkpoint's state (every worker's, stacked)."""
    self._put(take(workers, self.w))

  def repartition(self, changes: list) -> None:
    """The run's partitions so far: (first step, sizes) after the step-0 sizes."""
    self.streams.repartition(Partitions(self.streams.batch_sizes, changes))

  def padded_batch(self, t: int) -> tuple[dict, np.ndarray]:
    """Its batch at step t, padded to a multiple of PAD_TO, and its weights."""
    return self.streams.padded_batch(self.w, t, padded_size(self.streams.size(self.w, t)))

  def _on_device(self, fields: dict, weights: np.ndarray, t: int) -> Batch:
    return jax.device_put(Batch(fields, weights, np.array([self.w, t], np.int32)),
                          self.device)

  def ready(self, t: int) -> float:
    """Makes its step for its batch size at step t ready to be timed: if that
    size is new, compiles its step and runs it once on a batch of zeros, its
    collectives answered here and its result dropped. A step's first run
    after its compile is not a steady one (the cnn's, three workers on two
    cores: 0.105-0.178 s against 0.034; a small mlp's alone: 5-40 ms
    against 1.5): it is never a batch time. The seconds it took (0 if
    ready)."""
    padded = padded_size(self.streams.size(self.w, t))
    if padded in self.compiled:
      return 0.0
    start = time.perf_counter()
    fields = {k: np.zeros((padded, *shape), dtype) for k, (shape, dtype) in self.fields.items()}
    batch = self._on_device(fields, np.zeros(padded, np.float32), t)
    compiled = self.jitted.lower(self.state, batch, np.int32(t)).compile()
    self.compiling += time.perf_counter() - start
    self.alone = True
    try:
      jax.block_until_ready(compiled(self.state, batch, np.int32(t)))
    finally:
      self.alone = False
    self.compiled[padded], self.first_runs = compiled, self.first_runs + 1
    return time.perf_counter() - start

  def step(self, t: int, batch=None) -> tuple[dict, float, float]:
    """Takes step t with the others, on its `padded_batch` (None: read now):
    (its metric shares, its batch's seconds: the step's less those spent in
    collectives, emulated time included; its seconds making a step for a new
    batch size `ready`, outside its batch's, 0 where the engine made it ready
    before the step). A batch it reads itself is read inside its modelled
    time, as a prefetching input pipeline's would be."""
    begun = time.perf_counter()
    fields, weights = self.padded_batch(t) if batch is None else batch
    reading = time.perf_counter() - begun
    readying = self.ready(t)
    batch = self._on_device(fields, weights, t)
    if self.cost is not None:
      b = self.streams.size(self.w, t)
      self.target = self.cost.compute_time(self.w, t) * b / self.static
    self.computed, self.mark = 0.0, time.perf_counter() - reading
    self.state, metrics = self.compiled[len(weights)](self.state, batch, np.int32(t))
    jax.block_until_ready(self.state)
    self._slowed()
    return jax.device_get(metrics), self.computed, readying

  def compile_seconds(self) -> float:
    """Seconds it spent compiling its steps (one per padded batch size)."""
    return self.compiling

  def untimed_runs(self) -> int:
    """Its runs left out of its batch times: one per compiled step (`ready`)."""
    return self.first_runs

  def get_state(self):
    return jax.device_get(self.state)


class OwnProgramsRun:
  """Drives M `ProgramWorker`s one synchronous step at a time: feeds their
  measured batch times to the partition policy and hands them each new partition
  before the step it starts at. Every batch time is a steady one: before
  the first step and each partition, every worker makes its step for its size
  ready (compiled and run once, `ProgramWorker.ready`), none timed meanwhile.
  The trace holds each step's end, each worker's idle time before it
  ("wait") and each partition ("partition"), on a clock of the steps' wall
  times (readying excluded, as the evaluations between steps). An engine
  sets `algorithm`, `problem`, `streams`, `num_workers`, `name` and calls
  `_begin_partitions`, and gives `_all(method, *args)` (every worker's reply, in
  worker order) and `_reduce_seconds()`."""
  families = (Collective,)

  def _begin_partitions(self, fields: OwnProgramsFields, total_steps: int) -> None:
    self.reduce, self.total_steps = fields.reduce, total_steps
    self.partitioner = Partitioner(base.partition_policy(fields), self.streams.batch_sizes)
    self.changes: list[tuple[int, tuple[int, ...]]] = []
    self.cadence = Cadence.of(fields, self.streams.steps_per_epoch, total_steps)
    self.events: list[trace.Event] = []
    self.seconds: list[list[float]] = [[] for _ in range(self.num_workers)]
    self.begun, self.clock = False, 0.0  # the steps' seconds so far, readying excluded
    self.ahead = False  # whether the next step began as the last ended (`_runs_ahead`)
    self.ended: float | None = None  # when the last step's replies were in, if so

  def _step_all(self, step: int) -> list:
    """Every worker's reply to step `step`."""
    return self._all("step", step)

  def _runs_ahead(self, step: int) -> bool:
    """Whether step + 1 may begin as soon as the workers end `step`, with
    nothing from the driver in between: no partition may come after it, and
    neither the state after it nor a step beyond the run is wanted."""
    return (step + 2 < self.total_steps and not self.cadence.observes(step + 1)
            and not self.partitioner.due(self.partitioner.observed + 1))

  def _state(self):
    """Every worker's state, stacked (host arrays)."""
    return stack(self._all("get_state"))

  def init(self, key: jax.Array):
    self._all("init", np.asarray(jax.random.key_data(key)))
    return self._state()

  def step(self, state, step: int):
    if not self.begun:
      self.begun = True
      if step:  # from a checkpoint's state; the policy starts again from the static partition
        self._all("begin", state)
      self._all("ready", step)  # all compiled and run once before any is timed
    begin = time.perf_counter() if self.ended is None else self.ended
    replies = self._step_all(step)
    # The step's time, less the longest readying in it (none: the steps are
    # made ready between steps): from its call, or from the last step's end
    # where it began then.
    end = time.perf_counter()
    took = end - begin - max(r[2] for r in replies)
    self.ended = end if self.ahead else None
    self.clock += took
    seconds = [float(r[1]) for r in replies]
    for w, s in enumerate(seconds):
      self.seconds[w].append(s)
    # idle: the step's time less its own batch's
    self.events += base.synchronous_events(self.clock, step,
                                           [max(0.0, took - s) for s in seconds])
    # (no partition after the last step: none would take it)
    sizes = self.partitioner.observe(seconds) if step + 1 < self.total_steps else None
    if sizes is not None:
      self.changes.append((step + 1, sizes))
      self.events.append(trace.Event(self.clock, "partition", -1, iteration=step + 1,
                                     sizes=sizes))
      self._all("repartition", self.changes)
      self._all("ready", step + 1)  # a new size: compiled and run once, untimed
    metrics = {k: sum(float(r[0][k]) for r in replies) for k in replies[0][0]}
    return (self._state() if self.cadence.observes(step + 1) else state), metrics

  def trace(self) -> list[trace.Event]:
    return self.events

  def partition_figures(self, devices: int, processes: int) -> dict[str, Any]:
    return {**base.figures(self.name, self.algorithm, self.problem, self.streams,
                           devices=devices, workers_per_device=1, processes=processes),
            # (trace_time_s: the steps' seconds, without readying or evaluating)
            **base.synchronous_figures(self.algorithm, self.problem, self.num_workers,
                                       self.events, self.total_steps),
            **trace.batch_time_figures(self.seconds),
            # where the collectives summed, and the seconds it took (copies included)
            "reduce": self.reduce, "reduce_s": self._reduce_seconds(),
            # each worker's seconds compiling its steps, one per padded batch size
            # (outside its batch times; the others wait for it at the exchange)
            "compile_s_per_worker": self._all("compile_seconds"),
            # each worker's runs left out of its batch times: a compiled
            # step's first, run before the step it is for (`ProgramWorker.ready`)
            "untimed_runs_per_worker": self._all("untimed_runs")}

  def report(self, state) -> dict[str, float]:
    return {}

  def jitted_functions(self) -> list:
    return []

  def evaluated(self, state):
    return jax.device_get(self.algorithm.evaluated(jax.device_put(state)))


def cpu_program_threads() -> int:
  """How many programs XLA's CPU client runs at once: its thread pool's size,
  the larger of the cores this process may run on and its CPU devices."""
  return max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1, len(jax.devices("cpu")))


def _check_cpu_threads(devices) -> None:
  """Refuses more workers on CPU devices than XLA's CPU client runs programs
  at once: a worker's program holds one of its threads while it waits for
  the others at the exchange, and one left without a thread would never
  come (the run would hang)."""
  on_cpu, most = sum(d.platform == "cpu" for d in devices), cpu_program_threads()
  if on_cpu > most:
    raise ConfigError("workers", len(devices), f"at most {most} on CPU devices when each "
                      "worker runs its own program (--partition proportional or adaptive, "
                      f"--compute-time, --worker-devices): XLA runs {most} CPU programs at "
                      "once, a waiting worker's holds one; more CPU devices allow more "
                      "(XLA_FLAGS=--xla_force_host_platform_device_count=N)")


class MeshOwnPrograms(OwnProgramsRun, base.LocalProcess):
  """The mesh engine's form of `OwnProgramsRun`: the M workers are threads of this
  process, each on its own device (--worker-devices: several kinds of device
  in one synchronous step, e.g. an accelerator and the CPU), their
  collectives meeting at one `Exchange` in memory (--reduce)."""
  name = "mesh"

  def __init__(self, algorithm, problem, streams, fields: OwnProgramsFields, total_steps: int):
    self.algorithm, self.problem, self.streams = algorithm, problem, streams
    self.num_workers = m = streams.num_workers
    self.exchange = Exchange(m, fields.reduce)
    devices = distributed.worker_devices(fields.worker_devices, m)
    _check_cpu_threads(devices)
    self.workers = [ProgramWorker(fields, algorithm, problem, streams, w,
                                self.exchange.collective, devices[w]) for w in range(m)]
    self.devices = len(set(devices))
    self.pool = concurrent.futures.ThreadPoolExecutor(m, thread_name_prefix="jaxdl-worker")
    self._begin_partitions(fields, total_steps)

  def _all(self, method: str, *args) -> list:
    return self._results([self.pool.submit(getattr(w, method), *args) for w in self.workers])

  def _step_all(self, step: int) -> list:
    # the workers share one data stream: read here, one batch at a time
    batches = [w.padded_batch(step) for w in self.workers]
    return self._results([self.pool.submit(w.step, step, b)
                          for w, b in zip(self.workers, batches)])

  def _results(self, futures) -> list:
    """The workers' results; the first error, once the others have left the exchange."""
    done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
    failed = [f.exception() for f in done if f.exception() is not None]
    if failed:  # the first to fail; the others then leave the exchange with an error
      self.exchange.abort()
      concurrent.futures.wait(futures)
      raise failed[0]
    return [f.result() for f in futures]

  def _reduce_seconds(self) -> float:
    return self.exchange.reduce_seconds()

  def figures(self) -> dict[str, Any]:
    return self.partition_figures(devices=self.devices, processes=1)

  def close(self) -> None:
    self.pool.shutdown(wait=False, cancel_futures=True)
