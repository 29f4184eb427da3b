"""The workers on ray of an algorithm whose workers keep their own models
(easgd, gosgd, ad_psgd): `Peer`, each asking its coordinator
(`jaxdl.engines.ray_coordinator.Coordinator`) before each event. GoSGD's
messages and AD-PSGD's averages go worker to worker; EASGD's exchange
meets the center at the coordinator.

A worker whose process dies is restarted by Ray: it rejoins with a copy of
another worker's whole state, taken in the trace's order (a "restart" event
naming that peer); whatever the dead process held that no other process
had is lost with it, in the run as in its replay. Calls made by a dead
process's incarnation that arrive after its restart are refused.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import jax
import numpy as np

from jaxdl.algorithms import Elastic, Gossip
from jaxdl.engines.base import process_identity
from jaxdl.engines.events import EventPrograms, one_batch, state_shapes
from jaxdl.engines.ray_messages import packed, unpacked_tree, wire_bytes
from jaxdl.engines.ray_process import emulated, padded, pin


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

  def __init__(self, fields, worker: int, coordinator: str):
    import ray
    pin(fields, worker)
    built = fields.recipe.rebuild()
    # the coordinator by name: Ray can restart this actor (see ray_server.Worker)
    self.w, self.coordinator, self.streams = worker, ray.get_actor(coordinator), built.streams
    self.algorithm, self.seed = built.algorithm, fields.seed
    self.programs = EventPrograms(built.algorithm, built.streams)
    self.like = _received_shapes(self.programs)
    self.cost = emulated(fields, built)
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

  def _deposit(self, owed: dict[int, list[int]]) -> None:
    """Its model as it is now, at the cuts it owes (`owed`: this worker's)."""
    import ray
    ray.get(self.coordinator.deposit.remote(owed, {self.w: jax.device_get(self.state)}))

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
                       seconds=padded(self.cost, self.w, c, start)):
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
            self._deposit(owed)
          if center is None:
            return
          new, message = self.programs.meet(self.state, self._message("center", center))
          done, owed = ray.get(self.coordinator.give.remote(
              self.w, c, packed(jax.tree.leaves(message)), self.incarnation))
          if owed:  # cuts that came while it held the center: before the exchange
            self._deposit(owed)
          if not done:
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
                         seconds=padded(self.cost, self.w, c, start)):
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
            self._deposit(owed)
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
