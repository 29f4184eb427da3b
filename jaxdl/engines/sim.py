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


def _masked(fn):
  """vmap `fn(worker, batch) -> (worker, metric shares)` over all M workers,
  keeping the old state where `mask` is off; metrics as masked sums."""
  def run(workers, batch, mask):
    new, metrics = jax.vmap(fn)(workers, batch)
    keep = lambda n, o: jnp.where(mask.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
    share = batch.weights.sum(axis=1)  # metric shares -> each worker's own means
    return (jax.tree.map(keep, new, workers),
            {"loss_sum": jnp.sum(metrics["loss"] / share * mask), "count": jnp.sum(mask)})
  return jax.jit(run, donate_argnums=0)


class EventMath:
  """The algorithm's event handlers, jitted once each, over stacked workers."""

  def __init__(self, algorithm: Algorithm, problem: Problem, config):
    bind = lambda fn: functools.partial(fn, problem, config)
    one = WorkerAxis(size=1)  # asynchronous workers share no collective
    self.jitted = {}
    if algorithm.compute:
      self.compute = self.jitted["compute"] = _masked(
          functools.partial(bind(algorithm.compute), axis=one))
    if algorithm.local:
      self.local = self.jitted["local"] = _masked(
          functools.partial(bind(algorithm.local), axis=one))
    # A timed algorithm's pull and apply also get the event's duration.
    timed = lambda fn: fn if algorithm.timed else lambda server, worker, duration: fn(server, worker)
    if algorithm.pull:
      pull = timed(bind(algorithm.pull))
      self.pull = self.jitted["pull"] = jax.jit(
          lambda server, workers, m, duration: _put(
              workers, m, pull(server, _take(workers, m), duration)),
          donate_argnums=1)
    if algorithm.apply:
      apply = timed(bind(algorithm.apply))

      def apply_fn(server, workers, m, duration):
        server, worker = apply(server, _take(workers, m), duration)
        return server, _put(workers, m, worker)
      self.apply = self.jitted["apply"] = jax.jit(apply_fn, donate_argnums=(0, 1))
    if algorithm.exchange:
      exchange = bind(algorithm.exchange)

      def exchange_fn(server, workers, m):
        server, worker = exchange(server, _take(workers, m))
        return server, _put(workers, m, worker)
      self.exchange = self.jitted["exchange"] = jax.jit(exchange_fn, donate_argnums=(0, 1))
    if algorithm.step:  # a collective algorithm: all workers vmapped on this device
      m = config.algorithm.workers
      axis = WorkerAxis(size=m, local="workers", local_size=m)
      step = jax.vmap(functools.partial(bind(algorithm.step), axis=axis),
                      in_axes=(0, 0, None), axis_name="workers")

      def step_all(workers, batch, index):
        workers, metrics = step(workers, batch, index)
        return workers, jax.tree.map(jnp.sum, metrics)
      self.step = self.jitted["step"] = jax.jit(step_all, donate_argnums=0)
    if algorithm.apply and algorithm.pull:
      # A worker's push and its next pull, as in a parameter server's round
      # trip, in one call: half the dispatches of a centralized schedule.
      def apply_pull(server, workers, m, applied, pulled):
        server, worker = apply(server, _take(workers, m), applied)
        return server, _put(workers, m, pull(server, worker, pulled))
      self.apply_pull = self.jitted["apply_pull"] = jax.jit(apply_pull, donate_argnums=(0, 1))
    if algorithm.pair:
      pair = bind(algorithm.pair)

      def pair_fn(workers, m, k):
        a, b = pair(_take(workers, m), _take(workers, k))
        return _put(_put(workers, m, a), k, b)
      self.pair = self.jitted["pair"] = jax.jit(pair_fn, donate_argnums=0)


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
    self.math = EventMath(algorithm, problem, config)

  def init(self, key: jax.Array) -> SimState:
    m, a, problem, config = self.num_workers, self.algorithm, self.problem, self.config

    def init_all(key):
      workers = jax.vmap(lambda w: a.init(problem, config, key, w, m))(jnp.arange(m))
      return (a.init_server(problem, config, key) if a.init_server else ()), workers
    server, workers = compile_init(init_all, key)(key)
    return SimState(server, workers, np.full(m, -1, np.int32), np.zeros(m, bool),
                    np.zeros((), np.int64))

  def _batch(self, pairs) -> Batch:
    return Batch(*self.streams.stacked_batches(pairs))

  def _compute_pending(self, state: SimState, sums: list) -> SimState:
    pending = (state.iteration >= 0) & ~state.computed
    batch = self._batch([(w, max(int(c), 0)) for w, c in enumerate(state.iteration)])
    workers, metrics = self.math.compute(state.workers, batch, jnp.asarray(pending))
    sums.append(metrics)
    return state._replace(workers=workers, computed=state.computed | pending)

  def _flush_local(self, state: SimState, queued: list[list[int]], sums: list) -> SimState:
    """Runs every queued local step, one vmapped call per round of them."""
    while any(queued):
      mask = np.array([bool(q) for q in queued])
      batch = self._batch([(w, q[0] if q else 0) for w, q in enumerate(queued)])
      workers, metrics = self.math.local(state.workers, batch, jnp.asarray(mask))
      state = state._replace(workers=workers)
      sums.append(metrics)
      for q in queued:
        if q:
          q.pop(0)
    return state

  def step(self, state: SimState, step: int):
    """Executes the schedule's events up to the end of step `step`."""
    # host-side bookkeeping, as numpy copies (a restored checkpoint may hold device arrays)
    state = state._replace(iteration=np.array(state.iteration), computed=np.array(state.computed))
    queued: list[list[int]] = [[] for _ in range(self.num_workers)]
    sums: list = []
    end = self.step_ends[step]
    index = int(state.position)
    while index <= end:
      event = self.events[index]
      index += 1
      m, kind = event.worker, event.kind
      if kind == "pull":
        state = state._replace(workers=self.math.pull(state.server, state.workers, m,
                                                      np.float32(event.duration)))
        state.iteration[m], state.computed[m] = event.iteration, False
      elif kind == "apply":
        if not state.computed[m]:
          state = self._compute_pending(state, sums)
        following = self.events[index] if index <= end else None
        if following is not None and following.kind == "pull" and following.worker == m:
          server, workers = self.math.apply_pull(state.server, state.workers, m,
                                                 np.float32(event.duration),
                                                 np.float32(following.duration))
          state.iteration[m], state.computed[m] = following.iteration, False
          index += 1
        else:
          server, workers = self.math.apply(state.server, state.workers, m,
                                            np.float32(event.duration))
          state.computed[m], state.iteration[m] = False, -1
        state = state._replace(server=server, workers=workers)
      elif kind == "local":
        queued[m].append(event.iteration)
      elif kind == "exchange":
        if queued[m]:
          state = self._flush_local(state, queued, sums)
        server, workers = self.math.exchange(state.server, state.workers, m)
        state = state._replace(server=server, workers=workers)
      elif kind == "step":
        batch = self._batch([(w, event.iteration) for w in range(self.num_workers)])
        workers, metrics = self.math.step(state.workers, batch, jnp.int32(event.iteration))
        state = state._replace(workers=workers)
        sums.append({"loss_sum": metrics["loss"], "count": 1.0})
      elif kind in ("gossip", "average"):
        if queued[m] or queued[event.peer]:
          state = self._flush_local(state, queued, sums)
        state = state._replace(workers=self.math.pair(state.workers, m, event.peer))
    state = self._flush_local(state, queued, sums)
    return state._replace(position=np.asarray(end + 1, np.int64)), _mean_metrics(sums)

  def info(self) -> dict:
    stats = sim.summarize(self.events, self.num_workers, self.bytes_total)
    return {"engine": "sim", "devices": 1, "workers_per_device": self.num_workers,
            "processes": 1, "batch_sizes": list(self.streams.batch_sizes),
            **{k: stats[k] for k in ("simulated_time_s", "staleness_mean", "staleness_max",
                                     "staleness_histogram", "wait_s", "bytes_total")},
            "bytes_communicated_per_step": self.algorithm.bytes_per_step(
                self.config, self.problem.model_bytes(), self.num_workers)}

  def jitted_functions(self) -> list:
    return list(self.math.jitted.values())

  def write_trace(self, path) -> None:
    sim.write_trace(path, self.events)

  def evaluated(self, state: SimState):
    parts = (state.workers,) if self.algorithm.step else (state.server, state.workers)
    return jax.device_get(self.algorithm.evaluated(self.problem, self.config, *parts))


def _mean_metrics(sums: list[dict]) -> dict:
  if not sums:
    return {"loss": jnp.nan}
  total = jax.tree.map(lambda *x: sum(x), *sums)
  return {"loss": total["loss_sum"] / total["count"]}
