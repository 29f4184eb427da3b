"""The shapes of distributed algorithms: small typed records of pure functions.

An algorithm module's factory, ``build(settings, problem, num_workers)``,
returns one of these, its functions closed over the algorithm's settings (as
an optax transformation closes over its hyperparameters). Engines run the
functions; the declared policy fields (a staleness bound, a period, a
probability) tell them when. Nothing here sleeps, locks or reads a clock.

Metrics are "shares": a worker's loss weighted by its share b_m / B of the
global batch, so their sum over workers is the global batch's mean.

Which version a handler reads (the rule every engine follows):
  - a worker computes on what it pulled or snapshotted (`pull`), never on
    parameters that changed after;
  - a message is decided when it is sent (`Gossip.send`) and delivered as
    sent (`Gossip.receive`), whatever the sender did in between;
  - a server applies a worker's push on arrival (`apply`, `exchange`), to the
    server's state at that moment.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Union

import jax

Metrics = dict[str, jax.Array]
State = Any


def _no_report(server: State) -> dict:
  del server
  return {}


@dataclasses.dataclass(frozen=True)
class Collective:
  """Every worker steps at once; the workers talk through collectives over
  `axis` (a WorkerAxis), the same function on a device mesh or vmapped.

  init(key, worker) -> worker state
  step(worker, batch, step, axis) -> (worker, metric shares); `step` is the
    global step (a traced int32)
  evaluated(workers) -> (params, model_state), from the states stacked over
    workers
  """
  init: Callable[[jax.Array, jax.Array], State]
  step: Callable[..., tuple[State, Metrics]]
  evaluated: Callable[[State], tuple[Any, Any]]
  bytes_per_step: float = 0.0
  """Bytes all workers send in one step, for the summary."""
  sync: str = "allreduce"
  """What the cluster does each step: "allreduce" (a ring among the workers),
  "ps" (push to and pull from a parameter server) or "local" (an all-reduce
  every `period` steps, nothing between)."""
  period: int = 1


@dataclasses.dataclass(frozen=True)
class Centralized:
  """A parameter server: each worker loops pull -> compute -> push, and the
  server applies every push on arrival (ASP, SSP, DC-ASGD, LC-ASGD).

  init_server(key) -> server state
  init(key, worker) -> worker state
  pull(server, worker, seconds) -> worker: the worker takes the server's
    parameters; `seconds` is the transfer's duration (float32)
  compute(worker, batch) -> (worker, metric shares): the gradient of what the
    worker pulled
  apply(server, worker, seconds) -> (server, worker): the server applies the
    worker's gradient; `seconds` is the iteration's compute time
  evaluated(server, workers) -> (params, model_state)
  report(server) -> {name: scalar} for the summary
  """
  init_server: Callable[[jax.Array], State]
  init: Callable[[jax.Array, jax.Array], State]
  pull: Callable[[State, State, jax.Array], State]
  compute: Callable[[State, Any], tuple[State, Metrics]]
  apply: Callable[[State, State, jax.Array], tuple[State, State]]
  evaluated: Callable[[State, State], tuple[Any, Any]]
  report: Callable[[State], dict] = _no_report
  bytes_per_step: float = 0.0
  staleness_bound: int | None = None
  """A worker starts iteration c only once every worker has finished c - s
  (None: never blocked)."""


@dataclasses.dataclass(frozen=True)
class Elastic:
  """Local steps, and every `period` of them an exchange with a center (EASGD).

  init_server(key) -> center;  init(key, worker) -> worker
  local(worker, batch) -> (worker, metric shares)
  exchange(center, worker) -> (center, worker), on the worker's arrival
  evaluated(center, workers) -> (params, model_state);  report(center) -> dict

  An exchange as its messages, for an engine whose worker and center are
  apart (exchange is take of meet; None: the worker runs `exchange` on the
  center it was given and sends the center's new state; `exchange_parts`):
  meet(worker, center) -> (worker, message): the worker's part, given the
    center as it is, and what it sends the center
  take(center, message) -> center: the center's part
  """
  init_server: Callable[[jax.Array], State]
  init: Callable[[jax.Array, jax.Array], State]
  local: Callable[[State, Any], tuple[State, Metrics]]
  exchange: Callable[[State, State], tuple[State, State]]
  evaluated: Callable[[State, State], tuple[Any, Any]]
  report: Callable[[State], dict] = _no_report
  bytes_per_step: float = 0.0
  period: int = 1
  meet: Callable[[State, State], tuple[State, Any]] | None = None
  take: Callable[[State, Any], State] | None = None


@dataclasses.dataclass(frozen=True)
class Gossip:
  """Local steps; after each, with `probability`, a message to a random peer
  (GoSGD). No server.

  init(key, worker) -> worker
  local(worker, batch) -> (worker, metric shares)
  send(worker, peer) -> (worker, message): what the message to worker `peer`
    (an int32) carries is decided here
  receive(worker, message) -> worker: the peer merges it on arrival
  evaluated(workers) -> (params, model_state)
  """
  init: Callable[[jax.Array, jax.Array], State]
  local: Callable[[State, Any], tuple[State, Metrics]]
  send: Callable[[State, jax.Array], tuple[State, Any]]
  receive: Callable[[State, Any], State]
  evaluated: Callable[[State], tuple[Any, Any]]
  bytes_per_step: float = 0.0
  probability: float = 0.0


@dataclasses.dataclass(frozen=True)
class Decentralized:
  """Each worker loops: snapshot its model, compute on the snapshot, average
  with a random neighbour atomically, apply its gradient (AD-PSGD). No server.

  init(key, worker) -> worker
  pull(worker) -> worker: the snapshot the next gradient is computed on
  compute(worker, batch) -> (worker, metric shares)
  average(worker, peer) -> (worker, peer), atomic
  apply(worker) -> worker: the gradient applied to the worker's own model
  evaluated(workers) -> (params, model_state)

  An average as its two messages, for an engine whose workers are apart
  (average is accept of answer of offer; None: the worker's whole state
  goes, and the peer runs `average`; `average_parts`):
  offer(worker, peer) -> (worker, message): the worker's part before, and
    what it sends worker `peer` (an int32)
  answer(peer, message) -> (peer, reply): the peer's part, and what it sends back
  accept(worker, reply) -> worker: the worker's part after
  """
  init: Callable[[jax.Array, jax.Array], State]
  pull: Callable[[State], State]
  compute: Callable[[State, Any], tuple[State, Metrics]]
  average: Callable[[State, State], tuple[State, State]]
  apply: Callable[[State], State]
  evaluated: Callable[[State], tuple[Any, Any]]
  bytes_per_step: float = 0.0
  offer: Callable[[State, jax.Array], tuple[State, Any]] | None = None
  answer: Callable[[State, Any], tuple[State, Any]] | None = None
  accept: Callable[[State, Any], State] | None = None


def exchange_parts(algorithm: Elastic) -> tuple[Callable, Callable]:
  """(meet, take): the algorithm's own, or `exchange` run by the worker."""
  if algorithm.meet is not None:
    return algorithm.meet, algorithm.take

  def meet(worker, center):
    center, worker = algorithm.exchange(center, worker)
    return worker, center
  return meet, lambda center, message: message


def average_parts(algorithm: Decentralized) -> tuple[Callable, Callable, Callable]:
  """(offer, answer, accept): the algorithm's own, or `average` run by the peer."""
  if algorithm.offer is not None:
    return algorithm.offer, algorithm.answer, algorithm.accept

  def answer(peer, worker):
    worker, peer = algorithm.average(worker, peer)
    return peer, worker
  return lambda worker, peer: (worker, worker), answer, lambda worker, reply: reply


Shape = Union[Collective, Centralized, Elastic, Gossip, Decentralized]
SHAPES = (Collective, Centralized, Elastic, Gossip, Decentralized)
EVENT_SHAPES = (Centralized, Elastic, Gossip, Decentralized)
# Shapes with a server whose state the engine keeps (the others keep ()).
SERVER_SHAPES = (Centralized, Elastic)


def has_server(algorithm: Shape) -> bool:
  return isinstance(algorithm, SERVER_SHAPES)
