"""The sim engine: an algorithm's real math in the order of a simulated cluster.

A schedule (jaxdl.sim) says which events happen and in which order, from a
cost model of the cluster; this engine executes their math on one device.
Parameters therefore depend only on the schedule: the same config and seed
give the same schedule and the same bits, and a recorded schedule replays.

Independent worker computations are batched: a worker's gradient depends
only on the parameters it pulled and its batch, so all workers waiting for a
gradient are computed together, from their stacked pulled versions (the
staleness buffer). The host plans a step's events as ops and the device runs
them, with batches gathered on the device (jaxdl.engines.sim_ops).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.algorithms import Algorithm, Problem
from jaxdl.data import WorkerStreams
from jaxdl.errors import ConfigError
from jaxdl.engines.mesh import compile_init
from jaxdl.engines import sim_ops
from jaxdl import sim


class SimState(NamedTuple):
  server: Any
  workers: Any            # every worker's state, stacked over workers
  iteration: np.ndarray   # (M,) int: the iteration each worker works on (-1: none)
  computed: np.ndarray    # (M,) bool: its gradient is computed, not yet applied
  position: np.ndarray    # (): index of the next schedule event


def flops_per_batch(problem: Problem, streams: WorkerStreams) -> float:
  """XLA's FLOP count of one worker's gradient on a mean-size batch (no compile)."""
  traced = sim_ops.trace_gradient(problem, round(np.mean(streams.batch_sizes)))
  return float(traced.lower().cost_analysis()["flops"])


def cost_model(config, problem: Problem, streams: WorkerStreams) -> sim.CostModel:
  """The simulated cluster that `config` describes, for this model and data."""
  c = config.cluster
  count, profile = sim.parse_cluster(c.cluster)
  m = streams.num_workers
  if count is not None and count != m:
    raise ConfigError("cluster", c.cluster, f"a count equal to --workers {m}, or none")
  mean_batch = np.mean(streams.batch_sizes)
  # A worker's time grows with its batch and shrinks with its speed.
  speeds = tuple((c.worker_speeds or (1.0,) * m)[w] * mean_batch / b
                 for w, b in enumerate(streams.batch_sizes))
  flops = None if c.compute_time else flops_per_batch(problem, streams)
  return sim.CostModel.build(
      m, problem.model_bytes(), compute_s=c.compute_time, flops_per_batch=flops,
      profile=profile, network=c.network, latency=c.latency, servers=c.servers,
      speeds=speeds, jitter=c.jitter, straggler_prob=c.straggler_prob,
      straggler_slowdown=c.straggler_slowdown, seed=config.train.seed)


def make_schedule(algorithm: Algorithm, config, cost: sim.CostModel,
                  total_steps: int) -> sim.Schedule:
  """A schedule long enough for `total_steps` steps of M updates each."""
  iterations = total_steps + 2
  while True:
    schedule = algorithm.schedule(cost, iterations, config)
    if len(_step_ends(schedule, cost.num_workers)) >= total_steps:
      return schedule
    iterations *= 2  # slow workers left the fast ones short of updates


def _step_ends(events, num_workers: int) -> list[int]:
  """Index of the event that completes each step (every M-th worker iteration;
  a synchronous "step" event is all M at once)."""
  ends, done = [], 0
  for i, e in enumerate(events):
    done += num_workers if e.kind == "step" else e.kind in ("apply", "local")
    if done and done % num_workers == 0 and e.kind in ("apply", "local", "step"):
      ends.append(i)
  return ends


class SimEngine:
  """Runs an event algorithm along a schedule; one step = M updates."""

  def __init__(self, algorithm: Algorithm, problem: Problem, streams: WorkerStreams,
               config, total_steps: int, batching: str = "auto"):
    """`batching`: "vmap", "loop", "scan" or "auto" (sim_ops.choose_batching)."""
    self.algorithm, self.problem, self.streams, self.config = algorithm, problem, streams, config
    self.num_workers = streams.num_workers
    if config.output.replay:
      self.events = list(sim.read_trace(config.output.replay))
      self.bytes_total = None
    else:
      self.cost = cost_model(config, problem, streams)
      schedule = make_schedule(algorithm, config, self.cost, total_steps)
      self.events, self.bytes_total = list(schedule), schedule.bytes_total
    self.step_ends = _step_ends(self.events, self.num_workers)
    if len(self.step_ends) < total_steps:
      raise ConfigError("replay", config.output.replay,
                      f"a trace with at least {total_steps} steps of {self.num_workers} updates")
    self.events = self.events[:self.step_ends[total_steps - 1] + 1]
    if config.output.dry_run:  # a schedule's timing alone: no math to prepare
      self.batching, self.runner = None, None
      return
    if batching not in ("auto", "vmap", "loop", "scan"):
      raise ValueError(f"batching {batching!r}: one of auto, vmap, loop, scan")
    if batching == "auto":
      batching = sim_ops.choose_batching(problem, max(streams.batch_sizes))
    self.batching = batching
    longest, batch_ops = sim_ops.plan_sizes(self.events, self.step_ends[:total_steps],
                                            self.num_workers, batching == "loop")
    batches = sim_ops.DeviceBatches(streams, batch_ops)
    self.runner = sim_ops.OpRunner(
        sim_ops.handlers(algorithm, problem, config, batches.weights), batching, longest, batches)

  def init(self, key: jax.Array) -> SimState:
    m, a, problem, config = self.num_workers, self.algorithm, self.problem, self.config

    def init_all(key):
      workers = jax.vmap(lambda w: a.init(problem, config, key, w, m))(jnp.arange(m))
      return (a.init_server(problem, config, key) if a.init_server else ()), workers
    server, workers = compile_init(init_all, key)(key)
    return SimState(server, workers, np.full(m, -1, np.int32), np.zeros(m, bool),
                    np.zeros((), np.int64))

  def step(self, state: SimState, step: int):
    """Executes the schedule's events up to the end of step `step`."""
    # host-side bookkeeping, as numpy copies (a restored checkpoint may hold device arrays)
    iteration, computed = np.array(state.iteration), np.array(state.computed)
    end = self.step_ends[step]
    ops = sim_ops.plan(self.events, int(state.position), end, iteration, computed,
                       self.batching == "loop")
    server, workers, (loss_sum, count) = self.runner(state.server, state.workers, ops)
    return (SimState(server, workers, iteration, computed, np.asarray(end + 1, np.int64)),
            {"loss": loss_sum / count})

  def info(self) -> dict:
    stats = sim.summarize(self.events, self.num_workers, self.bytes_total)
    return {"engine": "sim", "devices": 1, "workers_per_device": self.num_workers,
            "processes": 1, "batch_sizes": list(self.streams.batch_sizes),
            **{k: stats[k] for k in ("simulated_time_s", "staleness_mean", "staleness_max",
                                     "staleness_histogram", "wait_s", "bytes_total")},
            "bytes_communicated_per_step": self.algorithm.bytes_per_step(
                self.config, self.problem.model_bytes(), self.num_workers)}

  def report(self, state: SimState) -> dict:
    """The algorithm's own figures for the summary (e.g. predictor errors)."""
    if not self.algorithm.report:
      return {}
    figures = self.algorithm.report(self.problem, self.config, state.server)
    return {k: float(v) for k, v in jax.device_get(figures).items()}

  def jitted_functions(self) -> list:
    return list(self.runner.jitted.values())

  def write_trace(self, path) -> None:
    sim.write_trace(path, self.events)

  def evaluated(self, state: SimState):
    parts = (state.workers,) if self.algorithm.step else (state.server, state.workers)
    return jax.device_get(self.algorithm.evaluated(self.problem, self.config, *parts))

