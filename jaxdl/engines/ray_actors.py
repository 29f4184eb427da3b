"""The ray engine's processes: a central actor and its workers.

Each actor builds its own algorithm, model and data stream from the run's
config (and a script's task, sent once when the actor starts), and runs the
algorithm's event functions as `jaxdl.engines.events.EventPrograms`: the
programs the sim engine replays. Nothing here is algorithm math.

The central actor records each event with its wall time (seconds since the
run started), in the order the events' math ran, and ends the run once the
workers together have processed the budget of samples; what a worker does
after that is dropped, as an iteration still in flight at the end of a
simulated schedule is. A parameter server (`Server`, with `Worker`) applies
every push on arrival, in the order pushes really arrive, and under SSP
holds a worker's pull until the slowest clock allows it; split into k
shards (`ShardedServer`, `Shard`, `ShardedWorker`), it keeps that order
while each shard applies its own leaves of every push. A `Coordinator`
(with `Peer`) serves workers that keep their own models: EASGD, GoSGD,
AD-PSGD. Every message travels as one buffer of its leaves' bytes
(`packed`; a compressed one's are its payload's), and `bytes_total`
counts each as Ray serializes it (`wire_bytes`).

With --compute-time every worker emulates a device of the simulator's cost
model: it sleeps until each iteration's compute has taken the modelled time
(`jaxdl.cluster.CostModel.compute_time(worker, iteration)`: --worker-speeds,
--jitter, stragglers; the sim engine's draws), if its real compute took
less. The trace's compute durations are those padded times.

A worker whose process dies is restarted by Ray. A parameter server's
worker pulls again at its clock (its in-flight iteration is dropped), sent
its whole state (the driver refuses this with compressed messages: what
only the worker held, its residual, is lost). A
worker that kept its own model rejoins with a copy of another worker's
whole state, taken in the trace's order (a "restart" event naming that
peer); whatever the dead process held that no other process had is lost
with it, in the run as in its replay. Calls made by a dead process's
incarnation that arrive after its restart are refused.
"""
from __future__ import annotations

import asyncio
import math
import os
import pickle
import threading
import time
from typing import Any, Sequence

import jax
import numpy as np

from jaxdl.algorithms import Elastic, Gossip
from jaxdl.engines.base import process_identity, slowed
from jaxdl.engines.events import (EventPrograms, initial_state, one_batch, stack, state_shapes,
                                  take)
from jaxdl.engines.sim import cost_model
from jaxdl.engines.split import SplitWorker
from jaxdl.trace import Event


def _built(config, task):
  from jaxdl.build import prepare  # heavy: only in the actors' processes
  return prepare(config, task=task)


def _emulated(config, built):
  """The cost model whose compute times a worker emulates (--compute-time),
  or None: it runs at its own speed."""
  if config.cluster.compute_time is None:
    return None
  return cost_model(config, built.problem, built.streams)


def _padded(cost, w: int, c: int, started: float) -> float:
  """Seconds of worker w's compute for its iteration c, begun at `started`
  (time.perf_counter()), padded to the simulator's compute_time(w, c) (its
  speed, jitter and stragglers: the same draws) if `cost` is not None."""
  return slowed(time.perf_counter() - started, None if cost is None else cost.compute_time(w, c))


def _cpu_seconds() -> tuple[float, float | None]:
  """CPU seconds used so far by this process (all its threads) and by the
  whole machine (Linux; None elsewhere)."""
  try:
    with open("/proc/stat") as f:  # cpu user nice system idle iowait irq softirq ...
      user, nice, system, _, _, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    machine = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError):
    machine = None
  return time.process_time(), machine


def _pin(config, worker: int) -> None:
  """With --pin-workers, puts every thread of this process (those XLA starts
  later too) on one core: worker w's, w mod the cores it may use (Linux)."""
  if not config.distributed.pin_workers or not hasattr(os, "sched_setaffinity"):
    return
  cores = sorted(os.sched_getaffinity(0))
  core = {cores[worker % len(cores)]}
  for thread in os.listdir("/proc/self/task"):
    try:
      os.sched_setaffinity(int(thread), core)
    except OSError:  # a thread that has just ended
      pass


def wire_bytes(message) -> int:
  """The bytes of `message` serialized as Ray sends it: pickle protocol 5,
  its arrays' buffers out of band (the header plus the buffers)."""
  buffers = []
  header = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
  return len(header) + sum(b.raw().nbytes for b in buffers)


def packed(leaves: Sequence) -> np.ndarray:
  """A message's leaves (a payload's values and indices, ...) as one buffer
  of their bytes, in order: one array to serialize, whose header is paid
  once, not once a leaf (dozens of bytes each, as much as a small leaf's
  top-k payload). The receiver knows the leaves' shapes."""
  flat = [np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in jax.device_get(leaves)]
  return np.concatenate(flat) if flat else np.zeros(0, np.uint8)


def unpacked_tree(buffer: np.ndarray, like):
  """The tree shaped like `like` whose leaves `packed` put in `buffer`."""
  return jax.tree.unflatten(jax.tree.structure(like), unpacked(buffer, jax.tree.leaves(like)))


def unpacked(buffer: np.ndarray, like: Sequence) -> list:
  """The leaves that `packed` put in `buffer`, with the shapes and dtypes of
  `like`'s (arrays or jax.ShapeDtypeStruct)."""
  leaves, offset = [], 0
  for x in like:
    shape, dtype = tuple(x.shape), np.dtype(x.dtype)
    size = math.prod(shape)
    leaves.append(np.frombuffer(buffer, dtype, size, offset).reshape(shape))
    offset += size * dtype.itemsize
  return leaves


def _with(state, indices: Sequence[int], leaves: Sequence):
  """`state` with its leaves at `indices` replaced by `leaves`."""
  flat, treedef = jax.tree.flatten(state)
  for i, x in zip(indices, leaves):
    flat[i] = x
  return jax.tree.unflatten(treedef, flat)


class _Ledger:
  """What a run's central actor keeps, whatever the algorithm: the events in
  the order their math ran, with wall times (seconds since the run started);
  the workers' clocks (updates so far); the budget of samples, and where each
  step ends (jaxdl.trace); each step's metric means."""

  def __init__(self, config, task, observed: list[int]):
    """`observed`: the steps at whose end the driver reads the state (the
    runner's log, evaluation and checkpoint steps); at others it gets the
    metrics alone."""
    built = _built(config, task)
    self.observed = set(observed)
    self.algorithm, self.streams = built.algorithm, built.streams
    self.programs = EventPrograms(self.algorithm, self.streams, config.cluster.servers)
    self.m, self.total = self.streams.num_workers, built.total_steps
    self.batch_sizes, self.global_batch = built.streams.batch_sizes, built.global_batch
    self.clocks = [0] * self.m
    self.events: list[Event] = []
    self.fetched = 0  # the events before this one are the driver's already, unchanged
    self.bytes_total = 0
    self.batch_seconds = [[0.0, 0] for _ in range(self.m)]  # per worker: sum, count
    self.done_steps, self.samples = 0, 0
    self.finished = False
    self.sums, self.count, self.names = {}, 0, set()
    self.snapshots: dict[int, Any] = {}
    self.changed = asyncio.Condition()
    self.incarnation = [0] * self.m  # a worker's restarts: older calls are refused

  def identity(self) -> dict[str, Any]:
    return process_identity("server")

  def initialize(self, key_data: np.ndarray):
    """The state at step 0, from the run's key."""
    key = jax.random.wrap_key_data(np.asarray(key_data))
    self.server, workers = initial_state(self.algorithm, key, self.m)
    self.workers = [take(workers, w) for w in range(self.m)]
    return self.state()

  def begin(self, state, step: int) -> None:
    """Starts the clock; from a checkpoint's state at the end of step `step` > 0."""
    if step:
      self.restore(state, step)
    self.start, self.cpu_start = time.time(), _cpu_seconds()
    self.cpu_s = (0.0, None)

  def state(self, server=None, workers=None, clocks=None):
    """The run's state, as host arrays: the server, every worker's state
    (stacked) and the workers' clocks (by default, now's)."""
    server = self.server if server is None else server
    workers = self.workers if workers is None else workers
    clocks = self.clocks if clocks is None else clocks
    return jax.device_get((server, stack(workers), np.asarray(clocks, np.int64)))

  def restore(self, state, step: int) -> None:
    """Continues from a checkpoint's state, taken at the end of step `step`."""
    self.server, workers, clocks = state
    self.workers = [take(workers, w) for w in range(self.m)]
    self.clocks = [int(c) for c in clocks]
    self.done_steps, self.samples = step, step * self.global_batch

  def _now(self) -> float:
    return time.time() - self.start

  def _stale(self, w: int, incarnation: int | None) -> bool:
    """Is this a call of worker w's process from before its restart?"""
    return incarnation is not None and incarnation != self.incarnation[w]

  def _event(self, kind: str, worker: int, **fields) -> None:
    self.events.append(Event(self._now(), kind, worker, **fields))

  async def _notify(self) -> None:
    async with self.changed:
      self.changed.notify_all()

  def _add(self, metrics: dict[str, float] | None) -> None:
    for k, v in (metrics or {}).items():
      self.sums[k] = self.sums.get(k, 0.0) + v
      self.names.add(k)
    self.count += metrics is not None

  def _update(self, w: int) -> None:
    """Counts an update of worker w ("apply" or "local"); at the end of a
    step, keeps its snapshot; ends the run after the last."""
    self.clocks[w] += 1
    self.samples += self.batch_sizes[w]
    while self.samples >= (self.done_steps + 1) * self.global_batch:
      # NaN for a step in which no gradient was computed (its updates' were
      # computed before it), as every engine reports one
      means = {k: self.sums[k] / self.count if self.count else float("nan")
               for k in self.names}
      self.sums, self.count = {}, 0
      workers = self._workers_at_end(self.done_steps) if (
          self.done_steps in self.observed) else None
      # The state's arrays as they are (immutable): stacked and copied when asked.
      self.snapshots[self.done_steps] = (self.server, workers, tuple(self.clocks), means)
      self.done_steps += 1
    self.finished = self.done_steps >= self.total
    if self.finished:  # the run's CPU seconds, read once, at its last update
      (own, machine), (own0, machine0) = _cpu_seconds(), self.cpu_start
      self.cpu_s = (own - own0, None if machine is None else machine - machine0)

  async def _snapshot(self, step: int):
    """(server, workers, clocks, metric means) at the end of step `step`,
    once it has ended and its workers' states are all there (workers: None
    at a step the driver does not read)."""
    complete = lambda: step in self.snapshots and (
        self.snapshots[step][1] is None or all(x is not None for x in self.snapshots[step][1]))
    async with self.changed:
      await self.changed.wait_for(complete)
    return self.snapshots.pop(step)

  async def step(self, step: int):
    """(state, metric means) at the end of step `step`; the state is None at
    a step the driver does not read."""
    server, workers, clocks, means = await self._snapshot(step)
    return None if workers is None else self.state(server, workers, clocks), means

  async def steps(self, first: int, last: int) -> list:
    """`step` of each of the steps first, ..., last (the driver's one call for them)."""
    return [await self.step(s) for s in range(first, last + 1)]

  def _timed(self, w: int, seconds: float) -> None:
    """Counts a batch of worker w that took `seconds` to compute."""
    self.batch_seconds[w][0] += seconds
    self.batch_seconds[w][1] += 1

  def trace(self, have: int = 0) -> tuple[int, list[Event], int, list, tuple, bool]:
    """The events the driver lacks, that already has the first `have`: (the
    index of the first sent, the events from there; the driver's from there
    on are replaced), bytes sent, mean seconds per batch per worker (None:
    none yet), the CPU seconds of this actor and of its machine until the
    last update, and whether the run is over (nothing more will change)."""
    start, self.fetched = min(have, self.fetched), len(self.events)
    means = [total / n if n else None for total, n in self.batch_seconds]
    return start, self.events[start:], self.bytes_total, means, self.cpu_s, self.finished


class Server(_Ledger):
  """The parameter server of a centralized algorithm (asp, ssp, dc_asgd,
  lc_asgd): an asyncio actor, one method call at a time between awaits. It
  keeps every worker's state as the server's programs see it; a worker's
  process keeps its own between iterations, so a pull carries what the
  server changed that the worker reads (the parameters, or a compressed
  reply's payload) and a push what the worker changed that the server
  reads (the gradient, or its payload): `EventPrograms.message_parts`. The
  leaves only a worker reads and changes (an error-feedback residual, its
  copy of the parameters under --compress-pull) stay with it: at the end
  of a step the driver reads, each worker that has pushed since owes them
  as they were after its last push applied, and deposits them when the
  reply to its next push (or its last) asks."""

  def __init__(self, config, task, observed: list[int]):
    super().__init__(config, task, observed)
    self.bound = self.algorithm.staleness_bound
    self.version = 0
    # a worker's process holds the server's copy of its state: from the
    # driver at the start; after a restart or a restore, from its first pull
    self.synced = [True] * self.m
    self.pushed = [False] * self.m  # its private leaves have moved on since
    self.owed: list[list[tuple[int, int]]] = [[] for _ in range(self.m)]  # (step, iteration)
    self.deposits: dict[int, dict[int, Any]] = {}  # step -> worker -> its private leaves

  def warm_up(self) -> None:
    """Compiles the pull and apply programs (their results are dropped)."""
    worker = self.programs.pull(self.server, self.workers[0], np.float32(0.0))
    jax.block_until_ready(self.programs.apply(self.server, worker, np.float32(0.0)))
    self.parts = self.programs.message_parts(self.workers[0], one_batch(self.streams, 0, 0))

  def template(self):
    """A worker's state, whose leaves a pull does not carry stand in for
    those of every worker (a restarted worker's process has none)."""
    return jax.device_get(self.workers[0])

  def restarted(self, w: int) -> int:
    """Worker w's process failed and was restarted: its in-flight iteration is
    dropped, and it pulls again at its clock. Its new incarnation number."""
    self.incarnation[w] += 1
    self.synced[w] = False
    self._event("restart", w, iteration=self.clocks[w])
    return self.incarnation[w]

  async def pull(self, w: int, seconds: float, incarnation: int = 0):
    """Worker w's next pull: ((its message, whether it is the worker's whole
    state), its iteration), or None once the run is over (or for a call of
    a worker's earlier incarnation). `seconds`: its last measured transfer
    time, the pull's duration."""
    stale = lambda: self._stale(w, incarnation)
    if stale():
      return None
    c = self.clocks[w]
    if self.bound is not None and min(self.clocks) < c - self.bound:
      since = self._now()
      async with self.changed:
        await self.changed.wait_for(
            lambda: self.finished or min(self.clocks) >= c - self.bound)
      if stale():
        return None
      if not self.finished and self._now() > since:
        self._event("wait", w, iteration=c, duration=self._now() - since)
    if self.finished:
      return None
    d = np.float32(seconds)
    message = self._pull(w, d)
    self._event("pull", w, iteration=c, version=self.version, duration=float(d))
    return message, c

  def _pull(self, w: int, d: np.float32):
    """Runs worker w's pull: (its message, whether it is the whole state
    the worker's gradient reads, which a worker without it is sent)."""
    self.workers[w] = self.programs.pull(self.server, self.workers[w], d)
    whole, self.synced[w] = not self.synced[w], True
    leaves = jax.tree.leaves(self.workers[w])
    message = packed([leaves[i] for i in (self.parts.reads if whole else self.parts.reply)])
    self.bytes_total += wire_bytes(message)
    return message, whole

  async def push(self, w: int, c: int, changed, compute_s: float, transfer_s: float,
                 metrics: dict[str, float], incarnation: int = 0):
    """Applies worker w's iteration c on arrival, then serves its next pull:
    (the pull's reply, or None once the run is over; the (step, iteration)
    of the cuts whose private leaves it owes). `changed`: its push, the
    leaves its gradient changed that the server reads (to a `ShardedServer`:
    the bytes it sent the shards, which hold those)."""
    if self._stale(w, incarnation):
      return None, []
    if self.finished:
      return None, self._owes(w)
    d = np.float32(compute_s)
    self._apply(w, c, changed, d, incarnation)
    self.pushed[w] = bool(self.parts.private)
    self.version += 1
    self._event("apply", w, iteration=c, version=self.version, duration=float(d))
    self._timed(w, compute_s)
    self._add(metrics)
    self._update(w)
    await self._notify()
    reply = None if self.finished else await self.pull(w, transfer_s, incarnation)
    return reply, self._owes(w)

  def _apply(self, w: int, c: int, changed, d: np.float32, incarnation: int) -> None:
    """Applies worker w's push of iteration c: `changed`, its leaves packed."""
    self.bytes_total += wire_bytes(changed)
    leaves = jax.tree.leaves(self.workers[w])
    push = self.parts.push
    worker = _with(self.workers[w], push, unpacked(changed, [leaves[i] for i in push]))
    self.server, self.workers[w] = self.programs.apply(self.server, worker, d)

  def _owes(self, w: int) -> list[tuple[int, int]]:
    """The cuts whose private leaves worker w owes, now asked of it."""
    owed, self.owed[w] = self.owed[w], []
    return owed

  async def deposit(self, w: int, owed: list[tuple[int, int]], leaves: dict[int, list]) -> None:
    """Worker w's private leaves at the cuts it owed, by iteration."""
    for step, iteration in owed:
      self.deposits[step][w] = leaves[iteration]
    await self._notify()

  def restore(self, state, step: int) -> None:
    super().restore(state, step)
    self.version = int(sum(self.clocks))
    self.synced, self.pushed = [False] * self.m, [False] * self.m

  def _ask_private(self, step: int) -> None:
    """At the end of `step`: the workers whose private leaves have moved on
    owe them, as they were after their last push applied."""
    for w in range(self.m):
      if self.pushed[w]:
        self.owed[w].append((step, self.clocks[w] - 1))
        self.deposits.setdefault(step, {})[w] = None

  def _workers_at_end(self, step: int) -> tuple:
    self._ask_private(step)
    return tuple(self.workers)  # the server keeps them all

  async def _with_private(self, step: int, workers: Sequence) -> list:
    """`workers` (their states at the end of `step`) with the private leaves
    the workers owed there, once deposited."""
    async with self.changed:
      await self.changed.wait_for(lambda: None not in self.deposits.get(step, {}).values())
    private = self.deposits.pop(step, {})
    return [_with(x, self.parts.private, private[w]) if w in private else x
            for w, x in enumerate(workers)]

  async def step(self, step: int):
    server, workers, clocks, means = await self._snapshot(step)
    if workers is None:
      return None, means
    return self.state(server, await self._with_private(step, workers), clocks), means


class Worker:
  """A worker: pulls, computes on what it pulled (padded to the modelled
  time, with --compute-time), pushes; until the server says the run is over."""

  def __init__(self, config, task, worker: int, server: str):
    import ray
    _pin(config, worker)
    built = _built(config, task)
    # the server by name: Ray cannot restart an actor whose constructor was
    # given an actor handle (it keeps such arguments in the object store)
    self.w, self.server, self.streams = worker, ray.get_actor(server), built.streams
    self.programs = EventPrograms(built.algorithm, built.streams, config.cluster.servers)
    self.cost = _emulated(config, built)
    self.template = None  # set by warm_up

  def identity(self) -> dict[str, Any]:
    return process_identity(f"worker {self.w}")

  def warm_up(self, state) -> None:
    """Compiles the gradient's program on the first batch (the result is
    dropped); takes `state`, the server's copy of its state (at the start,
    or a template until its first pull after a restart)."""
    batch = one_batch(self.streams, self.w, 0)
    jax.block_until_ready(self.programs.compute(state, batch))
    self.template = jax.device_get(state)
    self.leaves, self.treedef = jax.tree.flatten(self.template)
    self.parts = self.programs.message_parts(state, batch)
    self.kept: dict[int, list] = {}  # iteration -> its private leaves (the last two)

  def run(self, incarnation: int = 0) -> None:
    """Works until the run is over. `incarnation`: how many times this
    worker's process was restarted."""
    import ray
    if self.template is None:  # a restarted process: nothing compiled yet
      self.warm_up(ray.get(self.server.template.remote()))
    t = time.perf_counter()
    reply = ray.get(self.server.pull.remote(self.w, 0.0, incarnation))
    while reply is not None:
      pulled, c = self._received(reply)
      transfer = time.perf_counter() - t
      t = time.perf_counter()
      state, shares = self.programs.compute(pulled, one_batch(self.streams, self.w, c))
      leaves = jax.block_until_ready(jax.tree.leaves(state))
      compute = _padded(self.cost, self.w, c, t)
      t = time.perf_counter()
      reply = self._push(c, leaves, compute,
                         transfer, self.programs.means(self.w, jax.device_get(shares)),
                         incarnation)

  def _received(self, reply):
    """(its state once a pull's reply has arrived, the reply's iteration)."""
    (message, whole), c = reply
    self._take(self.parts.reads if whole else self.parts.reply, [message])
    return jax.tree.unflatten(self.treedef, self.leaves), c

  def _take(self, indices: Sequence[int], messages: Sequence, parts=None) -> None:
    """Puts the leaves that `messages` carry at `indices` of its state (from
    shard s, `parts[s]`'s of them: all by default)."""
    parts = parts or [indices]
    for message, part in zip(messages, parts):
      part = [i for i in part if i in indices]
      for i, x in zip(part, unpacked(message, [self.leaves[i] for i in part])):
        self.leaves[i] = x

  def _computed(self, c: int, leaves: list) -> list:
    """Takes its state after iteration c's gradient (`leaves`), keeping its
    private leaves of the last two iterations (a cut asks for one of them);
    the leaves its push carries."""
    self.leaves = list(leaves)
    self.kept = {i: x for i, x in self.kept.items() if i >= c - 1}
    self.kept[c] = [leaves[i] for i in self.parts.private]
    return [leaves[i] for i in self.parts.push]

  def _replied(self, reply):
    """The next pull's reply from a push's, once the private leaves it
    asks for are deposited."""
    import ray
    reply, owed = reply
    if owed:
      kept = {i: jax.device_get(self.kept[i]) for i in {i for _, i in owed}}
      ray.get(self.server.deposit.remote(self.w, owed, kept))
    return reply

  def _push(self, c: int, leaves: list, *args):
    """Pushes iteration c (`leaves`: its state after the gradient); the
    server's reply, the next pull's."""
    import ray
    message = packed(self._computed(c, leaves))
    return self._replied(ray.get(self.server.push.remote(self.w, c, message, *args)))


class ShardedServer(Server):
  """A parameter server split into k shard actors (`Shard`,
  jaxdl.engines.shards): this actor keeps the order, the clocks, the
  staleness bound and the trace; each pull, push and snapshot it grants gets
  the next sequence number, and every shard runs them in that order on its
  own leaves. A worker's leaves go to and from the shards directly: it
  deposits its push at each shard before asking for it to be applied, so
  an applied push is never one the shards lack."""

  def __init__(self, config, task, observed: list[int], shards: list[str]):
    import ray
    super().__init__(config, task, observed)
    self.shards = [ray.get_actor(name) for name in shards]
    self.partition = self.programs.partition
    self.seq = 0

  async def warm_up(self) -> None:
    """Finds the messages' leaves; each shard compiles its programs."""
    self.parts = self.programs.message_parts(self.workers[0], one_batch(self.streams, 0, 0))
    await self._load()

  async def begin(self, state, step: int) -> None:
    super().begin(state, step)
    if step:
      await self._load()

  async def _load(self) -> None:
    """Gives each shard its leaves of the state as it is now."""
    split = self.partition.split
    self.seq = 0
    await asyncio.gather(*[shard.load.remote(
        split(self.server, s, True), [split(w, s, False) for w in self.workers],
        self.parts) for s, shard in enumerate(self.shards)])

  def _op(self, kind: str, w: int, *args) -> list:
    """Grants the shards' next operation; its results (ObjectRefs)."""
    seq, self.seq = self.seq, self.seq + 1
    return [shard.op.remote(seq, kind, w, *args) for shard in self.shards]

  def _pull(self, w: int, d: np.float32):
    seq, whole, self.synced[w] = self.seq, not self.synced[w], True
    self._op("pull", w, d, whole)
    return seq, whole  # the worker fetches its leaves from each shard

  def _apply(self, w: int, c: int, nbytes: int, d: np.float32, incarnation: int) -> None:
    """`nbytes`: what the worker sent to the shards, pulls and pushes."""
    self.bytes_total += nbytes
    self._op("apply", w, d, (c, incarnation))

  def _workers_at_end(self, step: int) -> list:
    """The shards' copies of their leaves, as they are at this point of the
    order (ObjectRefs, gathered by `step`)."""
    self._ask_private(step)
    return self._op("keep", -1, np.float32(0.0))

  async def step(self, step: int):
    _, kept, clocks, means = await self._snapshot(step)
    if kept is None:
      return None, means
    parts = await asyncio.gather(*kept)  # per shard: (server leaves, each worker's)
    join = self.partition.join
    server = join(self.server, [p[0] for p in parts], True)
    workers = [join(self.workers[w], [p[1][w] for p in parts], False) for w in range(self.m)]
    return self.state(server, await self._with_private(step, workers), clocks), means


class Shard:
  """Shard s of a parameter server: its leaves of the server's state and of
  every worker's, on which it runs the algorithm's pull and apply
  (`EventPrograms.shards[s]`) in the order of their sequence numbers, as the
  `ShardedServer` grants them."""

  def __init__(self, config, task, s: int):
    built = _built(config, task)
    programs = EventPrograms(built.algorithm, built.streams, config.cluster.servers)
    self.s, self.programs = s, programs.shards[s]
    self.own = programs.partition.worker_leaves(s)
    self.next, self.changed, self.error = 0, asyncio.Condition(), None
    self.deposits: dict[tuple[int, int, int], list] = {}  # (worker, iteration, incarnation)
    self.replies: dict[int, tuple[int, list]] = {}  # worker -> (sequence number, leaves)

  def identity(self) -> dict[str, Any]:
    return process_identity(f"server shard {self.s}")

  def load(self, server: list, workers: list, parts):
    """Takes its leaves of the state (starting the order anew) and compiles
    its programs; `parts`: the leaves of a worker's state its messages
    carry (EventPrograms.message_parts)."""
    self.server, self.workers, self.next = server, list(workers), 0
    self.reads = [k for k, i in enumerate(self.own) if i in parts.reads]
    self.reply = [k for k, i in enumerate(self.own) if i in parts.reply]
    self.push = [k for k, i in enumerate(self.own) if i in parts.push]
    self.deposits.clear()
    self.replies.clear()
    d = np.float32(0.0)
    jax.block_until_ready(self.programs.apply(server, self.programs.pull(server, workers[0], d), d))

  def deposit(self, w: int, c: int, incarnation: int, leaves: np.ndarray) -> None:
    """Worker w's push of iteration c (its leaves here, packed), until its apply comes."""
    for key in [k for k in self.deposits if k[0] == w and k[2] < incarnation]:
      del self.deposits[key]  # a dead process's, never applied
    self.deposits[(w, c, incarnation)] = leaves

  async def op(self, seq: int, kind: str, w: int, d: np.float32, push=None):
    """Runs operation `seq` once those before it have run: a pull of worker
    w (its reply kept for `fetch`; `push`: whether it is the worker's whole
    state), an apply of its deposited push (`push`: (iteration,
    incarnation)), or a copy of the leaves ("keep"), returned."""
    async with self.changed:
      await self.changed.wait_for(lambda: self.next == seq)
    kept = None
    try:
      if kind == "pull":
        self.workers[w] = self.programs.pull(self.server, self.workers[w], d)
        self.replies[w] = (seq, packed([self.workers[w][k]
                                        for k in (self.reads if push else self.reply)]))
      elif kind == "apply":
        worker = list(self.workers[w])
        changed = self.deposits.pop((w, *push))
        for k, x in zip(self.push, unpacked(changed, [worker[k] for k in self.push])):
          worker[k] = x
        self.server, self.workers[w] = self.programs.apply(self.server, worker, d)
      else:
        kept = jax.device_get((self.server, self.workers))
    except Exception as e:  # the workers waiting on this shard learn of it
      self.error = e
      raise
    finally:
      self.next += 1
      async with self.changed:
        self.changed.notify_all()
    return kept

  async def fetch(self, w: int, seq: int):
    """Worker w's pull `seq`: this shard's leaves of it (None if a later
    pull of w replaced it)."""
    async with self.changed:
      await self.changed.wait_for(
          lambda: self.error is not None or self.replies.get(w, (-1,))[0] >= seq)
    if self.error is not None:
      raise RuntimeError(f"server shard {self.s} failed") from self.error
    got, leaves = self.replies[w]
    return leaves if got == seq else None


class ShardedWorker(Worker):
  """A worker of a sharded parameter server: fetches its pull's leaves from
  every shard, and deposits its push's there before asking the server to
  apply it."""

  def __init__(self, config, task, worker: int, server: str, shards: list[str]):
    import ray
    super().__init__(config, task, worker, server)
    self.shards = [ray.get_actor(name) for name in shards]
    self.own = [self.programs.partition.worker_leaves(s) for s in range(len(shards))]

  def _received(self, reply):
    import ray
    (seq, whole), c = reply
    messages = ray.get([shard.fetch.remote(self.w, seq) for shard in self.shards])
    self._take(self.parts.reads if whole else self.parts.reply, messages, self.own)
    self.nbytes = sum(wire_bytes(m) for m in messages)
    return jax.tree.unflatten(self.treedef, self.leaves), c

  def _push(self, c: int, leaves: list, compute: float, transfer: float, metrics, incarnation):
    import ray
    by_leaf = dict(zip(self.parts.push, self._computed(c, leaves)))
    messages = [packed([by_leaf[i] for i in own if i in by_leaf]) for own in self.own]
    ray.get([shard.deposit.remote(self.w, c, incarnation, message)
             for shard, message in zip(self.shards, messages)])
    nbytes = self.nbytes + sum(wire_bytes(m) for m in messages)
    return self._replied(ray.get(self.server.push.remote(
        self.w, c, nbytes, compute, transfer, metrics, incarnation)))


class Coordinator(_Ledger):
  """The central actor of an algorithm whose workers keep their own models
  (easgd, gosgd, ad_psgd). It grants each worker's next event, so the events have
  one order, the trace's: a worker asks before each event (holding its
  model), and once the run is over the answer is no. It holds EASGD's center
  and applies each exchange on arrival, and pairs AD-PSGD's workers (a
  worker is in one average at a time: no lost update, and no deadlock, as a
  pair is taken at once).

  At the end of each step the driver reads (`observed`), it gathers every
  worker's model as it was then, without stopping anyone: a consistent cut,
  each worker's model before its first event after the step's end, which
  the worker deposits when it asks for that event (or stops).
  """

  def __init__(self, config, task, observed: list[int]):
    super().__init__(config, task, observed)
    self.owed: list[list[int]] = [[] for _ in range(self.m)]  # cuts a worker still owes
    self.partner: dict[int, int] = {}  # AD-PSGD's pairs, both ways; a donor: itself
    self.undelivered: set[tuple[int, int]] = set()  # GoSGD's messages: (sender, step)
    self.lent: int | None = None  # EASGD: the worker that has the center, in its exchange

  def warm_up(self) -> None:
    """Compiles the center's part of an exchange (its result is dropped),
    and learns the shapes of a worker's message."""
    if "take" in self.programs.fns:
      _, message = self.programs.meet(self.workers[0], self.server)
      jax.block_until_ready(self.programs.take(self.server, message))
      self.take_like = jax.device_get(message)

  def _workers_at_end(self, step: int) -> list:
    """Every worker owes its model at the end of `step`, deposited later."""
    for owed in self.owed:
      owed.append(step)
    return [None] * self.m

  def _owed(self, *workers: int) -> dict[int, list[int]]:
    """The cuts `workers` owe, now to be deposited by the caller."""
    owed = {w: self.owed[w] for w in workers if self.owed[w]}
    for w in owed:
      self.owed[w] = []
    return owed

  def _in_transit(self, w: int) -> list[int]:
    """The cuts of worker w handed to a caller (`_owed`) but not yet deposited."""
    return [step for step, (_, workers, _, _) in self.snapshots.items()
            if workers is not None and workers[w] is None and step not in self.owed[w]]

  async def deposit(self, owed: dict[int, list[int]], states: dict[int, Any]) -> None:
    """Each worker's model at the cuts it owed (its model before its next event)."""
    for w, steps in owed.items():
      for step in steps:
        self.snapshots[step][1][w] = states[w]
    await self._notify()

  async def ticket(self, w: int, kind: str, iteration: int, peer: int = -1,
                   metrics: dict[str, float] | None = None, nbytes: int = 0,
                   seconds: float | None = None, incarnation: int | None = None):
    """May worker w take its event `kind` now? (yes, the cuts owed by the
    workers the event changes: the caller deposits their models as they are
    before it). A "gossip" changes only its receiver, `peer`; an "average"
    both. Metrics and `seconds`: those of a gradient computed for the
    event (its measured compute time, the event's duration); an "apply" or
    "local" is an update, and counts towards the budget. `incarnation`:
    that of the process that made worker w's part of the event (no: a
    process from before w's restart)."""
    if self._stale(w, incarnation) or (
        kind == "gossip" and (w, iteration) not in self.undelivered):
      return False, {}  # a message is merged once
    owed = self._owed(*{"average": (w, peer), "gossip": (peer,)}.get(kind, (w,)))
    if self.finished:
      return False, owed
    self._event(kind, w, iteration=iteration, peer=peer, duration=seconds or 0.0)
    if seconds is not None:
      self._timed(w, seconds)
    if metrics is not None:
      self._add(metrics)
    if kind == "send":  # GoSGD: the message, at its sending
      self.bytes_total += nbytes
      self.undelivered.add((w, iteration))
    if kind == "gossip":
      self.undelivered.discard((w, iteration))
    if kind in ("apply", "local"):
      self._update(w)
      await self._notify()
    return True, owed

  async def stopped(self, w: int, state, incarnation: int) -> None:
    """Worker w has stopped, with its model `state`: its model at every cut it owes."""
    if not self._stale(w, incarnation):
      await self.deposit(self._owed(w), {w: state})

  async def lend(self, w: int, incarnation: int):
    """EASGD: worker w's exchange begins: it takes the center, once no other
    worker has it, until its message comes back (`give`), so the exchange
    is atomic. (The center's state, packed, or None once the run is over;
    the cuts w owes, for it to deposit its model at.)"""
    async with self.changed:
      await self.changed.wait_for(lambda: self.finished or self.lent is None)
    if self._stale(w, incarnation):
      return None, {}
    owed = self._owed(w)
    if self.finished:
      return None, owed
    self.lent = w
    center = packed(jax.tree.leaves(self.server))
    self.bytes_total += wire_bytes(center)
    return center, owed

  async def give(self, w: int, c: int, message: np.ndarray, incarnation: int) -> bool:
    """EASGD: worker w's message, after its local step c, meets the center
    it took; whether the exchange took place (not once the run is over)."""
    if self._stale(w, incarnation):
      return False
    self.lent = None
    done = not self.finished
    if done:
      self.server = self.programs.take(self.server, unpacked_tree(message, self.take_like))
      self._event("exchange", w, iteration=c)
      self.bytes_total += wire_bytes(message)
    await self._notify()
    return done

  async def _taken(self, *workers: int) -> None:
    """Once none of `workers` is in an average (or giving its model)."""
    async with self.changed:
      await self.changed.wait_for(
          lambda: self.finished or not set(workers) & self.partner.keys())

  async def pair(self, w: int, peer: int, c: int, incarnation: int) -> bool:
    """AD-PSGD: takes workers w and `peer` for an average, once neither is in
    another; False once the run is over."""
    since = self._now()
    await self._taken(w, peer)
    if self.finished or self._stale(w, incarnation):
      return False
    if self._now() > since:
      self._event("wait", w, iteration=c, duration=self._now() - since)
    self.partner.update({w: peer, peer: w})
    return True

  def _release(self, w: int) -> None:
    """Ends worker w's average (or donation, or its hold on the center)."""
    peer = self.partner.pop(w, None)
    if peer is not None:
      self.partner.pop(peer, None)
    if self.lent == w:
      self.lent = None

  async def unpair(self, w: int, nbytes: int) -> None:
    self._release(w)
    self.bytes_total += nbytes
    await self._notify()

  def cancel(self, w: int, peer: int, c: int) -> None:
    """AD-PSGD: worker w's average with `peer` (after its iteration c's
    gradient) never reached w, as peer's process died: it did not happen.
    Nothing came after it that read either model: w waited for it, and the
    dead peer rejoins with another's model. The cuts w owed before it,
    which the peer was to deposit, w owes again (its model is as it was)."""
    self.owed[w] = sorted(set(self.owed[w]) | set(self._in_transit(w)))
    for i in range(len(self.events) - 1, -1, -1):
      e = self.events[i]
      if (e.kind, e.worker, e.peer, e.iteration) == ("average", w, peer, c):
        del self.events[i]
        self.fetched = min(self.fetched, i)
        return

  async def reserve(self, w: int, donor: int) -> None:
    """Worker w's process died: ends the average it had taken (the peer's
    lock orders what the peer still does in it), then takes worker `donor`
    out of averages until it has given its model (`rejoin`)."""
    self._release(w)
    await self._notify()
    await self._taken(donor)
    self.partner[donor] = donor

  async def rejoin(self, w: int, donor: int, state) -> tuple[bool, int, int]:
    """Worker w's process died: it restarts with `state`, a copy of worker
    `donor`'s. A "restart" event at w's clock names the donor; w's cuts
    still owed, or handed to its dead process and never deposited, are
    given that model (its own died with it). (whether it works on, its
    clock, its new incarnation)."""
    self.incarnation[w] += 1
    self._release(donor)
    owed = self._owed(w)
    owed[w] = owed.get(w, []) + self._in_transit(w)
    await self.deposit(owed, {w: state})
    if not self.finished:
      self._event("restart", w, iteration=self.clocks[w], peer=donor)
    await self._notify()
    return not self.finished, self.clocks[w], self.incarnation[w]


def _received_shapes(programs: EventPrograms) -> dict[str, Any]:
  """The shapes of the messages a worker that keeps its own model receives,
  by kind: "gossip", "center" (EASGD's), "offer" and "answer" (AD-PSGD's)."""
  algorithm, peer = programs.algorithm, jax.ShapeDtypeStruct((), np.int32)
  server, worker = state_shapes(algorithm)
  if isinstance(algorithm, Gossip):
    return {"gossip": jax.eval_shape(programs.send, worker, peer)[1]}
  if isinstance(algorithm, Elastic):
    return {"center": server}
  offer = jax.eval_shape(programs.offer, worker, peer)[1]
  return {"offer": offer, "answer": jax.eval_shape(programs.answer, worker, offer)[1]}


class Peer:
  """A worker that keeps its own model (easgd, gosgd, ad_psgd): a threaded
  actor, its own loop in one thread while peers' messages and averages
  arrive in others; a lock makes each event on its model whole. A
  gradient's compute, padded to the modelled time with --compute-time,
  holds the lock as a slow device's would."""

  def __init__(self, config, task, worker: int, coordinator: str):
    import ray
    _pin(config, worker)
    built = _built(config, task)
    # the coordinator by name: Ray can restart this actor (see Worker)
    self.w, self.coordinator, self.streams = worker, ray.get_actor(coordinator), built.streams
    self.algorithm, self.seed = built.algorithm, config.train.seed
    self.programs = EventPrograms(built.algorithm, built.streams)
    self.like = _received_shapes(self.programs)
    self.cost = _emulated(config, built)
    self.lock = threading.Lock()
    self.state, self.incarnation = None, 0  # no model until `run` gives it one

  def identity(self) -> dict[str, Any]:
    return process_identity(f"worker {self.w}")

  def warm_up(self, state) -> None:
    """Compiles the worker's programs on its first batch (the results are
    dropped)."""
    p, batch, zero = self.programs, one_batch(self.streams, self.w, 0), np.int32(0)
    if "send" in p.fns:
      worker, message = p.send(p.local(state, batch)[0], zero)
      jax.block_until_ready(p.receive(worker, message))
    elif "local" in p.fns:
      center = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), self.like["center"])
      jax.block_until_ready(p.meet(p.local(state, batch)[0], center))
    else:
      worker, _ = p.compute(p.pull((), state, np.float32(0.0)), batch)
      jax.block_until_ready(p.apply((), worker, np.float32(0.0)))
      worker, offer = p.offer(worker, zero)
      peer, answer = p.answer(worker, offer)
      jax.block_until_ready(p.accept(worker, answer))

  def _message(self, kind: str, buffer: np.ndarray):
    """A message of kind `kind` ("gossip", "offer", "answer", "center") from its buffer."""
    return unpacked_tree(buffer, self.like[kind])

  def _ask(self, w: int, kind: str, c: int, peer: int = -1, metrics=None,
           models=None, nbytes: int = 0, seconds: float | None = None,
           incarnation: int | None = None) -> bool:
    """Asks for worker w's event (holding the lock), and deposits the models
    at the cuts owed: `models`, each worker's before the event (unset: this
    worker's own). `incarnation`: that of another worker w's process (None:
    not checked); this worker's own is known."""
    return self._ticket(w, kind, c, peer, metrics, models, nbytes, seconds, incarnation)[0]

  def _ticket(self, w: int, kind: str, c: int, peer: int = -1, metrics=None, models=None,
              nbytes: int = 0, seconds: float | None = None, incarnation: int | None = None):
    """`_ask`'s (whether it is granted, the cuts owed by workers not in
    `models`, whose own processes deposit them)."""
    import ray
    incarnation = self.incarnation if w == self.w else incarnation
    granted, owed = ray.get(self.coordinator.ticket.remote(w, kind, c, peer, metrics, nbytes,
                                                           seconds, incarnation))
    models = models or {self.w: self.state}
    if any(v in models for v in owed):
      ray.get(self.coordinator.deposit.remote(
          {v: s for v, s in owed.items() if v in models},
          {v: jax.device_get(models[v]) for v in owed if v in models}))
    return granted, {v: s for v, s in owed.items() if v not in models}

  def begin(self, state) -> None:
    """Takes its model at the run's start, before any worker runs (a peer's
    message or average may come before this worker's own first event)."""
    with self.lock:
      self.state = state

  def run(self, state, clock: int, peers: list, incarnation: int = 0) -> None:
    """Works from its clock until the run is over: from `state` (None: the
    one `begin` gave it, and what has been merged into it since). `peers`:
    every worker's actor, for GoSGD and AD-PSGD; `incarnation`: how many
    times this worker's process was restarted."""
    import ray
    with self.lock:
      self.incarnation = incarnation
      if state is not None:
        self.state = state
    run = {Elastic: self._elastic, Gossip: self._gossip}.get(type(self.algorithm),
                                                             self._decentralized)
    run(clock, peers)
    with self.lock:
      ray.get(self.coordinator.stopped.remote(self.w, jax.device_get(self.state),
                                              self.incarnation))

  def donate(self, w: int):
    """Worker w's process died: it rejoins with a copy of this worker's state,
    taken between this worker's events. (that state, whether w works on, its
    clock, its incarnation), or None if this worker has no model either."""
    import ray
    ray.get(self.coordinator.reserve.remote(w, self.w))
    with self.lock:
      if self.state is None:  # restarting itself
        ray.get(self.coordinator.unpair.remote(self.w, 0))
        return None
      state = jax.device_get(self.state)
      return (state, *ray.get(self.coordinator.rejoin.remote(w, self.w, state)))

  def _local(self, c: int) -> bool:
    """Local step c on its own model, if the run is not over."""
    with self.lock:
      p, start = self.programs, time.perf_counter()
      new, shares = jax.block_until_ready(p.local(self.state, one_batch(self.streams, self.w, c)))
      if not self._ask(self.w, "local", c, metrics=p.means(self.w, jax.device_get(shares)),
                       seconds=_padded(self.cost, self.w, c, start)):
        return False
      self.state = new
      return True

  def _other(self, rng: np.random.Generator, m: int) -> int:
    """A uniformly random other worker."""
    k = int(rng.integers(m - 1))
    return k + (k >= self.w)

  def _elastic(self, c: int, peers) -> None:
    import ray
    while self._local(c):
      if (c + 1) % self.algorithm.period == 0:  # it waits for the center
        with self.lock:
          center, owed = ray.get(self.coordinator.lend.remote(self.w, self.incarnation))
          if owed:  # its model before the exchange, at the cuts it owed
            ray.get(self.coordinator.deposit.remote(owed, {self.w: jax.device_get(self.state)}))
          if center is None:
            return
          new, message = self.programs.meet(self.state, self._message("center", center))
          if not ray.get(self.coordinator.give.remote(
              self.w, c, packed(jax.tree.leaves(message)), self.incarnation)):
            return
          self.state = new
      c += 1

  def _gossip(self, c: int, peers) -> None:
    """GoSGD: after each local step, with probability p, a message to a
    random peer; the worker goes on at once, the peer merges it on arrival
    (the draws are the same in every run). One message in flight at a time:
    a push first waits for the last one's merge, as on the sim engine."""
    sent = {}  # a message's delivery -> (its step, the message)
    while self._local(c):
      rng = np.random.default_rng([self.seed, self.w, c])
      if len(peers) > 1 and rng.random() < self.algorithm.probability:
        k = self._other(rng, len(peers))
        self._returned(sent, timeout=None)
        with self.lock:
          new, message = self.programs.send(self.state, np.int32(k))
          message = packed(jax.tree.leaves(message))
          if not self._ask(self.w, "send", c, k, nbytes=wire_bytes(message)):
            break
          self.state = new
        sent[peers[k].receive.remote(self.w, c, message)] = c, message  # it goes on
      self._returned(sent, timeout=0)
      c += 1
    self._returned(sent, timeout=None)

  def _returned(self, sent: dict, timeout: float | None) -> None:
    """Merges back the messages in `sent` whose receiver's process died or
    had no model yet, once known (within `timeout` seconds; None: all): the
    receiver's merge, as a gossip to itself, so that no weight is lost
    (halved at every send, the weights of a worker whose peer is down would
    otherwise reach 0)."""
    import ray
    if not sent:
      return
    done, _ = ray.wait(list(sent), num_returns=len(sent), timeout=timeout)
    for ref in done:
      c, message = sent.pop(ref)
      try:
        if ray.get(ref):
          continue
      except ray.exceptions.RayActorError:  # its process died, perhaps after the merge
        pass
      self.receive(self.w, c, message)

  def receive(self, w: int, c: int, message) -> bool:
    """GoSGD: worker w's message of its step c arrives; merged as sent,
    unless it already was (or the run is over). False if this process was
    restarted and has no model yet: the sender takes it back."""
    with self.lock:
      if self.state is None:
        return False
      if self._ask(w, "gossip", c, self.w, models={self.w: self.state}):
        self.state = self.programs.receive(self.state, self._message("gossip", message))
      return True

  def _decentralized(self, c: int, peers) -> None:
    import ray
    p, none = self.programs, np.float32(0.0)
    while True:
      with self.lock:  # the snapshot and its gradient: one event
        start = time.perf_counter()
        new, shares = jax.block_until_ready(
            p.compute(p.pull((), self.state, none), one_batch(self.streams, self.w, c)))
        if not self._ask(self.w, "pull", c, metrics=p.means(self.w, jax.device_get(shares)),
                         seconds=_padded(self.cost, self.w, c, start)):
          return
        self.state = new
      if len(peers) > 1:  # a uniformly random other worker, the same in every run
        k = self._other(np.random.default_rng([self.seed, self.w, c]), len(peers))
        if not ray.get(self.coordinator.pair.remote(self.w, k, c, self.incarnation)):
          return
        with self.lock:  # its offer: taken on only once the average is done
          offered, message = p.offer(self.state, np.int32(k))
          message = packed(jax.tree.leaves(message))
        try:
          over, reply, owed = ray.get(peers[k].average.remote(self.w, c, message,
                                                              self.incarnation))
        except ray.exceptions.RayActorError:  # k's process died: no average
          over, reply, owed = False, None, {}
          ray.get(self.coordinator.cancel.remote(self.w, k, c))
        with self.lock:
          if owed:  # its model before the average (or the run's end), at the cuts it owed
            ray.get(self.coordinator.deposit.remote(owed, {self.w: jax.device_get(self.state)}))
          if reply is not None:
            self.state = p.accept(offered, self._message("answer", reply))
        nbytes = wire_bytes(message) + (0 if reply is None else wire_bytes(reply))
        ray.get(self.coordinator.unpair.remote(self.w, nbytes))
        if over:
          return
      with self.lock:
        if not self._ask(self.w, "apply", c):
          return
        self.state = p.apply((), self.state, none)[1]
      c += 1

  def average(self, w: int, c: int, message: np.ndarray, incarnation: int):
    """AD-PSGD: worker w (after its iteration c's gradient) averages with this
    one, atomically, from its offer `message`: (whether the run is over, the
    answer to w or None if no average took place: the run is over, or this
    process was restarted and has no model yet; the cuts w owes, for w to
    deposit its model at)."""
    with self.lock:
      if self.state is None:
        return False, None, {}
      granted, owed = self._ticket(w, "average", c, self.w, models={self.w: self.state},
                                   incarnation=incarnation)
      if not granted:
        return True, None, owed
      self.state, answer = self.programs.answer(self.state, self._message("offer", message))
      return False, packed(jax.tree.leaves(answer)), owed


class Process:
  """One process of a collective algorithm's run (bsp, ar_sgd, local_sgd):
  a jax.distributed process with one device and one worker, running the
  mesh engine's step (the algorithm's own, its collectives across the
  processes) in step with the others."""

  def __init__(self, config, task, index: int, count: int):
    self.config, self.task, self.index, self.count = config, task, index, count

  def identity(self) -> dict[str, Any]:
    return process_identity(f"worker {self.index}")

  def address(self) -> str:
    """Process 0: a free address on its host for the processes' coordinator."""
    import socket as sockets

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
    from jaxdl.engines.mesh import MeshEngine  # imports jax's devices: after initialize
    built = _built(self.config, self.task)
    self.engine = MeshEngine(built.algorithm, built.problem, built.streams, self.config)

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
    from jaxdl.distributed import host_copy
    start = time.perf_counter()
    self.state, metrics = self.engine.step(self.state, step)
    metrics, state = host_copy((metrics, self.state if gather else None))
    return time.perf_counter() - start, (metrics, state) if self.index == 0 else None

  def state(self):
    """The state as host arrays, on process 0 (a collective: all take part)."""
    from jaxdl.distributed import host_copy
    state = host_copy(self.state)
    return state if self.index == 0 else None


class SplitProcess(SplitWorker):
  """A `SplitWorker` as a process of its own (--engine ray): it builds its
  algorithm and data stream from the config, and meets the other workers'
  collectives at the run's exchange actor, found by its name."""

  def __init__(self, config, task, worker: int, exchange: str):
    import ray
    built = _built(config, task)
    actor = ray.get_actor(exchange)
    meet = lambda op, key, w, leaves: ray.get(actor.collective.remote(op, key, w, leaves))
    super().__init__(config, built.algorithm, built.problem, built.streams, worker, meet)

  def identity(self) -> dict[str, Any]:
    return process_identity(f"worker {self.w}")
