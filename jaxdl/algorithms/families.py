"""The families of distributed algorithms: small typed records of pure functions.

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
from typing import Any, Protocol, Union

import jax

Metrics = dict[str, jax.Array]
"""Named scalar shares of the global batch's means (summed over workers)."""
State = Any
"""A pytree of arrays: each algorithm's own NamedTuple (a worker's TrainState,
a server's ServerState, ...), stacked over workers where an engine keeps them
together."""
Message = Any
"""A pytree of arrays that one process sends another (a model, a gradient, a
compressed payload)."""
Evaluated = tuple[Any, Any]
"""(params, model_state) of the model to evaluate."""


# The functions' types, as optax's TransformInitFn and TransformUpdateFn.

class InitFn(Protocol):
  def __call__(self, key: jax.Array, worker: jax.Array) -> State:
    """Worker `worker`'s state at step 0 (the same model on every worker)."""


class InitServerFn(Protocol):
  def __call__(self, key: jax.Array) -> State:
    """The server's (or center's) state at step 0."""


class StepFn(Protocol):
  def __call__(self, worker: State, batch: Any, step: jax.Array, axis: Any
               ) -> tuple[State, Metrics]:
    """One synchronous step of every worker at once: the worker's new state
    and its metric shares; `step` the global step (int32), `axis` the
    WorkerAxis its collectives run over."""


class BatchFn(Protocol):
  def __call__(self, worker: State, batch: Any) -> tuple[State, Metrics]:
    """A worker's work on one batch (a local step, or a gradient on what it
    pulled): its new state and metric shares."""


class ServerPullFn(Protocol):
  def __call__(self, server: State, worker: State, seconds: jax.Array) -> State:
    """The worker's state with the server's parameters taken; `seconds` the
    transfer's duration (float32)."""


class ServerApplyFn(Protocol):
  def __call__(self, server: State, worker: State, seconds: jax.Array
               ) -> tuple[State, State]:
    """(server, worker) after the server applies the worker's push on
    arrival; `seconds` the iteration's compute time (float32)."""


class MeetFn(Protocol):
  def __call__(self, server: State, worker: State) -> tuple[State, State]:
    """(server, worker) after they meet: an exchange with a center."""


class EvaluatedFn(Protocol):
  def __call__(self, workers: State) -> Evaluated:
    """The model to evaluate, from the workers' states stacked."""


class ServerEvaluatedFn(Protocol):
  def __call__(self, server: State, workers: State) -> Evaluated:
    """The model to evaluate, from the server's and the stacked workers' states."""


class ReportFn(Protocol):
  def __call__(self, server: State) -> dict:
    """The algorithm's own summary figures (name -> scalar)."""


class SendFn(Protocol):
  def __call__(self, worker: State, peer: jax.Array) -> tuple[State, Message]:
    """(the sender's state after, what it sends worker `peer`, an int32)."""


class ReceiveFn(Protocol):
  def __call__(self, worker: State, message: Message) -> tuple[State, Message] | State:
    """The receiver's part on a message's arrival (with a reply, where the
    function is one half of an exchange)."""


class WorkerFn(Protocol):
  def __call__(self, worker: State) -> State:
    """A worker's state after a step of its own (a snapshot, an apply)."""


class PairFn(Protocol):
  def __call__(self, worker: State, peer: State) -> tuple[State, State]:
    """Two workers' states after they average, atomically."""


def _no_report(server: State) -> dict:
  del server
  return {}


@dataclasses.dataclass(frozen=True)
class Collective:
  """Every worker steps at once; the workers talk through collectives over
  `axis` (a WorkerAxis), the same function on a device mesh or vmapped.

  - init(key, worker) -> worker state
  - step(worker, batch, step, axis) -> (worker, metric shares); `step` is the
    global step (a traced int32)
  - evaluated(workers) -> (params, model_state), from the states stacked over
    workers
  """
  init: InitFn
  step: StepFn
  evaluated: EvaluatedFn
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

  - init_server(key) -> server state
  - init(key, worker) -> worker state
  - pull(server, worker, seconds) -> worker: the worker takes the server's
    parameters; `seconds` is the transfer's duration (float32)
  - compute(worker, batch) -> (worker, metric shares): the gradient of what the
    worker pulled
  - apply(server, worker, seconds) -> (server, worker): the server applies the
    worker's gradient; `seconds` is the iteration's compute time
  - evaluated(server, workers) -> (params, model_state)
  - report(server) -> {name: scalar} for the summary
  """
  init_server: InitServerFn
  init: InitFn
  pull: ServerPullFn
  compute: BatchFn
  apply: ServerApplyFn
  evaluated: ServerEvaluatedFn
  report: ReportFn = _no_report
  bytes_per_step: float = 0.0
  staleness_bound: int | None = None
  """A worker starts iteration c only once every worker has finished c - s
  (None: never blocked)."""


@dataclasses.dataclass(frozen=True)
class Elastic:
  """Local steps, and every `period` of them an exchange with a center (EASGD).

  - init_server(key) -> center;  init(key, worker) -> worker
  - local(worker, batch) -> (worker, metric shares)
  - exchange(center, worker) -> (center, worker), on the worker's arrival
  - evaluated(center, workers) -> (params, model_state);  report(center) -> dict

  An exchange as its messages, for an engine whose worker and center are
  apart (exchange is take of meet; None: the worker runs `exchange` on the
  center it was given and sends the center's new state; `exchange_parts`):

  - meet(worker, center) -> (worker, message): the worker's part, given the
    center as it is, and what it sends the center
  - take(center, message) -> center: the center's part
  """
  init_server: InitServerFn
  init: InitFn
  local: BatchFn
  exchange: MeetFn
  evaluated: ServerEvaluatedFn
  report: ReportFn = _no_report
  bytes_per_step: float = 0.0
  period: int = 1
  meet: ReceiveFn | None = None
  take: ReceiveFn | None = None


@dataclasses.dataclass(frozen=True)
class Gossip:
  """Local steps; after each, with `probability`, a message to a random peer
  (GoSGD). No server.

  - init(key, worker) -> worker
  - local(worker, batch) -> (worker, metric shares)
  - send(worker, peer) -> (worker, message): what the message to worker `peer`
    (an int32) carries is decided here
  - receive(worker, message) -> worker: the peer merges it on arrival
  - evaluated(workers) -> (params, model_state)
  """
  init: InitFn
  local: BatchFn
  send: SendFn
  receive: ReceiveFn
  evaluated: EvaluatedFn
  bytes_per_step: float = 0.0
  probability: float = 0.0


@dataclasses.dataclass(frozen=True)
class Decentralized:
  """Each worker loops: snapshot its model, compute on the snapshot, average
  with a random neighbour atomically, apply its gradient (AD-PSGD). No server.

  - init(key, worker) -> worker
  - pull(worker) -> worker: the snapshot the next gradient is computed on
  - compute(worker, batch) -> (worker, metric shares)
  - average(worker, peer) -> (worker, peer), atomic
  - apply(worker) -> worker: the gradient applied to the worker's own model
  - evaluated(workers) -> (params, model_state)

  An average as its two messages, for an engine whose workers are apart
  (average is accept of answer of offer; None: the worker's whole state
  goes, and the peer runs `average`; `average_parts`):

  - offer(worker, peer) -> (worker, message): the worker's part before, and
    what it sends worker `peer` (an int32)
  - answer(peer, message) -> (peer, reply): the peer's part, and what it sends back
  - accept(worker, reply) -> worker: the worker's part after
  """
  init: InitFn
  pull: WorkerFn
  compute: BatchFn
  average: PairFn
  apply: WorkerFn
  evaluated: EvaluatedFn
  bytes_per_step: float = 0.0
  offer: SendFn | None = None
  answer: ReceiveFn | None = None
  accept: ReceiveFn | None = None


def exchange_parts(algorithm: Elastic) -> tuple[ReceiveFn, ReceiveFn]:
  """(meet, take): the algorithm's own, or `exchange` run by the worker."""
  if algorithm.meet is not None:
    return algorithm.meet, algorithm.take

  def meet(worker, center):
    center, worker = algorithm.exchange(center, worker)
    return worker, center
  return meet, lambda center, message: message


def average_parts(algorithm: Decentralized) -> tuple[SendFn, ReceiveFn, ReceiveFn]:
  """(offer, answer, accept): the algorithm's own, or `average` run by the peer."""
  if algorithm.offer is not None:
    return algorithm.offer, algorithm.answer, algorithm.accept

  def answer(peer, worker):
    worker, peer = algorithm.average(worker, peer)
    return peer, worker
  return lambda worker, peer: (worker, worker), answer, lambda worker, reply: reply


Family = Union[Collective, Centralized, Elastic, Gossip, Decentralized]
FAMILIES = (Collective, Centralized, Elastic, Gossip, Decentralized)
EVENT_FAMILIES = (Centralized, Elastic, Gossip, Decentralized)
# Families with a server whose state the engine keeps (the others keep ()).
SERVER_FAMILIES = (Centralized, Elastic)


def has_server(algorithm: Family) -> bool:
  return isinstance(algorithm, SERVER_FAMILIES)
