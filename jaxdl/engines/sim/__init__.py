"""The sim engine: an algorithm's real math in the order of a simulated cluster.

A schedule (jaxdl.cluster) says which events happen and in which order, from a
cost model of the cluster; this engine executes their math on one device.
Parameters therefore depend only on the schedule: the same config and seed
give the same schedule and the same bits, and a recorded schedule replays.

Independent worker computations are batched: a worker's gradient depends
only on the parameters it pulled and its batch, so all workers waiting for a
gradient are computed together, from their stacked pulled versions (the
staleness buffer). The host plans a step's events as ops and the device runs
them, with batches gathered on the device: `plan` (events -> ops),
`batches` (device batches), `handlers` (each op's math, from the algorithm's
own functions) and `runner` (how the ops run).
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import xla_bridge

from jaxdl import cluster, trace
from jaxdl.algorithms import (FAMILIES, Centralized, Collective, Decentralized, Elastic, Gossip,
                              Problem, Family)
from jaxdl.algorithms.families import has_server
from jaxdl.data import SlicedStreams, Streams
from jaxdl.engines import base
from jaxdl.engines.events import EventReplay, check_servers, initial_state
from jaxdl.engines.sim import plan as planning
from jaxdl.engines.sim.batches import DeviceBatches
from jaxdl.engines.sim.handlers import CHUNK_ROWS, handlers
from jaxdl.engines.sim.runner import (FUSED_STEPS, OpRunner, choose_batching, fusable, metric_names,
                                      trace_gradient)
from jaxdl.errors import ConfigError
from jaxdl.partition import Partitioner, Partitions


class SimState(NamedTuple):
  server: Any             # the server's state; gossip: the messages in flight
  workers: Any            # every worker's state, stacked over workers
  iteration: np.ndarray   # (M,) int: the iteration each worker works on (-1: none)
  computed: np.ndarray    # (M,) bool: its gradient is computed, not yet applied
  position: np.ndarray    # (): index of the next schedule event


def flops_per_batch(problem: Problem, streams: Streams) -> float:
  """XLA's FLOP count of one worker's gradient on a mean-size batch (no compile)."""
  traced = trace_gradient(problem, streams.example, round(np.mean(streams.batch_sizes)))
  return float(traced.lower().cost_analysis()["flops"])


@dataclasses.dataclass(frozen=True)
class CostFields:
  """The config fields that describe the simulated cluster (`cost_model`):
  the sim engine's, and a real engine's that emulates its compute times
  (--compute-time)."""
  worker_speeds: tuple[float, ...] | None
  servers: int
  cluster: str
  network: str
  latency: float
  compute_time: float | None
  jitter: float
  jitter_correlation: float
  straggler_prob: float
  straggler_slowdown: float
  seed: int
  model: str  # (and dataset: those a measured profile must be of)
  dataset: str


@dataclasses.dataclass(frozen=True)
class SimFields(CostFields):
  """The config fields the sim engine reads: its cost model's, the split
  of the global batch, a replay or a dry run, --reduce (refused)."""
  partition: str
  rebalance_every: int
  rebalance_window: int
  replay: str | None
  dry_run: bool
  reduce: str


def cost_model(fields: CostFields, problem: Problem, streams: Streams) -> cluster.CostModel:
  """The simulated cluster that `fields` (an engine's slice of the config)
  describes, for this model and data."""
  m = streams.num_workers
  mean_batch = np.mean(streams.batch_sizes)
  # A worker's time grows with its batch and shrinks with its speed.
  speeds = tuple((fields.worker_speeds or (1.0,) * m)[w] * mean_batch / b
                 for w, b in enumerate(streams.batch_sizes))
  common = dict(servers=fields.servers, speeds=speeds, jitter=fields.jitter,
                jitter_correlation=fields.jitter_correlation,
                straggler_prob=fields.straggler_prob, straggler_slowdown=fields.straggler_slowdown,
                seed=fields.seed,
                message_bytes=problem.message_bytes() if problem.compresses else None,
                reply_bytes=problem.pull_bytes() if problem.compresses_pull else None)
  if cluster.is_profile(fields.cluster):
    return cluster.CostModel(m, model_bytes=problem.model_bytes(),
                             **measured_costs(fields, mean_batch), **common)
  count, profile = cluster.parse_cluster(fields.cluster)
  if count is not None and count != m:
    raise ConfigError("cluster", fields.cluster, f"a count equal to --workers {m}, or none")
  flops = None if fields.compute_time else flops_per_batch(problem, streams)
  return cluster.CostModel.build(
      m, problem.model_bytes(), compute_s=fields.compute_time, flops_per_batch=flops,
      profile=profile, network=fields.network, latency=fields.latency, **common)


def message_bytes(algorithm: Family, problem: Problem, events) -> float:
  """The bytes the cost model counts for the messages that `events` (a
  trace's) record: a parameter server's pulls and pushes, an exchange's
  center and elastic difference, gossip messages, both halves of each
  average (compressed as --compress and --compress-pull say)."""
  push, pull, model = problem.message_bytes(), problem.pull_bytes(), problem.model_bytes()
  count = lambda kind: sum(e.kind == kind for e in events)
  if isinstance(algorithm, Centralized):
    return count("pull") * pull + count("apply") * push
  if isinstance(algorithm, Elastic):
    return count("exchange") * (model + push)
  return count("send") * push + count("average") * 2 * push


def measured_costs(fields: CostFields, mean_batch: float) -> dict[str, float]:
  """The CostModel fields of the profile `--cluster PATH.json`, measured for
  this run's model, dataset and batch size (--compute-time overrides its
  compute time)."""
  path = fields.cluster
  p = cluster.read_profile(path)
  measured = (p.model, p.dataset, p.batch_size)
  if measured != (fields.model, fields.dataset, mean_batch):
    raise ConfigError("cluster", path, f"a profile measured for this run (model "
                      f"{fields.model}, dataset {fields.dataset}, batch size "
                      f"{mean_batch:g}); this one was measured for model {p.model}, dataset "
                      f"{p.dataset}, batch size {p.batch_size}: run `jaxdl calibrate` for it")
  return dict(compute_s=fields.compute_time or p.compute_time, bandwidth=p.bandwidth,
              latency=p.latency, server_s=p.server_time, order_s=p.order_time,
              worker_nodes=int(p.worker_nodes), central_bandwidth=p.central_bandwidth)


def make_schedule(algorithm: Family, cost: cluster.CostModel, total_steps: int,
                  batch_sizes, partitioner=None) -> cluster.Schedule:
  """The cluster's schedule of `total_steps` steps for the algorithm's family
  and declared policy: synchronous steps (their global batch split anew by
  `partitioner`, if any), or an asynchronous run's budget of `total_steps`
  global batches of samples (jaxdl.trace: what a step is)."""
  if isinstance(algorithm, Collective):
    return cluster.synchronous(cost, total_steps, algorithm.sync, algorithm.period,
                               partitioner)
  budget = cluster.Budget(total_steps * sum(batch_sizes), tuple(batch_sizes))
  if isinstance(algorithm, Centralized):
    return cluster.centralized(cost, budget, algorithm.staleness_bound)
  if isinstance(algorithm, Elastic):
    return cluster.elastic(cost, budget, algorithm.period)
  if isinstance(algorithm, Gossip):
    return cluster.gossip(cost, budget, algorithm.probability)
  if isinstance(algorithm, Decentralized):
    return cluster.decentralized(cost, budget)
  raise TypeError(f"no schedule for {type(algorithm).__name__}")


# The event kinds that can drive each family's math (jaxdl.trace).
REPLAY_KINDS = ((Collective, ("step", "wait", "partition")),
                (Centralized, ("pull", "apply", "wait", "restart")),
                (Elastic, ("local", "exchange", "wait", "restart")),
                (Gossip, ("local", "send", "gossip", "wait", "restart")),
                (Decentralized, ("pull", "average", "apply", "wait", "restart")))


def read_replay(path: str, algorithm: Family, num_workers: int) -> list[trace.Event]:
  """The events of a recorded trace.jsonl, checked against the algorithm's
  family and the worker count; a ConfigError on "replay" names what is wrong."""
  try:
    events = list(trace.read_trace(path))
  except (OSError, UnicodeDecodeError) as e:
    raise ConfigError("replay", path, f"a readable trace.jsonl ({e})") from None
  except ValueError as e:
    raise ConfigError("replay", path,
                      f"a trace.jsonl of events, one JSON object a line ({e})") from None
  allowed = next(kinds for family, kinds in REPLAY_KINDS if isinstance(algorithm, family))
  wrong = sorted({e.kind for e in events} - set(allowed))
  if wrong:
    family = type(algorithm).__name__.lower()
    raise ConfigError("replay", path, f"a trace of {family} events ({', '.join(allowed)}) "
                      f"for this algorithm, not one with {', '.join(wrong)} events")
  named = {w for e in events for w in (e.worker, e.peer) if w != -1}
  outside = sorted(w for w in named if not 0 <= w < num_workers)
  if outside:
    raise ConfigError("replay", path, f"a trace of workers 0..{num_workers - 1} "
                      f"(--workers {num_workers}); it names worker {outside[0]}")
  if not isinstance(algorithm, Collective) and named != set(range(num_workers)):
    raise ConfigError("replay", path, f"a trace of workers 0..{num_workers - 1} "
                      f"(--workers {num_workers}); it names {len(named)} workers")
  return events


def _beside(path: str, name: str, read):
  """`read` of the JSON file `name` beside a trace.jsonl; None where it is
  missing, unreadable or not as `read` expects."""
  try:
    with open(Path(path).parent / name) as f:
      return read(json.load(f))
  except (OSError, ValueError, KeyError, TypeError):
    return None


def recorded_engine(path: str) -> str | None:
  """The engine that wrote a trace.jsonl, from the config.json beside it (None:
  no readable config there)."""
  return _beside(path, "config.json", lambda c: c["algorithm"]["engine"])


def recorded_worker_cores(path: str) -> int | None:
  """How many cores each worker process of the run that wrote a trace.jsonl
  could run on, from the cluster.json beside it (None: no readable record,
  or workers with different numbers)."""
  counts = _beside(path, "cluster.json", lambda c: {
      len(p["cores"]) for p in c["processes"] if str(p["role"]).startswith("worker")})
  return counts.pop() if counts and len(counts) == 1 else None


def compute_as_recorded(path: str) -> str | None:
  """Puts this process on as many cores as each worker of the recorded run
  had (--pin-workers: one), before jax starts: XLA's CPU matrix products
  (YNNPACK's) sum in an order that depends on the number of threads, which
  follows the cores, so a replay on more cores would not give the run's bits.
  The process stays on them. Returns a warning where it cannot (jax already
  started), else None."""
  recorded = recorded_worker_cores(path)
  if recorded is None or not hasattr(os, "sched_setaffinity"):
    return None
  cores = sorted(os.sched_getaffinity(0))
  if recorded >= len(cores):
    return None
  try:  # (no public way to ask whether jax has started)
    started = xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):
    started = True  # unknown: warn rather than change what may be too late to change
  if started:
    return (f"the recorded workers each ran on {recorded} of the cores and jax already "
            f"runs on {len(cores)} in this process: the replay may not give the run's bits "
            "(replay in a new process, e.g. with the jaxdl command)")
  os.sched_setaffinity(0, cores[:recorded])
  return None


class SimEngine(base.LocalProcess):
  """Runs any algorithm along a simulated schedule; a step is a global batch of
  samples (jaxdl.trace)."""
  name = "sim"
  families = FAMILIES
  simulated = True
  fields = SimFields
  own_fields = {field: "a setting of the simulated cluster, which a run on real devices does "
                "not have" for field in cluster.MODELLED if field not in cluster.EMULATED}
  own_fields["dry_run"] = "a simulated schedule's timing alone"

  @classmethod
  def check(cls, fields: SimFields, spec) -> None:
    base.check_reduce(fields, spec, own_programs=False)

  def __init__(self, algorithm: Family, problem: Problem, streams: Streams,
               fields: SimFields, total_steps: int, batching: str = "auto",
               fused_steps: int = FUSED_STEPS, chunk_rows: int = CHUNK_ROWS):
    """`batching`: "vmap", "loop", "scan", "events" or "auto" (runner.choose_batching;
    "events" when replaying the trace of a real engine's run, whose processes
    ran `jaxdl.engines.events.EventPrograms`). `fused_steps`: the fewest steps
    of one signature that run as one program (runner.fusable; the same bits).
    `chunk_rows`: the most workers' gradients a batched op computes at once
    (handlers.CHUNK_ROWS; the bits of one op of them all, for the mlp)."""
    self.algorithm, self.problem, self.streams = algorithm, problem, streams
    self.num_workers = streams.num_workers
    check_servers(algorithm, fields.servers)
    if fields.replay:
      self.events = read_replay(fields.replay, algorithm, self.num_workers)
      self.bytes_total, self.batch_seconds = None, ()
    else:
      self.cost = cost_model(fields, problem, streams)
      partitioner = None if fields.partition == "static" else Partitioner(
          base.partition_policy(fields), streams.batch_sizes)
      schedule = make_schedule(algorithm, self.cost, total_steps, streams.batch_sizes,
                               partitioner)
      self.events, self.bytes_total = list(schedule), schedule.bytes_total
      self.batch_seconds = schedule.batch_seconds
      # The same model without the random draws it cached for the schedule
      # (with many workers, 512 a block for each worker and stream; drawn
      # again, the same, if asked for).
      self.cost = dataclasses.replace(self.cost)
    self._repartition(fields, streams)
    self.step_ends = trace.step_ends(self.events, streams.batch_sizes)
    if len(self.step_ends) < total_steps:
      raise ConfigError("replay", fields.replay,
                        f"a trace with at least {total_steps} steps of "
                        f"{sum(streams.batch_sizes)} samples")
    self.events = self.events[:self.step_ends[total_steps - 1] + 1]
    # Gossip: which slot of the in-flight buffer holds each message.
    try:
      self.slots, self.in_flight = planning.message_slots(self.events)
    except ValueError as e:
      raise ConfigError("replay", fields.replay,
                        f"a trace whose gossip messages all have their send event ({e})")
    if fields.dry_run:  # a schedule's timing alone: no math to prepare
      self.batching, self.runner = None, None
      return
    if batching not in ("auto", "vmap", "loop", "scan", "events"):
      raise ValueError(f"batching {batching!r}: one of auto, vmap, loop, scan, events")
    # (a synchronous run's steps replay as the simulator's own: its partitions are its
    # events; another engine's asynchronous run, its events one at a time)
    if batching == "auto" and fields.replay and not isinstance(
        algorithm, Collective) and recorded_engine(fields.replay) not in (None, self.name):
      batching = "events"
    if batching != "events" and any(e.kind == "restart" and e.peer >= 0 for e in self.events):
      raise ConfigError("replay", fields.replay,
                        "a trace whose restarted workers' copies replay one event at a time: "
                        "leave its config.json beside it (it names the real engine)")
    traced = trace_gradient(problem, streams.example, 1)  # shapes alone, traced once
    self.metric_names = metric_names(traced)
    if batching == "events":
      self.batching, self.runner = batching, EventReplay(algorithm, streams, fields.servers)
      return
    if batching == "auto":
      batching = choose_batching(traced)
    self.batching = batching
    sizes = planning.plan_sizes(self.events, self.step_ends[:total_steps], self.num_workers,
                                batching == "loop", self.slots)
    batches = DeviceBatches(streams, sizes.batch_ops)
    self.runner = OpRunner(handlers(algorithm, self.num_workers, sum(streams.batch_sizes),
                                    batches.pad, chunk_rows), batching, sizes.longest, batches,
                           self.metric_names, fusable(sizes.signatures, fused_steps=fused_steps))

  def _repartition(self, fields: SimFields, streams: Streams) -> None:
    """Gives the streams the partitions the events record (--partition
    proportional or adaptive: SlicedStreams)."""
    partitions = Partitions.of(streams.batch_sizes, self.events)
    if isinstance(streams, SlicedStreams):
      streams.repartition(partitions)
    elif len(partitions.all) > 1:
      raise ConfigError("replay", fields.replay,
                        f"a trace without \"partition\" events for --partition "
                        f"{fields.partition} (replay a run that split its global "
                        "batch anew with that run's --partition)")

  def init(self, key: jax.Array) -> SimState:
    m, algorithm = self.num_workers, self.algorithm

    if isinstance(algorithm, Gossip):  # the server's place: the messages in flight
      def init_all(key):
        workers = base.init_workers(algorithm.init, key, m)
        message = algorithm.send(jax.tree.map(lambda x: x[0], workers), jnp.int32(0))[1]
        return jax.tree.map(lambda x: jnp.zeros((self.in_flight, *x.shape), x.dtype),
                            message), workers
      server, workers = base.compile_init(init_all, key)(key)
    else:
      server, workers = initial_state(algorithm, key, m)
    return SimState(server, workers, np.full(m, -1, np.int32), np.zeros(m, bool),
                    np.zeros((), np.int64))

  def step(self, state: SimState, step: int):
    """Executes the schedule's events up to the end of step `step`."""
    # host-side bookkeeping, as numpy copies (a restored checkpoint may hold device arrays)
    iteration, computed = np.array(state.iteration), np.array(state.computed)
    end = self.step_ends[step]
    if self.batching == "events":
      start = int(state.position)
      server, workers, (sums, count) = self.runner(
          state.server, state.workers, self.events[start:end + 1], self.metric_names,
          self.slots[start:end + 1])
      return (SimState(server, workers, iteration, computed, np.asarray(end + 1, np.int64)),
              {k: v / count for k, v in sums.items()})
    ops = planning.plan(self.events, int(state.position), end, iteration, computed,
                        self.batching == "loop", self.slots)
    server, workers, means = self.runner(state.server, state.workers, ops)
    return SimState(server, workers, iteration, computed, np.asarray(end + 1, np.int64)), means

  def figures(self) -> dict:
    return {**base.figures(self.name, self.algorithm, self.problem, self.streams, devices=1,
                           workers_per_device=self.num_workers),
            **base.trace_figures(self.events, self.num_workers, self.bytes_total,
                                 "simulated_time_s"),
            **trace.batch_time_figures(self.batch_seconds),
            **self._in_flight_figures()}

  def _in_flight_figures(self) -> dict:
    """Gossip: the most messages in flight at once and the memory they hold."""
    if not isinstance(self.algorithm, Gossip):
      return {}
    return {"messages_in_flight_max": self.in_flight,
            "messages_in_flight_bytes": self.in_flight * self.problem.model_bytes()}

  def report(self, state: SimState) -> dict:
    return base.algorithm_report(self.algorithm, state.server)

  def jitted_functions(self) -> list:
    if self.batching == "events":
      return self.runner.programs.jitted()
    return list(self.runner.jitted.values())

  def trace(self) -> list[trace.Event]:
    return self.events

  def evaluated(self, state: SimState):
    if has_server(self.algorithm):
      return jax.device_get(self.algorithm.evaluated(state.server, state.workers))
    return jax.device_get(self.algorithm.evaluated(state.workers))
