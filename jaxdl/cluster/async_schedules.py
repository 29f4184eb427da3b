"""Asynchronous schedules: ASP and SSP at a parameter server, EASGD, GoSGD,
AD-PSGD, each a loop per worker on a discrete-event simulator.

Events are emitted as a heap of (time, sequence number) pops them, so the
list is sorted by time with ties in causal order. A schedule runs until a
global `Budget` is spent, as in the papers' systems: every worker loops
(pull, compute, push; or local steps and messages) until the workers
together have made the budget's updates or processed its samples, so a fast
worker makes proportionally more updates than a slow one and nobody stops
early. The schedule ends with the update that spends the budget; iterations
still in flight then are dropped, as a real run that stops at its budget
drops them.
"""
from __future__ import annotations

import heapq
import numbers
from typing import Callable, Sequence

from jaxdl.cluster.cost import CostModel
from jaxdl.cluster.network import Network
from jaxdl.cluster.schedule import Budget, Schedule, _check, _other
from jaxdl.trace import Event


class _Sim:
  """A virtual clock, a heap of pending actions and the events emitted so far;
  for an asynchronous schedule, the budget and what has been spent of it."""

  def __init__(self, cost: CostModel, budget: Budget | int | None = None):
    self.cost, self.net = cost, Network(cost)
    self.now, self.events = 0.0, []
    self._heap, self._seq = [], 0
    self.budget = budget if budget is None or isinstance(budget, Budget) else Budget(budget)
    self.spent = 0
    self.done = self.budget is not None and self.budget.samples == 0

  def update(self, kind: str, worker: int, **fields) -> bool:
    """Emits a worker's update ("apply" or "local") and charges the budget;
    True once it is spent (the schedule then ends)."""
    self.emit(kind, worker, **fields)
    self.spent += self.budget.size(worker)
    self.done = self.spent >= self.budget.samples
    return self.done

  def at(self, time: float, action: int, worker: int, iteration: int = -1, peer: int = -1):
    # The sequence number breaks ties deterministically, in the order scheduled.
    heapq.heappush(self._heap, (time, self._seq, action, worker, iteration, peer))
    self._seq += 1

  def served(self, seconds: float, asker: int, action: int, handler: Callable,
             worker: int, iteration: int = -1, peer: int = -1) -> None:
    """Runs `handler` now or, where a central process (a real engine's) first
    serves `asker`'s call for `seconds`, as `action` once it has."""
    if seconds:
      self.at(self.net.serve(asker, self.now, seconds), action, worker, iteration, peer)
    else:
      handler(worker, iteration, peer)

  def emit(self, kind: str, worker: int, **fields) -> None:
    self.events.append(Event(self.now, kind, worker, **fields))

  def run(self, handlers: Sequence[Callable[[int, int, int], None]]) -> Schedule:
    while self._heap and not self.done:
      self.now, _, action, worker, iteration, peer = heapq.heappop(self._heap)
      handlers[action](worker, iteration, peer)
    return Schedule(self.events, self.net.bytes_total, self.net.queued_s)


def centralized(cost: CostModel, budget: Budget | int,
                staleness_bound: int | None = None) -> Schedule:
  """ASP (bound None) or SSP (Ho et al., NeurIPS'13) at a k-shard parameter server.

  Each worker loops until the budget is spent: pull (the server's reply
  crosses the shared shard links), compute, push (the shard links again),
  apply on arrival, pull again. A "pull" records its transfer seconds and an
  "apply" the iteration's compute seconds as `duration` (LC-ASGD's t_comm and
  t_comp). Under SSP a worker starts iteration c only once every worker has
  applied c - s iterations; until then it waits, and a "wait" event records
  how long: the bound is the only reason a worker waits. With a central
  process's time per update (`cost.server_s`, measured on a real engine), a
  push is applied once the server, one update at a time, has served it.
  """
  bound = staleness_bound
  ok = bound is None or (isinstance(bound, numbers.Integral) and bound >= 0)
  _check("staleness_bound", bound, ok, "an integer >= 0, or None for ASP")
  sim, m = _Sim(cost, budget), cost.num_workers
  clocks, waiting = [0] * m, {}  # iterations applied; waiting worker -> since
  computing = {}  # (worker, iteration) -> its compute seconds
  state = {"version": 0}
  PUSH, APPLY, ARRIVE = 0, 1, 2

  def start(w: int) -> None:
    c = clocks[w]
    if bound is not None and min(clocks) < c - bound:
      waiting[w] = sim.now
      return
    arrived, compute = sim.net.pull(w, sim.now), cost.compute_time(w, c)
    sim.emit("pull", w, iteration=c, version=state["version"], duration=arrived - sim.now)
    computing[w, c] = compute
    sim.at(arrived + compute, PUSH, w, c)

  def push(w: int, c: int, _) -> None:
    sim.at(sim.net.push(w, sim.now), ARRIVE, w, c)

  def arrive(w: int, c: int, _) -> None:
    sim.served(cost.server_s, w, APPLY, apply, w, c)

  def apply(w: int, c: int, _) -> None:
    state["version"] += 1
    if sim.update("apply", w, iteration=c, version=state["version"],
                  duration=computing.pop((w, c))):
      return
    clocks[w] += 1
    # Release the longest-waiting workers first: their pulls queue first.
    for v in sorted(waiting, key=lambda v: (waiting[v], v)):
      if min(clocks) >= clocks[v] - bound:
        since = waiting.pop(v)
        if sim.now > since:
          sim.emit("wait", v, iteration=clocks[v], duration=sim.now - since)
        start(v)
    start(w)

  if not sim.done:
    for w in range(m):
      start(w)
  return sim.run((push, apply, arrive))


def elastic(cost: CostModel, budget: Budget | int, period: int) -> Schedule:
  """EASGD (Zhang et al., NeurIPS'15): `period` local steps, then an exchange.

  The exchange sends the worker's model to the center over the shard links;
  the elastic update happens on arrival ("exchange"), and the worker resumes
  once the center's reply is back (it is idle meanwhile, so the model that
  arrives is the one it sent). A real engine's central process serves each
  exchange in `cost.server_s` and grants each local step in `cost.order_s`,
  one call at a time.
  """
  _check("communication_period", period, isinstance(period, numbers.Integral) and period >= 1,
         "an integer >= 1 (local steps between exchanges)")
  sim = _Sim(cost, budget)
  COMPUTED, ARRIVE, LOCAL, EXCHANGE = 0, 1, 2, 3

  def step(w: int, i: int, ready: float) -> None:
    sim.at(ready + cost.compute_time(w, i), COMPUTED, w, i)

  def computed(w: int, i: int, _) -> None:
    sim.served(cost.order_s, w, LOCAL, local, w, i)

  def local(w: int, i: int, _) -> None:
    if sim.update("local", w, iteration=i):
      return
    if (i + 1) % period == 0:
      sim.at(sim.net.push(w, sim.now), ARRIVE, w, i)
    else:
      step(w, i + 1, sim.now)

  def arrive(w: int, i: int, _) -> None:
    sim.served(cost.server_s, w, EXCHANGE, exchange, w, i)

  def exchange(w: int, i: int, _) -> None:
    sim.emit("exchange", w, iteration=i)
    step(w, i + 1, sim.net.pull(w, sim.now))

  for w in range(cost.num_workers):
    step(w, 0, 0.0)
  return sim.run((computed, arrive, local, exchange))


def gossip(cost: CostModel, budget: Budget | int, probability: float) -> Schedule:
  """GoSGD (Blot et al. 2016): after each local step, push to a random peer w.p. p.

  The push ("send") fixes the message, the sender's model and half its weight
  at that moment (a model's bytes, or with compressed messages,
  `cost.message_bytes`). The sender goes on at once while the message crosses
  its own and the peer's links; the peer merges the message as sent on
  arrival ("gossip"). A worker has one message in flight at a time, as a
  real sender reuses its send buffer (MPI's Isend then Wait, the ray
  engine's wait for its last message): a push while its last message is
  still in flight waits for that message's merge ("wait", its duration),
  then is sent. Without that bound, gossip faster than the links carry
  would queue without end, each message older on arrival than the last.
  With a central process's time per event (`cost.order_s`: a real engine's
  coordinator orders every event), each event happens once granted, one
  grant at a time.
  """
  _check("gossip_probability", probability, 0.0 <= probability <= 1.0,
         "a probability in [0, 1]")
  sim, m, order = _Sim(cost, budget), cost.num_workers, cost.order_s
  COMPUTED, DELIVER, LOCAL, MERGE = 0, 1, 2, 3
  in_flight = [False] * m  # per worker: its last message not yet merged
  held = [None] * m        # per worker: (the step whose push waits for it, since when)

  def step(w: int, i: int, ready: float) -> None:
    sim.at(ready + cost.compute_time(w, i), COMPUTED, w, i)

  def computed(w: int, i: int, _) -> None:
    sim.served(order, w, LOCAL, local, w, i)

  def local(w: int, i: int, _) -> None:
    if sim.update("local", w, iteration=i):
      return
    if m > 1 and cost.uniform("gossip", w, i) < probability:
      if in_flight[w]:
        held[w] = i, sim.now
      else:
        send(w, i)
    else:
      step(w, i + 1, sim.now)

  def send(w: int, i: int) -> None:
    peer = _other(cost.uniform("gossip_peer", w, i), w, m)
    sim.emit("send", w, iteration=i, peer=peer)
    in_flight[w], ready = True, sim.now
    if order:  # the send's own grant (the message is the model as it is now)
      ready = sim.net.serve(w, ready, order)
    sim.at(sim.net.peer(w, peer, ready, cost.push_bytes), DELIVER, w, i, peer)
    step(w, i + 1, ready)

  def deliver(w: int, i: int, peer: int) -> None:
    sim.served(order, peer, MERGE, merge, w, i, peer)

  def merge(w: int, i: int, peer: int) -> None:
    sim.emit("gossip", w, iteration=i, peer=peer)
    in_flight[w] = False
    if held[w] is not None:
      (j, since), held[w] = held[w], None
      sim.emit("wait", w, iteration=j, duration=sim.now - since)
      send(w, j)

  for w in range(m):
    step(w, 0, 0.0)
  return sim.run((computed, deliver, local, merge))


def decentralized(cost: CostModel, budget: Budget | int) -> Schedule:
  """AD-PSGD (Lian et al., ICML'18): pull own snapshot, compute, average, apply.

  The neighbour is a uniformly random other worker; the average happens when
  the round trip of models (or of compressed messages, `cost.message_bytes`,
  one each way) over both workers' links completes, atomically on
  both models as they are then (the paper's atomic averaging; the worker is
  idle meanwhile). Real runs split workers into active and passive sets to
  avoid deadlock; a simulation serialises every exchange, so it needs no such
  split. With a central process's time per call (`cost.order_s`: a real
  engine's coordinator), an update takes five calls, one at a time: the
  worker's grant of its gradient and taking the pair, then the peer's grant
  of the average, then releasing the pair and the apply's grant.
  """
  sim, m, order = _Sim(cost, budget), cost.num_workers, cost.order_s
  COMPUTED, REPLY, AVERAGED, PAIRED, GRANTED, APPLY = range(6)

  def start(w: int, c: int) -> None:
    sim.emit("pull", w, iteration=c)
    sim.at(sim.now + cost.compute_time(w, c), COMPUTED, w, c)

  def computed(w: int, c: int, _) -> None:
    peer = -1 if m == 1 else _other(cost.uniform("neighbour", w, c), w, m)
    sim.served((1 if m == 1 else 2) * order, w, PAIRED, paired, w, c, peer)

  def paired(w: int, c: int, peer: int) -> None:
    if peer < 0:
      averaged(w, c, peer)
    else:
      sim.at(sim.net.peer(w, peer, sim.now, cost.push_bytes), REPLY, w, c, peer)

  def reply(w: int, c: int, peer: int) -> None:
    sim.served(order, peer, GRANTED, granted, w, c, peer)

  def granted(w: int, c: int, peer: int) -> None:
    sim.at(sim.net.peer(peer, w, sim.now, cost.push_bytes, waiter=w), AVERAGED, w, c, peer)

  def averaged(w: int, c: int, peer: int) -> None:
    if peer >= 0:
      sim.emit("average", w, iteration=c, peer=peer)
    sim.served((1 if peer < 0 else 2) * order, w, APPLY, apply, w, c, peer)

  def apply(w: int, c: int, _) -> None:
    if not sim.update("apply", w, iteration=c):
      start(w, c + 1)

  if not sim.done:
    for w in range(m):
      start(w, 0)
  return sim.run((computed, reply, averaged, paired, granted, apply))
