"""A parameter server on ray (`Server`) and its workers (`Worker`): asp,
ssp, dc_asgd, lc_asgd.

The server applies every push on arrival, in the order pushes really
arrive, and under SSP holds a worker's pull until the slowest clock allows
it. A worker pulls, computes its gradient on what it pulled and pushes,
keeping its state between iterations (`Server`: what each message carries).

A worker whose process dies is restarted by Ray: it pulls again at its
clock (its in-flight iteration is dropped), sent its whole state (the
driver refuses this with compressed messages: what only the worker held,
its residual, is lost). Calls made by a dead process's incarnation that
arrive after its restart are refused.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import numpy as np

from jaxdl.engines.base import process_identity
from jaxdl.engines.events import EventPrograms, one_batch
from jaxdl.engines.ray_ledger import Ledger
from jaxdl.engines.ray_messages import packed, unpacked, wire_bytes
from jaxdl.engines.ray_process import emulated, padded, pin


def _with(state, indices: Sequence[int], leaves: Sequence):
  """`state` with its leaves at `indices` replaced by `leaves`."""
  flat, treedef = jax.tree.flatten(state)
  for i, x in zip(indices, leaves):
    flat[i] = x
  return jax.tree.unflatten(treedef, flat)


class Server(Ledger):
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

  def __init__(self, fields, observed: list[int]):
    super().__init__(fields, observed)
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

  def __init__(self, fields, worker: int, server: str):
    import ray
    pin(fields, worker)
    built = fields.recipe.rebuild()
    # the server by name: Ray cannot restart an actor whose constructor was
    # given an actor handle (it keeps such arguments in the object store)
    self.w, self.server, self.streams = worker, ray.get_actor(server), built.streams
    self.programs = EventPrograms(built.algorithm, built.streams, fields.servers)
    self.cost = emulated(fields, built)
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
      compute = padded(self.cost, self.w, c, t)
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
