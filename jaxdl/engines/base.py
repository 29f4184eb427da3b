"""The engine contract, and what every engine shares.

An engine decides when and where an algorithm's pure functions run. The
runner knows engines only through `Engine`; an engine class declares the
algorithm families it runs (`families`) and the config fields it reads
(`fields`, of which it receives the `slice_of` the run's config), and is
registered once in `jaxdl.engines`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from typing import Any, Callable, ClassVar, Protocol, Sequence, TypeVar, runtime_checkable

import jax
import jax.numpy as jnp

from jaxdl import cluster
from jaxdl.algorithms import AlgorithmSpec, Collective, Problem, Family
from jaxdl.algorithms.ar_sgd import allreduce_bytes
from jaxdl.algorithms.base import models_given
from jaxdl.algorithms.families import has_server
from jaxdl.config import ClusterConfig, RunConfig, field_owner
from jaxdl.data import Streams
from jaxdl.errors import ConfigError
from jaxdl.partition import Policy
from jaxdl import trace
from jaxdl.trace import Event

Metrics = dict[str, jax.Array]


@runtime_checkable
class Engine(Protocol):
  """What the runner calls.

  Constructed as ``Engine(algorithm, problem, streams, fields, total_steps)``:
  the algorithm's built family record, the model and update rule, every worker's data
  stream, the slice of the run's config that it reads and the number of
  training steps. A step is one global batch of samples (jaxdl.trace): one
  round of all workers for a collective algorithm; for an asynchronous one,
  the updates of whichever workers process that many.

  Args:
    algorithm: the family record of pure functions to run (jaxdl.algorithms.families).
    problem: the task and the optax rule (jaxdl.algorithms.Problem).
    streams: every worker's batches (jaxdl.data.Streams).
    fields: the slice of the run's validated config that it declares
      (`slice_of(config, cls.fields)`): all of the config it reads.
    total_steps: how many steps the run takes.

  The rules every engine of asynchronous algorithms follows (the sim
  engine's reference loops in tests/engines/test_reference_loops.py define
  them): every worker keeps working until the run's global budget is spent
  (no per-worker cap); a worker computes on what it pulled; a message is
  decided when it is sent and delivered as sent.
  """
  name: ClassVar[str]
  families: ClassVar[tuple[type, ...]]
  """The algorithm families (jaxdl.algorithms.families) this engine runs."""
  fields: ClassVar[type]
  """The config fields it reads (in its constructor, its processes and its
  `check`): a frozen dataclass whose fields are config fields, by their
  flat names and with their types (`reads`); one named `recipe` holds the
  run's `Recipe`, for processes that rebuild the run."""
  deterministic: ClassVar[bool]
  """Whether two runs of one config give the same bits (a real engine's
  order of events is the machine's: its trace replays on the sim)."""
  simulated: ClassVar[bool]
  """Whether it runs a simulated schedule: --engine auto's choice for a dry
  run and a partition of the global batch that changes."""
  central_process: ClassVar[bool]
  """Whether an asynchronous algorithm's parameter server or coordinator
  runs in a process of its own, whose CPU seconds the summary reports
  (central_cpu_s, machine_cpu_s): an engine `jaxdl calibrate` measures on."""
  own_fields: ClassVar[dict[str, str]]
  """The config fields that this engine alone reads, each with what it does:
  every other engine refuses them unless at their defaults
  (jaxdl.engines.check)."""
  placement: ClassVar[frozenset[str]]
  """Those of `own_fields` that place its processes and leave the math as it
  is: a replay of its trace on another engine keeps them."""

  @classmethod
  def check(cls, fields: Any, spec: AlgorithmSpec) -> None:
    """Refuses (a ConfigError) the fields of its slice of the config
    (`fields`) that this engine cannot run with the algorithm `spec`,
    beyond other engines' own fields."""

  def init(self, key: jax.Array) -> Any:
    """The state of the whole run at step 0 (a pytree that checkpoints)."""

  def step(self, state: Any, step: int) -> tuple[Any, Metrics]:
    """Advances `state` by training step `step`; metrics are global means.
    At a step after which the runner reads no state (build.Cadence.observes),
    an engine whose state lives in other processes may return `state`
    unchanged rather than gather it."""

  def evaluated(self, state: Any) -> tuple[Any, Any]:
    """(params, model_state) of the model to evaluate, as host arrays."""

  def figures(self) -> dict[str, Any]:
    """The engine's and cluster's summary figures (devices, timing, traffic)."""

  def report(self, state: Any) -> dict[str, float]:
    """The algorithm's own summary figures (e.g. LC-ASGD's predictor errors)."""

  def trace(self) -> Sequence[Event]:
    """The run's events so far, in the order their math ran."""

  def jitted_functions(self) -> list:
    """The engine's jitted functions (for compile-count checks)."""

  def processes(self) -> list[dict[str, Any]]:
    """Every process of the run: its role, process id and host (cluster.json)."""

  def close(self) -> None:
    """Stops what the engine started (processes, a Ray instance); the runner
    calls it once the run ends, however it ends."""


def process_identity(role: str) -> dict[str, Any]:
  """Who this process is in a run (cluster.json): its role, process id, host
  and the cores it may run on (None where the system does not say)."""
  cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
  return {"role": role, "pid": os.getpid(), "host": socket.gethostname(), "cores": cores}


def slowed(computed: float, modelled: float | None) -> float:
  """The seconds of a batch whose compute took `computed` seconds on a
  worker that emulates a slower device (--compute-time on a real engine):
  the simulator's cost model says `modelled` (None: not emulated). If the
  compute took less, it sleeps the rest, so that the worker is as late as
  the modelled device would be. Returns the longer of the two."""
  if modelled is not None and modelled > computed:
    time.sleep(modelled - computed)
    return modelled
  return computed


def runs_own_programs(fields) -> bool:
  """Whether a synchronous algorithm's workers on a real engine each run
  their own program on their own share of the batch (jaxdl.engines.own_programs):
  its partition changes (--partition), the workers are slowed for real
  (--compute-time), or they have devices of their own (--worker-devices).
  `fields`: an engine's slice of the config that holds these three."""
  return (fields.partition != "static" or fields.compute_time is not None
          or fields.worker_devices is not None)


def partition_policy(fields) -> Policy:
  """The partition policy of the global batch (validated: Policy.of) that an
  engine's slice of the config holds: its partition, rebalance_every and
  rebalance_window."""
  return Policy(fields.partition, fields.rebalance_every, fields.rebalance_window)


def check_reduce(fields, spec: AlgorithmSpec, own_programs: bool) -> None:
  """--reduce device: only where each worker runs its own program
  (`own_programs`: the engine can, `runs_own_programs`: the config asks it)."""
  if fields.reduce != "host" and not (
      own_programs and spec.family is Collective and runs_own_programs(fields)):
    raise ConfigError("reduce", fields.reduce, "host, unless each worker runs "
                      "its own program: a synchronous algorithm on an engine of real devices "
                      "with --partition proportional or adaptive, --compute-time or "
                      "--worker-devices")


def check_emulation(engine: type, fields) -> None:
  """On a real engine without --compute-time, the workers run at their own
  speed: the settings that vary an emulated batch time are refused, and so
  are --worker-speeds that would not even partition the batch (--batch-sizes).
  `fields`: the engine's slice of the config, with cluster.EMULATED's
  fields, worker_speeds and batch_sizes."""
  if fields.compute_time is not None:
    return
  for field in (f for f in cluster.EMULATED if f != "compute_time"):
    value, default = getattr(fields, field), getattr(ClusterConfig, field)
    if value != default:
      raise ConfigError(field, value, f"its default ({default!r}) with --engine "
                        f"{engine.name} unless --compute-time is set (the emulated batch time "
                        "it varies)")
  speeds = fields.worker_speeds
  if speeds is not None and fields.batch_sizes is not None:
    raise ConfigError("worker_speeds", speeds, f"unset with --batch-sizes on --engine "
                      f"{engine.name} unless --compute-time is set: real workers run at their "
                      "own speed, which the speeds slow to an emulated compute time (without "
                      "--batch-sizes they partition the global batch)")


_SETUP_BUILDER: list[Callable[..., Any]] = []


def set_setup_builder(build: Callable[..., Any]) -> None:
  """Registers how a process builds a run's setup from its config,
  ``build(config, task=None) -> Setup``: jaxdl.build.prepare, which sits above
  the engines (its validation asks them) and registers itself when imported.
  An engine whose processes each build the run (the ray engine's actors)
  calls it through `Recipe.rebuild`."""
  _SETUP_BUILDER[:] = [build]


def setup_builder() -> Callable[..., Any]:
  """The function registered by `set_setup_builder` (every process that
  imports jaxdl has it: the package imports jaxdl.build)."""
  if not _SETUP_BUILDER:
    raise RuntimeError("no setup builder: import jaxdl (jaxdl.build registers it)")
  return _SETUP_BUILDER[0]


RECIPE = "recipe"
"""The name of the field of an engine's slice that holds the run's Recipe."""


@dataclasses.dataclass(frozen=True)
class Recipe:
  """How a process of a real engine rebuilds the run: the validated config,
  as JSON, and a script's own task (None: the config's dataset and model).
  The engine hands it to its processes unread; each rebuilds the run's
  setup from it (`rebuild`), as the driver built its own."""
  config_json: str
  task: Any = None

  def rebuild(self):
    """The run's Setup, its engine None, built in this process
    (`setup_builder`: jaxdl.build.prepare)."""
    config = RunConfig.from_dict(json.loads(self.config_json))
    return setup_builder()(config, task=self.task)


Slice = TypeVar("Slice")


def slice_of(config: RunConfig, fields: type[Slice], task: Any = None) -> Slice:
  """The slice of the validated `config` that an engine reads: its
  declaration `fields` (Engine.fields) holding the config's values, field
  by flat name; a field named `recipe` holds the run's Recipe (of `config`
  and a script's own `task`). A TypeError for a declared name that is not
  a config field."""
  owner = field_owner()
  values = {}
  for field in dataclasses.fields(fields):
    if field.name == RECIPE:
      values[RECIPE] = Recipe(config.to_json(), task)
    elif field.name in owner:
      values[field.name] = getattr(getattr(config, owner[field.name]), field.name)
    else:
      raise TypeError(f"{fields.__name__}.{field.name}: not a config field")
  return fields(**values)


def reads(engine: type) -> tuple[str, ...]:
  """The config fields (flat names) that `engine` reads: those it declares."""
  return tuple(f.name for f in dataclasses.fields(engine.fields) if f.name != RECIPE)


@dataclasses.dataclass(frozen=True)
class NoFields:
  """The slice of the config of an engine that reads none of it."""


class Declared:
  """An engine's declarations (`Engine`) where it makes none: its runs are
  deterministic, it simulates nothing, it runs no central process of its
  own, it reads no config field, none that other engines do not, and it
  checks nothing of its own."""
  deterministic: ClassVar[bool] = True
  simulated: ClassVar[bool] = False
  central_process: ClassVar[bool] = False
  fields: ClassVar[type] = NoFields
  own_fields: ClassVar[dict[str, str]] = {}
  placement: ClassVar[frozenset[str]] = frozenset()

  @classmethod
  def links(cls, fields: Any, nbytes: int) -> dict[str, Any] | None:
    """The links between the machines its processes run on, measured for
    messages of `nbytes` (a cost profile's latency, bandwidth, worker_nodes
    and central_bandwidth, and what was measured); None: one machine."""
    return None

  @classmethod
  def check(cls, fields: Any, spec: AlgorithmSpec) -> None:
    del fields, spec


class LocalProcess(Declared):
  """The processes of an engine that runs in the driver's process alone."""

  def processes(self) -> list[dict[str, Any]]:
    return [process_identity("driver")]

  def close(self) -> None:
    pass


def compile_init(init, key: jax.Array, *, out_shardings=None):
  """Compiles an initialization function of `key` once; call the result
  with `key`.

  Op by op, every parameter's initializer would compile on its own. The
  compile keeps XLA's default optimization: at level 0 the CPU backend
  compiles faster but rounds the random initializers differently, and a
  run's initial parameters would no longer be the bits of the task's
  ``init(key)`` called by hand. The models that `init` starts from
  (`Problem.init_model(key)`) are computed first, by the task's initializer
  compiled alone, and `init` takes them as arguments: most of an initial
  state's compile is XLA compiling random initializers, and that program is
  the same for every algorithm, worker count and device count (one compile,
  then hits in JAX's persistent compilation cache).
  """
  replicated = _replicated(out_shardings)
  if replicated is None:  # a mesh over several processes: one program
    return jax.jit(init, out_shardings=out_shardings).lower(key).compile()
  tasks: list = []

  def given(key, models):
    with models_given(key, tasks, models):
      return init(key)

  def arguments(key):  # on the mesh, every argument on all its devices
    args = key, tuple(jax.jit(task.init)(key) for task in tasks)
    return args if replicated is False else jax.device_put(args, replicated)
  jax.eval_shape(given, key, ())  # which tasks' models `init` starts from
  args = arguments(key)
  compiled = jax.jit(given, out_shardings=out_shardings).lower(*args).compile()
  return lambda k: compiled(*(args if k is key else arguments(k)))


def _replicated(out_shardings):
  """The sharding that replicates the models over `out_shardings`' mesh:
  False without shardings, None where the mesh spans processes."""
  if out_shardings is None:
    return False
  shardings = jax.tree.leaves(out_shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
  if not shardings or not all(isinstance(x, jax.sharding.NamedSharding) for x in shardings):
    return None
  mesh = shardings[0].mesh
  if any(x.mesh != mesh for x in shardings) or not all(
      d.process_index == jax.process_index() for d in mesh.devices.flat):
    return None
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def init_workers(init, key: jax.Array, num_workers: int):
  """Every worker's state from `init(key, worker)`, stacked over workers."""
  return jax.vmap(lambda w: init(key, w))(jnp.arange(num_workers))


def figures(name: str, algorithm: Family, problem: Problem, streams: Streams, *,
            devices: int, workers_per_device: int, processes: int = 1) -> dict[str, Any]:
  """The summary figures every engine reports."""
  return {"engine": name, "devices": devices, "workers_per_device": workers_per_device,
          "processes": processes, "batch_sizes": list(streams.batch_sizes),
          "bytes_communicated_per_step": algorithm.bytes_per_step}


TRACE_FIGURES = ("staleness_mean", "staleness_max", "staleness_histogram", "wait_s",
                 "idle_fraction", "bytes_total", "batches_per_worker")
"""The summary figures of an asynchronous run's trace (jaxdl.trace.summarize)."""


def trace_figures(events: Sequence[Event], num_workers: int, bytes_total, *extra: str):
  """TRACE_FIGURES (and `extra` ones) of the run's events."""
  stats = trace.summarize(events, num_workers, bytes_total)
  return {k: stats[k] for k in (*extra, *TRACE_FIGURES)}


def synchronous_events(clock: float, step: int, waits: Sequence[float]) -> list[Event]:
  """A synchronous step's events on a real engine, at its end (`clock`):
  each worker's seconds idle in it ("wait"), then the step."""
  return [*(Event(clock, "wait", w, iteration=step, duration=d) for w, d in enumerate(waits)),
          Event(clock, "step", -1, step)]


def synchronous_figures(algorithm: Collective, problem: Problem, num_workers: int,
                        events: Sequence[Event], total_steps: int) -> dict[str, Any]:
  """TRACE_FIGURES of a synchronous run on a real engine (its steps'
  `synchronous_events`), its `collective_bytes` and `trace_time_s` (the
  clock at its last event)."""
  return {**trace_figures(events, num_workers, collective_bytes(
              algorithm, problem, num_workers, events, total_steps)),
          "trace_time_s": events[-1].time if events else 0.0}


def collective_bytes(algorithm: Collective, problem: Problem, num_workers: int,
                     events: Sequence[Event], total_steps: int) -> float:
  """Bytes all workers sent in the steps of `events` ("step"), of a run of
  `total_steps`, counted as the simulator counts them
  (jaxdl.cluster.sync_schedules.synchronous): an all-reduce is a ring's, 2 (M - 1)
  model bytes (with --compress an all-gather, M (M - 1) messages), at every
  step ("allreduce") or at every `period`-th ("local"); a parameter
  server's step ("ps": bsp) is each worker's push, and its pull of the
  model after every step but the run's last (the replicas start equal)."""
  steps = [e.iteration for e in events if e.kind == "step"]
  if algorithm.sync == "ps":
    pulls = sum(g + 1 < total_steps for g in steps)
    return float(num_workers * (len(steps) * problem.message_bytes()
                                + pulls * problem.model_bytes()))
  period = algorithm.period if algorithm.sync == "local" else 1
  return sum((g + 1) % period == 0 for g in steps) * allreduce_bytes(problem, num_workers)


def algorithm_report(algorithm: Family, server: Any) -> dict[str, float]:
  """The algorithm's figures from its server state, as floats."""
  if not has_server(algorithm):
    return {}
  return {k: float(v) for k, v in jax.device_get(algorithm.report(server)).items()}
