"""One worker's events as jitted programs: what a real engine's processes run.

A real engine (ray) runs an algorithm's event functions where they happen:
a worker computes its gradient in its own process, the server applies each
push in its own. `EventPrograms` jits each of the family's functions for one
worker's state, so every process runs the same compiled programs. The sim
engine's "events" batching runs those same programs along a recorded trace,
event by event: that is how a real run replays bit for bit (the sim's other
batchings, vmapped over workers or fused with bookkeeping, round
differently).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.algorithms import (Batch, Centralized, Decentralized, Elastic, Gossip, Family)
from jaxdl.algorithms.families import average_parts, exchange_parts, has_server
from jaxdl.data import Streams
from jaxdl.engines import base
from jaxdl.engines.shards import ShardLayout, sharded


def event_functions(algorithm: Family) -> dict[str, Callable]:
  """The family's functions under the engines' op names, in one signature each:
  pull/apply (server, worker, seconds), compute/local (worker, batch),
  exchange (server, worker), pair (worker, peer), send (worker, peer) ->
  (worker, message), receive (worker, message)."""
  if isinstance(algorithm, Centralized):
    return {"pull": algorithm.pull, "compute": algorithm.compute, "apply": algorithm.apply}
  if isinstance(algorithm, Decentralized):
    return {"pull": lambda server, worker, seconds: algorithm.pull(worker),
            "compute": algorithm.compute,
            "apply": lambda server, worker, seconds: (server, algorithm.apply(worker)),
            "pair": algorithm.average,
            **dict(zip(("offer", "answer", "accept"), average_parts(algorithm)))}
  if isinstance(algorithm, Elastic):
    return {"local": algorithm.local, "exchange": algorithm.exchange,
            **dict(zip(("meet", "take"), exchange_parts(algorithm)))}
  if isinstance(algorithm, Gossip):
    return {"local": algorithm.local, "send": algorithm.send, "receive": algorithm.receive}
  raise TypeError(f"not an event family: {type(algorithm).__name__}")


def one_batch(streams: Streams, worker: int, iteration: int) -> Batch:
  """`worker`'s batch of its iteration `iteration`, padded to the largest
  batch size as the sim engine pads it, with its weights and ids."""
  fields, weights, ids = streams.stacked_batches([(worker, iteration)])
  return Batch({k: v[0] for k, v in fields.items()}, weights[0], ids[0])


def initial_state(algorithm: Family, key: jax.Array, num_workers: int):
  """(server state, workers stacked over workers) at step 0, compiled as the
  sim engine compiles it (the same bits)."""
  def init_all(key):
    workers = base.init_workers(algorithm.init, key, num_workers)
    return (algorithm.init_server(key) if has_server(algorithm) else ()), workers
  return base.compile_init(init_all, key)(key)


def take(stacked, worker: int):
  """Worker `worker`'s state out of states stacked over workers (a copy)."""
  return jax.tree.map(lambda x: x[worker], stacked)


def put(stacked, worker: int, state):
  """The states stacked over workers, with worker `worker`'s replaced by `state`."""
  return jax.tree.map(lambda x, y: x.at[worker].set(y), stacked, state)


def stack(states: Sequence):
  return jax.tree.map(lambda *x: jnp.stack(x), *states)


def state_shapes(algorithm: Family):
  """The shapes of (a server's state, one worker's state)."""
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  return (jax.eval_shape(algorithm.init_server, key) if has_server(algorithm) else (),
          jax.eval_shape(lambda key: algorithm.init(key, jnp.int32(0)), key))


class MessageParts(NamedTuple):
  """Which leaves of a worker's state (indices) a parameter server's
  messages carry, where the worker keeps its own state between iterations.

  reads: those its gradient (`compute`) reads: all a (re)started worker's
    first pull need carry
  changes: those its gradient changes
  reply: those the server changes (pull, apply) that the gradient reads:
    what a pull carries (the parameters, or a compressed reply's payload)
  push: those the gradient changes that the server reads: what a push
    carries (the gradient, or its payload; the batch-norm statistics)
  private: those only the gradient reads and changes (an error-feedback
    residual, a worker's own copy of the parameters): they stay with the
    worker, and reach the server only at the steps the driver reads
  """
  reads: tuple[int, ...]
  changes: tuple[int, ...]
  reply: tuple[int, ...]
  push: tuple[int, ...]
  private: tuple[int, ...]


def check_servers(algorithm: Family, servers: int) -> None:
  """--servers k for a parameter server, refused (a ConfigError) where its
  handlers do not split its leaves into k shards (ShardLayout.of): asked by
  every engine that runs one, sim and ray, before it runs."""
  if servers > 1 and isinstance(algorithm, Centralized):
    ShardLayout.of(algorithm, *state_shapes(algorithm), servers)


class EventPrograms:
  """The family's event functions, each jitted for one worker's state, and a
  worker's metric shares turned into its batch's means.

  `servers` > 1: a parameter server sharded into that many shards
  (jaxdl.engines.shards): `pull` and `apply` run shard by shard, each
  shard's program on its own leaves (`shards`, laid out by `layout`), as
  the shards' processes run them."""

  def __init__(self, algorithm: Family, streams: Streams, servers: int = 1):
    self.algorithm, self.streams = algorithm, streams
    self.shares = streams.weights().sum(axis=1)  # b_m / B per worker
    self.fns = {name: jax.jit(fn) for name, fn in event_functions(algorithm).items()}
    for composed in ("pair", "exchange"):  # run as the programs of their parts (below)
      self.fns.pop(composed, None)
    self.layout, self.shards = None, []
    if servers > 1 and isinstance(algorithm, Centralized):
      self.layout, self.shards, self.fns["pull"], self.fns["apply"] = sharded(
          algorithm, *state_shapes(algorithm), servers)

  def __getattr__(self, name: str) -> Callable:
    try:
      return self.__dict__["fns"][name]
    except KeyError:
      raise AttributeError(name) from None

  def pair(self, worker, peer, k):
    """AD-PSGD's average of `worker` with `peer`, worker k: the worker's
    offer, the peer's answer and the worker's acceptance, each its own
    program (a real engine's worker and peer run them apart)."""
    worker, message = self.offer(worker, k)
    peer, reply = self.answer(peer, message)
    return self.accept(worker, reply), peer

  def exchange(self, center, worker):
    """EASGD's exchange: the worker's part given the center, then the
    center's, each its own program (a real engine's worker and center run
    them apart)."""
    worker, message = self.meet(worker, center)
    return self.take(center, message), worker

  def means(self, worker: int, shares: dict[str, Any]) -> dict[str, float]:
    """A worker's metric shares as its own batch's means (host floats)."""
    return {k: float(np.float32(v) / self.shares[worker]) for k, v in shares.items()}

  def jitted(self) -> list:
    return list(self.fns.values())

  def message_parts(self, state, batch: Batch) -> MessageParts:
    """A parameter server's messages (`MessageParts`): which leaves of a
    worker's state its gradient (`compute`) reads and changes, and which of
    those the server's programs (pull, apply, evaluated) read or change.
    Found in the functions' jaxprs, the same on every process for the same
    state's shapes; conservative: a leaf any operation takes counts as read."""
    fns = event_functions(self.algorithm)
    server = state_shapes(self.algorithm)[0]
    seconds = jax.ShapeDtypeStruct((), jnp.float32)
    reads, changes = _uses(fns["compute"], (state, batch), 0, lambda out: out[0])
    pull_reads, pull_changes = _uses(fns["pull"], (server, state, seconds), 1, lambda out: out)
    apply_reads, apply_changes = _uses(fns["apply"], (server, state, seconds), 1,
                                       lambda out: out[1])
    stacked = jax.tree.map(lambda x: jax.ShapeDtypeStruct((1, *np.shape(x)), x.dtype), state)
    evaluated = _uses(self.algorithm.evaluated, (server, stacked), 1, None)[0]
    served = pull_reads | pull_changes | apply_reads | apply_changes | evaluated
    private = (reads | changes) - served
    return MessageParts(tuple(sorted(reads)), tuple(sorted(changes)),
                        tuple(sorted((pull_changes | apply_changes) & reads)),
                        tuple(sorted(changes - private)), tuple(sorted(private)))


def _uses(fn: Callable, args: tuple, which: int, output) -> tuple[set[int], set[int]]:
  """(read, changed): the leaves of `args[which]` that fn(*args) reads (an
  operation takes it, or it is moved to another place of the output) and
  those whose place in `output(fn(*args))`, a tree of the same structure
  (None: none), holds something else. An output of another structure
  changes them all."""
  first = len(jax.tree.leaves(args[:which]))
  count = len(jax.tree.leaves(args[which]))
  closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
  jaxpr = closed.jaxpr
  invars = jaxpr.invars[first:first + count]
  outvars, places = jaxpr.outvars, None  # places[i]: where leaf i's place is in the output
  if output is not None:
    numbered = jax.tree.unflatten(jax.tree.structure(shapes), range(len(outvars)))
    try:
      part = output(numbered)
    except (TypeError, IndexError, AttributeError):
      part = None
    if jax.tree.structure(part) == jax.tree.structure(args[which]):
      places = jax.tree.leaves(part)
  own = lambda i: -1 if places is None else places[i]
  taken = {id(v) for eqn in jaxpr.eqns for v in eqn.invars}
  moved = lambda i, v: any(o is v for j, o in enumerate(outvars) if j != own(i))
  read = {i for i, v in enumerate(invars) if id(v) in taken or moved(i, v)}
  if output is None:
    return read, set()
  if places is None:
    return read | set(range(count)), set(range(count))
  return read, {i for i, v in enumerate(invars) if outvars[places[i]] is not v}


class EventReplay:
  """Runs a trace's events one at a time with `EventPrograms` (the sim
  engine's "events" batching): the math a real engine's processes ran, in
  the order they ran it.

  Where each gradient is computed, as a real engine's processes compute it:
  a centralized one on the worker's pulled state when its push is applied
  (it depends on nothing else); AD-PSGD's at its "pull" (the snapshot and
  its gradient are one event); a local step at its "local" event. A step's
  metrics are those of the gradients computed in it. GoSGD's messages in
  flight are the server's place, stacked over slots (the sim engine's
  state): `slots`, each event's slot (jaxdl.engines.sim.plan.message_slots).
  """

  def __init__(self, algorithm: Family, streams: Streams, servers: int = 1):
    if not isinstance(algorithm, (Centralized, Elastic, Gossip, Decentralized)):
      raise TypeError(f"no event replay for {type(algorithm).__name__}")
    self.programs = EventPrograms(algorithm, streams, servers)
    self.streams = streams
    # Moving a worker's state in and out of the stacked states: jitted, as
    # op-by-op indexing dispatched a gather or a scatter per leaf, most of a
    # replay's time; the stacked states written in place (donated) in a copy
    # of the caller's, made once a call.
    self._take = jax.jit(take)
    self._put = jax.jit(put, donate_argnums=0)
    self._copy = jax.jit(lambda states: jax.tree.map(jnp.copy, states))

  def __call__(self, server, workers, events: Sequence, metric_names: Sequence[str],
               slots: Sequence[int] = ()):
    """(server, workers, (metric sums, count)) after `events`."""
    sums, count = {k: 0.0 for k in metric_names}, 0
    p, algorithm, none = self.programs, self.programs.algorithm, np.float32(0.0)
    centralized = isinstance(algorithm, Centralized)
    take, put = self._take, self._put
    server, workers = self._copy((server, workers))
    for i, e in enumerate(events):
      if e.kind == "restart" and e.peer >= 0:  # the worker rejoins with a copy of peer's state
        workers = put(workers, e.worker, take(workers, e.peer))
        continue
      if e.kind in ("wait", "restart"):  # no math
        continue
      w, shares = e.worker, None
      worker = take(workers, w)
      batch = lambda: one_batch(self.streams, w, e.iteration)
      if e.kind == "pull" and centralized:
        worker = p.pull(server, worker, np.float32(e.duration))
      elif e.kind == "pull":
        worker, shares = p.compute(p.pull(server, worker, none), batch())
      elif e.kind == "apply" and centralized:
        worker, shares = p.compute(worker, batch())
        server, worker = p.apply(server, worker, np.float32(e.duration))
      elif e.kind == "apply":
        server, worker = p.apply(server, worker, none)
      elif e.kind == "local":
        worker, shares = p.local(worker, batch())
      elif e.kind == "exchange":
        server, worker = p.exchange(server, worker)
      elif e.kind == "send":
        worker, message = p.send(worker, np.int32(e.peer))
        server = put(server, slots[i], message)
      elif e.kind == "gossip":  # the receiver changes
        w, worker = e.peer, p.receive(take(workers, e.peer), take(server, slots[i]))
      elif e.kind == "average":
        worker, peer = p.pair(worker, take(workers, e.peer), np.int32(e.peer))
        workers = put(workers, e.peer, peer)
      else:
        raise ValueError(f"event {e}: not a {type(algorithm).__name__} event")
      workers = put(workers, w, worker)
      if shares is not None:
        for k, v in p.means(w, shares).items():
          sums[k] += v
        count += 1
    return server, workers, ({k: np.float32(v) for k, v in sums.items()}, np.float32(count))
