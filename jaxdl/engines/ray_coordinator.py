"""The central actor of an algorithm on ray whose workers keep their own
models (easgd, gosgd, ad_psgd): `Coordinator`, which grants every worker's
events one order, the trace's, holds EASGD's center, pairs AD-PSGD's
workers and gathers the workers' models at the steps the driver reads (its
workers: `jaxdl.engines.ray_peers.Peer`).
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxdl.engines.ray_ledger import Ledger
from jaxdl.engines.ray_messages import packed, unpacked_tree, wire_bytes


class Coordinator(Ledger):
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

  def __init__(self, fields, observed: list[int]):
    super().__init__(fields, observed)
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

  async def give(self, w: int, c: int, message: np.ndarray, incarnation: int):
    """EASGD: worker w's message, after its local step c, meets the center
    it took: (whether the exchange took place (not once the run is over),
    the cuts w came to owe while it held the center, which precede the
    exchange: it deposits its model from before the exchange at them)."""
    if self._stale(w, incarnation):
      return False, {}
    self.lent = None
    owed = self._owed(w)
    done = not self.finished
    if done:
      self.server = self.programs.take(self.server, unpacked_tree(message, self.take_like))
      self._event("exchange", w, iteration=c)
      self.bytes_total += wire_bytes(message)
    await self._notify()
    return done, owed

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
