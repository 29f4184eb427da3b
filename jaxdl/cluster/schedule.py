"""Discrete-event schedules: when each event of `jaxdl.trace` happens.

One function per algorithm shape, `(cost, iterations, **policy) -> Schedule`:
a list of events in the order the math must run them, with times from the
cost model. Events are emitted as a heap of (time, sequence number) pops them,
so the list is sorted by time with ties in causal order, and a "pull"'s
version always equals the number of "apply" events before it.
"""
from __future__ import annotations

import heapq
import numbers
from typing import Callable, Iterable, Sequence

from jaxdl.cluster.cost import CostModel, Network
from jaxdl.trace import Event

SYNC_MODES = ("ps", "allreduce", "local")


class Schedule(list):
  """A list of events, plus the traffic that produced them."""

  def __init__(self, events: Iterable[Event] = (), bytes_total: float = 0.0,
               queued_s: Sequence[float] = ()):
    super().__init__(events)
    self.bytes_total = float(bytes_total)  # bytes sent over all links
    self.queued_s = tuple(queued_s)        # per worker: seconds queued for busy links


class _Sim:
  """A virtual clock, a heap of pending actions and the events emitted so far."""

  def __init__(self, cost: CostModel):
    self.cost, self.net = cost, Network(cost)
    self.now, self.events = 0.0, []
    self._heap, self._seq = [], 0

  def at(self, time: float, action: int, worker: int, iteration: int = -1, peer: int = -1):
    # The sequence number breaks ties deterministically, in the order scheduled.
    heapq.heappush(self._heap, (time, self._seq, action, worker, iteration, peer))
    self._seq += 1

  def emit(self, kind: str, worker: int, **fields) -> None:
    self.events.append(Event(self.now, kind, worker, **fields))

  def run(self, handlers: Sequence[Callable[[int, int, int], None]]) -> Schedule:
    while self._heap:
      self.now, _, action, worker, iteration, peer = heapq.heappop(self._heap)
      handlers[action](worker, iteration, peer)
    return Schedule(self.events, self.net.bytes_total, self.net.queued_s)


def _check(field: str, value, ok: bool, allowed: str) -> None:
  """An argument out of range: a programming error (users' settings are
  validated at the edge, by the algorithms' settings)."""
  if not ok:
    raise ValueError(f"{field}={value!r}: {allowed}")


def _check_iterations(iterations: int) -> None:
  _check("iterations", iterations, isinstance(iterations, numbers.Integral) and iterations >= 0,
         "an integer >= 0")


def _other(u: float, worker: int, num_workers: int) -> int:
  """A uniformly random worker other than `worker`, from a uniform draw u."""
  k = min(int(u * (num_workers - 1)), num_workers - 2)
  return k if k < worker else k + 1


def centralized(cost: CostModel, iterations: int,
                staleness_bound: int | None = None) -> Schedule:
  """ASP (bound None) or SSP (Ho et al., NeurIPS'13) at a k-shard parameter server.

  Each worker loops: pull (the server's reply crosses the shared shard links),
  compute, push (the shard links again), apply on arrival, pull again. A
  "pull" records its transfer seconds and an "apply" the iteration's compute
  seconds as `duration` (LC-ASGD's t_comm and t_comp). Under
  SSP a worker starts iteration c only once every worker has applied c - s
  iterations; until then it waits, and a "wait" event records how long.
  """
  _check_iterations(iterations)
  bound = staleness_bound
  ok = bound is None or (isinstance(bound, numbers.Integral) and bound >= 0)
  _check("staleness_bound", bound, ok, "an integer >= 0, or None for ASP")
  sim, m = _Sim(cost), cost.num_workers
  clocks, waiting = [0] * m, {}  # iterations applied; waiting worker -> since
  computing = {}  # (worker, iteration) -> its compute seconds
  state = {"version": 0}
  PUSH, APPLY = 0, 1

  def start(w: int) -> None:
    c = clocks[w]
    if c >= iterations:
      return
    if bound is not None and min(clocks) < c - bound:
      waiting[w] = sim.now
      return
    arrived, compute = sim.net.pull(w, sim.now), cost.compute_time(w, c)
    sim.emit("pull", w, iteration=c, version=state["version"], duration=arrived - sim.now)
    computing[w, c] = compute
    sim.at(arrived + compute, PUSH, w, c)

  def push(w: int, c: int, _) -> None:
    sim.at(sim.net.push(w, sim.now), APPLY, w, c)

  def apply(w: int, c: int, _) -> None:
    state["version"] += 1
    sim.emit("apply", w, iteration=c, version=state["version"],
             duration=computing.pop((w, c)))
    clocks[w] += 1
    # Release the longest-waiting workers first: their pulls queue first.
    for v in sorted(waiting, key=lambda v: (waiting[v], v)):
      if min(clocks) >= clocks[v] - bound:
        since = waiting.pop(v)
        if sim.now > since:
          sim.emit("wait", v, iteration=clocks[v], duration=sim.now - since)
        start(v)
    start(w)

  for w in range(m):
    start(w)
  return sim.run((push, apply))


def elastic(cost: CostModel, iterations: int, period: int) -> Schedule:
  """EASGD (Zhang et al., NeurIPS'15): `period` local steps, then an exchange.

  The exchange sends the worker's model to the center over the shard links;
  the elastic update happens on arrival ("exchange"), and the worker resumes
  once the center's reply is back.
  """
  _check_iterations(iterations)
  _check("communication_period", period, isinstance(period, numbers.Integral) and period >= 1,
         "an integer >= 1 (local steps between exchanges)")
  sim = _Sim(cost)
  COMPUTED, EXCHANGE = 0, 1

  def step(w: int, i: int, ready: float) -> None:
    if i < iterations:
      sim.at(ready + cost.compute_time(w, i), COMPUTED, w, i)

  def computed(w: int, i: int, _) -> None:
    sim.emit("local", w, iteration=i)
    if (i + 1) % period == 0:
      sim.at(sim.net.push(w, sim.now), EXCHANGE, w, i)
    else:
      step(w, i + 1, sim.now)

  def exchange(w: int, i: int, _) -> None:
    sim.emit("exchange", w, iteration=i)
    step(w, i + 1, sim.net.pull(w, sim.now))

  for w in range(cost.num_workers):
    step(w, 0, 0.0)
  return sim.run((computed, exchange))


def gossip(cost: CostModel, iterations: int, probability: float) -> Schedule:
  """GoSGD (Blot et al. 2016): after each local step, push to a random peer w.p. p.

  The sender does not wait: its next step starts at once while the message
  crosses its own and the peer's links; the peer merges on arrival ("gossip").
  """
  _check_iterations(iterations)
  _check("gossip_probability", probability, 0.0 <= probability <= 1.0,
         "a probability in [0, 1]")
  sim, m = _Sim(cost), cost.num_workers
  COMPUTED, DELIVER = 0, 1

  def step(w: int, i: int, ready: float) -> None:
    if i < iterations:
      sim.at(ready + cost.compute_time(w, i), COMPUTED, w, i)

  def computed(w: int, i: int, _) -> None:
    sim.emit("local", w, iteration=i)
    if m > 1 and cost.uniform("gossip", w, i) < probability:
      peer = _other(cost.uniform("gossip_peer", w, i), w, m)
      sim.at(sim.net.peer(w, peer, sim.now), DELIVER, w, i, peer)
    step(w, i + 1, sim.now)

  def deliver(w: int, i: int, peer: int) -> None:
    sim.emit("gossip", w, iteration=i, peer=peer)

  for w in range(m):
    step(w, 0, 0.0)
  return sim.run((computed, deliver))


def decentralized(cost: CostModel, iterations: int) -> Schedule:
  """AD-PSGD (Lian et al., ICML'18): pull own snapshot, compute, average, apply.

  The neighbour is a uniformly random other worker; the average happens when
  the round trip of models over both workers' links completes. Real runs split
  workers into active and passive sets to avoid deadlock; a simulation
  serialises every exchange, so it needs no such split.
  """
  _check_iterations(iterations)
  sim, m = _Sim(cost), cost.num_workers
  COMPUTED, REPLY, AVERAGED = 0, 1, 2

  def start(w: int, c: int) -> None:
    if c < iterations:
      sim.emit("pull", w, iteration=c)
      sim.at(sim.now + cost.compute_time(w, c), COMPUTED, w, c)

  def computed(w: int, c: int, _) -> None:
    if m == 1:
      averaged(w, c, -1)
    else:
      peer = _other(cost.uniform("neighbour", w, c), w, m)
      sim.at(sim.net.peer(w, peer, sim.now), REPLY, w, c, peer)

  def reply(w: int, c: int, peer: int) -> None:
    sim.at(sim.net.peer(peer, w, sim.now, waiter=w), AVERAGED, w, c, peer)

  def averaged(w: int, c: int, peer: int) -> None:
    if peer >= 0:
      sim.emit("average", w, iteration=c, peer=peer)
    sim.emit("apply", w, iteration=c)
    start(w, c + 1)

  for w in range(m):
    start(w, 0)
  return sim.run((computed, reply, averaged))


def synchronous(cost: CostModel, iterations: int, mode: str = "allreduce",
                period: int = 1) -> Schedule:
  """BSP ("ps"), AR-SGD ("allreduce") or local SGD ("local", every `period` steps).

  One "step" event per global step, and a "wait" event for each worker idle at
  a barrier: from the end of its compute until the last worker's gradient is
  at the server ("ps") or until the slowest worker finishes ("allreduce").
  """
  _check_iterations(iterations)
  _check("sync_mode", mode, mode in SYNC_MODES, "one of " + ", ".join(SYNC_MODES))
  _check("communication_period", period, isinstance(period, numbers.Integral) and period >= 1,
         "an integer >= 1 (local steps between averagings)")
  if mode == "ps":
    return _bsp(cost, iterations)
  m, clock, events = cost.num_workers, [0.0] * cost.num_workers, []
  ring, rounds = cost.ring_allreduce_time(), 0
  period = period if mode == "local" else 1
  for g in range(iterations):
    clock = [t + cost.compute_time(w, g) for w, t in enumerate(clock)]
    if (g + 1) % period:  # local SGD between averagings: no barrier
      events.append(Event(max(clock), "step", -1, iteration=g))
      continue
    barrier = max(clock)
    events.extend(Event(barrier, "wait", w, iteration=g, duration=barrier - t)
                  for w, t in enumerate(clock) if t < barrier)
    clock, rounds = [barrier + ring] * m, rounds + 1
    events.append(Event(barrier + ring, "step", -1, iteration=g))
  # Ring all-reduce: each worker sends 2(M-1)/M of the model per round.
  return Schedule(events, rounds * 2 * (m - 1) * cost.model_bytes, (0.0,) * m)


def _bsp(cost: CostModel, iterations: int) -> Schedule:
  """BSP at a parameter server: push when done, apply when all are in, pull."""
  m, net, events = cost.num_workers, Network(cost), []
  ready = [0.0] * m  # replicas start equal: no pull before the first step
  for g in range(iterations):
    done = [ready[w] + cost.compute_time(w, g) for w in range(m)]
    # Pushes reach the shared links in the order the workers finish.
    barrier = max(net.push(w, done[w]) for w in sorted(range(m), key=lambda w: (done[w], w)))
    events.extend(Event(barrier, "wait", w, iteration=g, duration=barrier - t)
                  for w, t in enumerate(done) if t < barrier)
    events.append(Event(barrier, "step", -1, iteration=g))
    if g + 1 < iterations:  # rotate who is served first, so no worker is favoured
      for j in range(m):
        ready[(g + j) % m] = net.pull((g + j) % m, barrier)
  return Schedule(events, net.bytes_total, net.queued_s)
