"""The sim engine: an algorithm's real math in the order of a simulated cluster.

A schedule (jaxdl.sim) says which events happen and in which order, from a
cost model of the cluster; this engine executes their math on one device.
Parameters therefore depend only on the schedule: the same config and seed
give the same schedule and the same bits, and a recorded schedule replays.

Independent worker computations are batched: a worker's gradient depends
only on the parameters it pulled and its batch, so all workers waiting for a
gradient are computed in one vmapped call over their stacked pulled versions
(the staleness buffer), M slots at a time with the idle ones masked. Server
updates run one jitted call each, in schedule order.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.algorithms import Algorithm, Batch, Problem, WorkerAxis
from jaxdl.data import WorkerStreams
from jaxdl.errors import ConfigError
from jaxdl.engines.mesh import compile_init
from jaxdl import sim
from jaxdl.sim.events import Event


class SimState(NamedTuple):
  server: Any
  workers: Any            # every worker's state, stacked over workers
  iteration: np.ndarray   # (M,) int: the iteration each worker works on (-1: none)
  computed: np.ndarray    # (M,) bool: its gradient is computed, not yet applied
  position: np.ndarray    # (): index of the next schedule event


def _take(tree, m):
  return jax.tree.map(lambda x: x[m], tree)


def _put(tree, m, value):
  return jax.tree.map(lambda x, v: x.at[m].set(v), tree, value)


class CentralizedRunner:
  """Jitted math of a centralized algorithm: pull, batched compute, apply."""

  def __init__(self, algorithm: Algorithm, problem: Problem, config):
    one = WorkerAxis(size=1)  # asynchronous workers share no collective
    compute = functools.partial(algorithm.compute, problem, config, axis=one)

    def compute_masked(workers, batch, mask):
      new, metrics = jax.vmap(compute)(workers, batch)
      keep = lambda n, o: jnp.where(mask.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
      share = batch.weights.sum(axis=1)
      own_loss = metrics["loss"] / share  # each worker's mean loss on its batch
      return (jax.tree.map(keep, new, workers),
              {"loss_sum": jnp.sum(own_loss * mask),
               "accuracy_sum": jnp.sum(metrics["accuracy"] / share * mask),
               "count": jnp.sum(mask)})

    def pull(server, workers, m):
      return _put(workers, m, algorithm.pull(problem, config, server, _take(workers, m)))

    def apply(server, workers, m):
      return algorithm.apply(problem, config, server, _take(workers, m))

    self.compute = jax.jit(compute_masked, donate_argnums=0)
    self.pull = jax.jit(pull, donate_argnums=1)
    self.apply = jax.jit(apply, donate_argnums=0)


def model_bytes(problem: Problem) -> int:
  shapes = jax.eval_shape(lambda: problem.model.init(jax.random.key(0))[0])
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def flops_per_batch(problem: Problem, streams: WorkerStreams) -> float:
  """XLA's FLOP count of one worker's gradient on a mean-size batch (no compile)."""
  params, model_state = jax.eval_shape(problem.model.init, jax.random.key(0))
  b = round(np.mean(streams.batch_sizes))
  shape = streams.split.gather(np.arange(1))[0].shape[1:]
  batch = Batch(jax.ShapeDtypeStruct((b, *shape), jnp.float32),
                jax.ShapeDtypeStruct((b,), jnp.int32), jax.ShapeDtypeStruct((b,), jnp.float32))
  grad = lambda p, s, x: problem.gradients(p, s, x, WorkerAxis(1))
  return float(jax.jit(grad).lower(params, model_state, batch).cost_analysis()["flops"])


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
      m, model_bytes(problem), compute_s=c.compute_time, flops_per_batch=flops,
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
  """Index of the event that completes each step (every M-th update)."""
  updates = [i for i, e in enumerate(events) if e.kind in ("apply", "step")]
  return updates[num_workers - 1::num_workers]


class SimEngine:
  """Runs an event algorithm along a schedule; one step = M updates."""

  def __init__(self, algorithm: Algorithm, problem: Problem, streams: WorkerStreams,
               config, total_steps: int):
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
    self.math = CentralizedRunner(algorithm, problem, config)

  def init(self, key: jax.Array) -> SimState:
    m, a, problem, config = self.num_workers, self.algorithm, self.problem, self.config

    def init_all(key):
      workers = jax.vmap(lambda w: a.init(problem, config, key, w, m))(jnp.arange(m))
      return a.init_server(problem, config, key), workers
    server, workers = compile_init(init_all, key)(key)
    return SimState(server, workers, np.full(m, -1, np.int32), np.zeros(m, bool),
                    np.zeros((), np.int64))

  def _compute_pending(self, state: SimState) -> tuple[SimState, dict]:
    pending = (state.iteration >= 0) & ~state.computed
    pairs = [(w, max(int(c), 0)) for w, c in enumerate(state.iteration)]
    batch = Batch(*self.streams.stacked_batches(pairs))
    workers, metrics = self.math.compute(state.workers, batch, jnp.asarray(pending))
    return state._replace(workers=workers, computed=state.computed | pending), metrics

  def step(self, state: SimState, step: int):
    """Executes the schedule's events up to the end of step `step`."""
    server, iteration, computed = state.server, state.iteration.copy(), state.computed.copy()
    state = state._replace(iteration=iteration, computed=computed)
    sums = []
    end = self.step_ends[step]
    for index in range(int(state.position), end + 1):
      event = self.events[index]
      m = event.worker
      if event.kind == "pull":
        state = state._replace(workers=self.math.pull(state.server, state.workers, m))
        state.iteration[m], state.computed[m] = event.iteration, False
      elif event.kind == "apply":
        if not state.computed[m]:
          state, metrics = self._compute_pending(state)
          sums.append(metrics)
        state = state._replace(server=self.math.apply(state.server, state.workers, m))
        state.computed[m], state.iteration[m] = False, -1
    del server
    state = state._replace(position=np.asarray(end + 1, np.int64))
    return state, _mean_metrics(sums)

  def info(self) -> dict:
    stats = sim.summarize(self.events, self.num_workers, self.bytes_total)
    return {"engine": "sim", "devices": 1, "workers_per_device": self.num_workers,
            "processes": 1, "batch_sizes": list(self.streams.batch_sizes),
            **{k: stats[k] for k in ("simulated_time_s", "staleness_mean", "staleness_max",
                                     "staleness_histogram", "wait_s", "bytes_total")},
            "bytes_communicated_per_step": self.algorithm.bytes_per_step(
                self.config, model_bytes(self.problem), self.num_workers)}

  def jitted_functions(self) -> list:
    return [self.math.compute, self.math.pull, self.math.apply]

  def write_trace(self, path) -> None:
    sim.write_trace(path, self.events)

  def evaluated(self, state: SimState):
    return jax.device_get(self.algorithm.evaluated(self.problem, self.config,
                                                   state.server, state.workers))


def _mean_metrics(sums: list[dict]) -> dict:
  if not sums:
    return {"loss": jnp.nan, "accuracy": jnp.nan}
  total = jax.tree.map(lambda *x: sum(x), *sums)
  return {"loss": total["loss_sum"] / total["count"],
          "accuracy": total["accuracy_sum"] / total["count"]}
