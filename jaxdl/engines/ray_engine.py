"""The ray engine: any algorithm on real processes.

An asynchronous algorithm: a central actor (a parameter server, or the
coordinator of workers that keep their own models) and M worker actors,
each its own OS process, run the algorithm's own event functions
(`jaxdl.engines.ray_server`, `ray_shards`, `ray_coordinator`, `ray_peers`).
The driver (this process) only starts them, waits for
each step's end and fetches the state at the steps the runner reads; workers
never wait for it. The trace holds the events in the order the central actor
granted them, with wall times; `--engine sim --replay RUN/trace.jsonl` runs
the same programs in that order and reproduces the run's parameters bit for
bit. A collective algorithm: M processes that jax.distributed joins, each
running the mesh engine's step (`RayCollective`); or, where its workers'
shares of the batch differ in time (--partition proportional or adaptive,
--compute-time), M processes that each run the algorithm's step on their
own share, their collectives meeting at one actor (`RayOwnPrograms`).

A local Ray instance listens on the loopback address only, starts no
dashboard, and its processes end with the driver's however it ends;
`--ray-address HOST:PORT` joins a running cluster instead, with Ray's token
authentication on (`jaxdl.engines.ray_driver`, `ray_cluster`): the central
actor runs on the driver's node or --server-node's, the workers round robin
over the other nodes (`ray_placement`). The actors get the engine's slice
of the config, and rebuild the run from its recipe.
"""
from __future__ import annotations

import bisect
import os
import time
import uuid
from typing import Any

import jax
import numpy as np

from jaxdl import trace
from jaxdl.algorithms import (Centralized, Collective, Decentralized, Elastic, Gossip, Problem,
                              Family, names_of)
from jaxdl.algorithms.families import has_server
from jaxdl.cadence import Cadence
from jaxdl.data import Streams
from jaxdl.engines import base, ray_links, ray_placement
from jaxdl.engines.events import check_servers, take
from jaxdl.engines.host_axis import Exchange
from jaxdl.engines.mesh import MeshEngine
from jaxdl.engines.ray_collective import Process, OwnProgramsProcess
from jaxdl.engines.ray_coordinator import Coordinator
from jaxdl.engines.ray_driver import RayFields, RayRun
from jaxdl.engines.ray_peers import Peer
from jaxdl.engines.ray_server import Server, Worker
from jaxdl.engines.ray_shards import Shard, ShardedServer, ShardedWorker
from jaxdl.engines.own_programs import OwnProgramsRun
from jaxdl.errors import ConfigError

MAX_RESTARTS = 3
"""Times Ray restarts a worker's process that died, before the run fails."""
STEPS_PER_CALL = 32
"""The driver fetches the ends of up to this many steps in one call (fewer
where it reads the state): a call per step took about a third of a core."""
RESTART_TIMEOUT_S = 120.0
"""Seconds a restarting worker may take to start again."""


class RayEngine(RayRun):
  """Runs an asynchronous algorithm on a Ray server actor and M worker actors:
  a parameter server that keeps every worker's state (centralized; with
  --servers k, sharded over k shard actors besides), or a
  coordinator of workers that keep their own models (EASGD's center is at
  the coordinator; GoSGD's messages and AD-PSGD's averages go worker to
  worker). A collective algorithm runs as `RayCollective`, or `RayOwnPrograms`."""
  families = (Collective, Centralized, Elastic, Gossip, Decentralized)
  deterministic = False
  central_process = True
  own_fields = {
      "ray_address": "the Ray cluster its processes run on",
      "server_node": "the Ray node its central actor runs on",
      "pin_workers": "it pins each worker process to cores of its own",
  }
  placement = frozenset({"ray_address", "server_node", "pin_workers"})

  @classmethod
  def links(cls, fields: RayFields, nbytes: int) -> dict[str, Any] | None:
    """The links between the joined cluster's machines (`ray_links`); none
    on a local instance, one machine."""
    if fields.ray_address is None:
      return None
    return ray_links.measure(fields.ray_address, fields.server_node, nbytes)

  @classmethod
  def check(cls, fields: RayFields, spec) -> None:
    servers = fields.servers
    if servers != 1 and spec.family is not Centralized:
      raise ConfigError("servers", servers, f"1 with --engine {cls.name} for {spec.name}, "
                        "whose center is one actor (a parameter server's shards: "
                        f"{names_of(Centralized)})")
    if fields.server_node is not None and spec.family is Collective and not (
        base.runs_own_programs(fields)):
      raise ConfigError("server_node", fields.server_node, f"unset for {spec.name} on --engine "
                        f"{cls.name}: its processes meet through jax.distributed, with no "
                        "central actor (an exchange's, with --partition proportional or "
                        "adaptive or --compute-time)")
    base.check_emulation(cls, fields)
    base.check_reduce(fields, spec, own_programs=True)

  def __new__(cls, algorithm: Family, problem: Problem, streams: Streams, fields: RayFields,
              *args, **kwargs):
    if isinstance(algorithm, Collective):
      run = RayOwnPrograms if base.runs_own_programs(fields) else RayCollective
      return run(algorithm, problem, streams, fields, *args, **kwargs)
    return super().__new__(cls)

  def __init__(self, algorithm: Family, problem: Problem, streams: Streams,
               fields: RayFields, total_steps: int):
    k = fields.servers
    check_servers(algorithm, k)  # before Ray starts
    super().__init__(algorithm, problem, streams, fields)
    ray = self._ray
    # Ray restarts a worker whose process died (ray_server, ray_peers: what it rejoins with).
    self.centralized = isinstance(algorithm, Centralized)
    concurrency = max(64, 4 * self.num_workers)
    # The state travels to the driver only at the steps the runner reads it.
    cadence = Cadence.of(fields, streams.steps_per_epoch, total_steps)
    observed = [s for s in range(total_steps) if cadence.observes(s + 1)]
    self.observed, self.total_steps = observed, total_steps
    self.ended = {}  # the steps ended, fetched but not yet taken
    # The workers find the central actor by its name: Ray cannot restart an
    # actor whose constructor was given an actor handle.
    name = f"jaxdl-server-{uuid.uuid4().hex}"
    central, worker, options = ((Server, Worker, {}) if self.centralized else
                                (Coordinator, Peer, {"max_concurrency": 4}))
    args = ()
    if k > 1:  # k shard actors, found by name
      args = ([f"{name}-shard-{s}" for s in range(k)],)
      central, worker = ShardedServer, ShardedWorker
      self.shards = [ray.remote(num_cpus=0, max_restarts=0)(Shard).options(
          name=args[0][s], **self.placement.central_options()).remote(fields, s)
          for s in range(k)]
    self.server = ray.remote(num_cpus=0, max_restarts=0)(central).options(
        name=name, max_concurrency=concurrency, **self.placement.central_options()).remote(
            fields, observed, *args)
    self.workers = [ray.remote(num_cpus=0, max_restarts=MAX_RESTARTS)(worker).options(
        **options, **self.placement.worker_options(w)).remote(fields, w, name, *args)
        for w in range(self.num_workers)]
    self.restarts = [0] * self.num_workers
    self.running: dict = {}  # a worker's run (an ObjectRef) -> the worker
    self.started_workers = False
    self.events: list[trace.Event] = []
    self.trace_final = False  # the run is over: the trace fetched is the whole
    self.bytes_total, self.batch_seconds = 0, [None] * self.num_workers
    self.cpu_s = (0.0, None)

  def init(self, key: jax.Array):
    """The state at step 0; every actor has compiled its programs when it returns."""
    state = self._get(self.server.initialize.remote(np.asarray(jax.random.key_data(key))))
    warm = [self.server.warm_up.remote()] + [
        worker.warm_up.remote(take(state[1], w)) for w, worker in enumerate(self.workers)]
    for ref in warm:
      self._get(ref)
    return state

  def _get(self, ref):
    """ray.get of `ref`; meanwhile a worker whose process died is restarted,
    and an error a worker raised is raised here."""
    ray = self._ray
    while True:
      ready, _ = ray.wait([ref, *self.running], num_returns=1)
      if ready[0] is ref:
        return ray.get(ref)
      w = self.running.pop(ready[0])
      try:
        ray.get(ready[0])  # returns once the run is over
      except ray.exceptions.RayActorError:  # died, or unavailable while it restarts
        self._restart(w)

  def _restart(self, w: int) -> None:
    """Worker w's process died: once Ray has restarted the actor, a
    parameter server's worker drops its in-flight iteration and pulls again
    at its clock (not with compressed messages: its residual died with it);
    a worker that kept its own model rejoins with a copy of the next live
    worker's state (not with compressed gossip or averages: its pairwise
    references died with it)."""
    ray = self._ray
    self.restarts[w] += 1
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while True:
      try:  # an ActorDiedError once Ray has given up restarting it
        ray.get(self.workers[w].identity.remote())
        break
      except ray.exceptions.ActorUnavailableError:  # still restarting
        if time.monotonic() > deadline:
          raise
        time.sleep(0.1)
    held = [what for compressed, what in (
        (self.problem.compresses, "its error-feedback residual (--compress)"),
        (self.problem.compresses_pull, "its copy of the server's parameters (--compress-pull)"))
        if compressed and self.centralized]
    if held:
      raise RuntimeError(f"worker {w}'s process died, and with it {' and '.join(held)}, which "
                         "no other process holds; --resume continues the run from its last "
                         "checkpoint")
    if self.centralized:
      incarnation = ray.get(self.server.restarted.remote(w))
      self.running[self.workers[w].run.remote(incarnation)] = w
      return
    if self.problem.compresses and isinstance(self.algorithm, (Gossip, Decentralized)):
      raise RuntimeError(f"worker {w}'s process died, and with it its ends of the references "
                         "it shared with every peer (--compress): no other worker's copy can "
                         "stand in for them; --resume continues the run from its last "
                         "checkpoint")
    for i in range(1, self.num_workers):
      donor = self.workers[(w + i) % self.num_workers]
      try:
        given = ray.get(donor.donate.remote(w))
      except ray.exceptions.RayActorError:  # that one's process died too
        continue
      if given is not None:
        state, works_on, clock, incarnation = given
        if works_on:
          self.running[self.workers[w].run.remote(state, clock, self.workers,
                                                  incarnation)] = w
        return
    raise RuntimeError(f"worker {w}'s process died, and its model with it: no other worker "
                       "has a model to restart it from; --resume continues the run from its "
                       "last checkpoint")

  def step(self, state, step: int):
    if not self.started_workers:  # at the first step (after a restore, from it)
      self._get(self.server.begin.remote(state, step))
      if self.centralized:
        runs = [worker.run.remote() for worker in self.workers]
      else:  # every worker has its model before any starts
        for ref in [worker.begin.remote(take(state[1], w))
                    for w, worker in enumerate(self.workers)]:
          self._get(ref)
        runs = [worker.run.remote(None, int(state[2][w]), self.workers)
                for w, worker in enumerate(self.workers)]
      self.running = dict(zip(runs, range(self.num_workers)))
      self.started_workers = True
    if step not in self.ended:  # this step's and the next ones', up to the next one observed
      observed = self.observed[bisect.bisect_left(self.observed, step):]
      last = min(observed[:1] + [step + STEPS_PER_CALL - 1, self.total_steps - 1])
      self.ended = dict(enumerate(self._get(self.server.steps.remote(step, last)), step))
    new, means = self.ended.pop(step)
    # The state at a step whose end the runner does not read is not gathered.
    return state if new is None else new, {k: np.float32(v) for k, v in means.items()}

  def _fetch_trace(self) -> None:
    if self.server is not None and not self.trace_final:
      (start, events, self.bytes_total, self.batch_seconds, self.cpu_s,
       self.trace_final) = self._get(self.server.trace.remote(len(self.events)))
      self.events[start:] = events

  def trace(self) -> list[trace.Event]:
    self._fetch_trace()
    return self.events

  def figures(self) -> dict[str, Any]:
    self._fetch_trace()
    return {**base.figures(self.name, self.algorithm, self.problem, self.streams,
                           devices=1, workers_per_device=self.num_workers,
                           # and the driver, the server (its shards)
                           processes=self.num_workers + 2 + len(self.shards)),
            **base.trace_figures(self.events, self.num_workers, self.bytes_total),
            "batch_seconds_per_worker": self.batch_seconds,
            # what --engine sim models as simulated_time_s: the clock at the last event
            "trace_time_s": self.events[-1].time if self.events else 0.0,
            # CPU seconds until then: the server's or coordinator's (all its
            # threads), and its machine's (every process; Linux)
            "central_cpu_s": self.cpu_s[0], "machine_cpu_s": self.cpu_s[1],
            "restarts_per_worker": list(self.restarts),
            # each worker's node at the end (a restarted worker's: where Ray restarted it)
            "worker_nodes": ray_placement.nodes_of(self._ray, self.workers)[1:]}

  def report(self, state) -> dict[str, float]:
    return base.algorithm_report(self.algorithm, state[0])

  def evaluated(self, state):
    # as device arrays, as the sim engine's: numpy would round its own way
    server, workers, _ = jax.device_put(state)
    if has_server(self.algorithm):
      return jax.device_get(self.algorithm.evaluated(server, workers))
    return jax.device_get(self.algorithm.evaluated(workers))


class RayCollective(RayRun):
  """A collective algorithm (bsp, ar_sgd, local_sgd) on M processes that
  jax.distributed joins, one device and one worker each (`ray_collective.Process`):
  each runs the mesh engine's step, the algorithm's collectives across the
  processes (gloo on CPUs). The driver steps them together and gathers the
  state at the steps the runner reads.

  The trace's clock is the steps' seconds (from the driver's call to the
  last reply; its compile and first run are before it, evaluations between
  steps outside it). The step is one program across the processes, which
  end it together: a worker's "wait" is its seconds in the step beyond the
  quickest process's, the time it waited for the last to begin the step.
  (A process slower inside the program holds the others at its collectives
  unseen: timing a worker's compute apart from them takes a program of its
  own, `RayOwnPrograms`.)"""
  families = (Collective,)

  def __init__(self, algorithm: Family, problem: Problem, streams: Streams,
               fields: RayFields, total_steps: int):
    super().__init__(algorithm, problem, streams, fields)
    ray, m = self._ray, self.num_workers
    env = {"XLA_FLAGS": one_device(os.environ.get("XLA_FLAGS", ""))}
    self.workers = [ray.remote(num_cpus=0, max_restarts=0)(Process).options(
        runtime_env={"env_vars": env}, **self.placement.worker_options(w)).remote(fields, w, m)
        for w in range(m)]
    address = ray.get(self.workers[0].address.remote())
    ray.get([p.join.remote(address, fields.coordinator_timeout) for p in self.workers])
    self.cadence = Cadence.of(fields, streams.steps_per_epoch, total_steps)
    self.total_steps = total_steps
    self.layout = MeshEngine(algorithm, problem, streams)  # rows, evaluation
    self.events: list[trace.Event] = []
    self.begun, self.clock = False, 0.0  # the steps' seconds so far

  def _on_all(self, method: str, *args):
    """Calls `method` on every process (together: it may be a collective);
    process 0's reply."""
    return self._ray.get([getattr(p, method).remote(*args) for p in self.workers])[0]

  def init(self, key: jax.Array):
    """The state at step 0 (every process has compiled its step and run it once)."""
    self._on_all("init", np.asarray(jax.random.key_data(key)))
    return self._on_all("state")

  def step(self, state, step: int):
    if not self.begun:
      self.begun = True
      if step:  # from a checkpoint's state
        self._on_all("begin", state)
    # The state at a step whose end the runner does not read is not gathered.
    gather = self.cadence.observes(step + 1)
    begin = time.perf_counter()
    replies = self._ray.get([p.step.remote(step, gather) for p in self.workers])
    self.clock += time.perf_counter() - begin
    seconds = [r[0] for r in replies]
    self.events += base.synchronous_events(self.clock, step, [s - min(seconds) for s in seconds])
    metrics, new = replies[0][1]
    return new if gather else state, metrics

  def trace(self) -> list[trace.Event]:
    return self.events

  def figures(self) -> dict[str, Any]:
    return {**base.figures(self.name, self.algorithm, self.problem, self.streams,
                           devices=self.num_workers, workers_per_device=1,
                           processes=self.num_workers + 1),  # and the driver
            **base.synchronous_figures(self.algorithm, self.problem, self.num_workers,
                                       self.events, self.total_steps)}

  def report(self, state) -> dict[str, float]:
    return {}

  def evaluated(self, state):
    return self.layout.evaluated(state)


class RayOwnPrograms(OwnProgramsRun, RayRun):
  """The ray engine's form of `jaxdl.engines.own_programs.OwnProgramsRun`: the M workers
  are processes (`ray_collective.OwnProgramsProcess`), their collectives meeting at an
  `Exchange` actor that sums in host memory or on a device (--reduce; on a
  GPU when the cluster has one)."""

  def __init__(self, algorithm: Family, problem: Problem, streams: Streams,
               fields: RayFields, total_steps: int):
    super().__init__(algorithm, problem, streams, fields)
    ray, m = self._ray, self.num_workers
    name = f"jaxdl-exchange-{uuid.uuid4().hex}"
    reduce = fields.reduce
    gpus = 1 if reduce == "device" and self.placement.central_gpus >= 1 else 0
    self.server = ray.remote(num_cpus=0, num_gpus=gpus, max_restarts=0)(Exchange).options(
        name=name, max_concurrency=max(64, 4 * m), **self.placement.central_options()).remote(
            m, reduce)
    self.workers = [ray.remote(num_cpus=0, max_restarts=0)(OwnProgramsProcess).options(
        **self.placement.worker_options(w)).remote(fields, w, name) for w in range(m)]
    self._begin_partitions(fields, total_steps)

  def _all(self, method: str, *args) -> list:
    return self._wait([getattr(w, method).remote(*args) for w in self.workers])

  def _step_all(self, step: int) -> list:
    # A step with nothing from the driver after it is followed at once by the
    # next: each worker's actor runs its calls in order, so the next begins as
    # the worker ends this one, not after a round trip to the driver.
    replies = self.next_replies if self.ahead else [w.step.remote(step) for w in self.workers]
    self.ahead = self._runs_ahead(step)
    if self.ahead:
      self.next_replies = [w.step.remote(step + 1) for w in self.workers]
    return self._wait(replies)

  def _wait(self, replies: list) -> list:
    ray = self._ray
    pending = replies
    while True:  # all replies at once; while some are late, whether one failed
      done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
      if not pending:
        return ray.get(replies)
      try:
        ray.get(done)
      except Exception:  # one failed: the others leave the exchange with an error
        self.server.abort.remote()
        raise

  def _reduce_seconds(self) -> float:
    return self._ray.get(self.server.reduce_seconds.remote())

  def figures(self) -> dict[str, Any]:
    return self.partition_figures(devices=self.num_workers,
                              processes=self.num_workers + 2)  # the exchange and the driver


def one_device(xla_flags: str) -> str:
  """XLA_FLAGS with one host device: a collective run's process holds one worker."""
  kept = [f for f in xla_flags.split() if not f.startswith(
      "--xla_force_host_platform_device_count")]
  return " ".join(kept + ["--xla_force_host_platform_device_count=1"])
