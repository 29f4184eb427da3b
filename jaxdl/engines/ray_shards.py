"""A parameter server on ray sharded into k shard actors (--servers k):
`ShardedServer` keeps the order, `Shard` holds its leaves of every state,
`ShardedWorker` sends to and fetches from the shards directly.

Each shard applies its own leaves of every push (`jaxdl.engines.shards`:
which leaves are whose) in the order the `ShardedServer` grants them, the
order in which the pushes arrive, as on one server (`jaxdl.engines.ray_server`).
"""
from __future__ import annotations

import asyncio
from typing import Any

import jax
import numpy as np

from jaxdl.engines.base import process_identity
from jaxdl.engines.events import EventPrograms, one_batch
from jaxdl.engines.ray_messages import packed, unpacked, wire_bytes
from jaxdl.engines.ray_server import Server, Worker


class ShardedServer(Server):
  """A parameter server sharded into k shard actors (`Shard`,
  jaxdl.engines.shards): this actor keeps the order, the clocks, the
  staleness bound and the trace; each pull, push and snapshot it grants gets
  the next sequence number, and every shard runs them in that order on its
  own leaves. A worker's leaves go to and from the shards directly: it
  deposits its push at each shard before asking for it to be applied, so
  an applied push is never one the shards lack."""

  def __init__(self, fields, observed: list[int], shards: list[str]):
    import ray
    super().__init__(fields, observed)
    self.shards = [ray.get_actor(name) for name in shards]
    self.layout = self.programs.layout
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
    part = self.layout.part
    self.seq = 0
    await asyncio.gather(*[shard.load.remote(
        part(self.server, s, True), [part(w, s, False) for w in self.workers],
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
    join = self.layout.join
    server = join(self.server, [p[0] for p in parts], True)
    workers = [join(self.workers[w], [p[1][w] for p in parts], False) for w in range(self.m)]
    return self.state(server, await self._with_private(step, workers), clocks), means


class Shard:
  """Shard s of a parameter server: its leaves of the server's state and of
  every worker's, on which it runs the algorithm's pull and apply
  (`EventPrograms.shards[s]`) in the order of their sequence numbers, as the
  `ShardedServer` grants them."""

  def __init__(self, fields, s: int):
    built = fields.recipe.rebuild()
    programs = EventPrograms(built.algorithm, built.streams, fields.servers)
    self.s, self.programs = s, programs.shards[s]
    self.own = programs.layout.worker_leaves(s)
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

  def __init__(self, fields, worker: int, server: str, shards: list[str]):
    import ray
    super().__init__(fields, worker, server)
    self.shards = [ray.get_actor(name) for name in shards]
    self.own = [self.programs.layout.worker_leaves(s) for s in range(len(shards))]

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
