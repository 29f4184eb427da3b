"""ASP and SSP: asynchronous parameter-server SGD, without and with a staleness bound.

ASP (Recht et al. 2011; Dean et al. 2012, "Downpour"): each worker loops
pull w -> compute g on it -> push; the server applies every push on arrival,
w <- w - lr * u(g), so a gradient computed on version t lands at t + tau.
SSP (Ho et al. 2013): the same math; a worker may start iteration c only if
the slowest worker has finished c - s iterations (--staleness-bound s). The
bound is scheduling policy: the engine enforces it, the math is ASP's.

With --compress, a worker pushes C(g + e) and keeps its residual e (error
feedback, in its `outbox`); the push is the payload (values and indices,
norms and levels, ...), which the server decodes and applies.

With --compress-pull, the server compresses its replies too, with error
feedback of its own (DoubleSqueeze: Tang, Yu, Lian, Zhang, Liu, "Double-
Squeeze: Parallel Stochastic Gradient Descent with Double-pass Error-
Compensated Compression", ICML 2019, where one synchronous server
compresses its averaged update with one residual). An asynchronous server
serves each worker at its own time from its own version, so it keeps a
ledger per worker: h_m, the copy of the parameters worker m holds (`held`).
A pull sends q = C(w - h_m) and sets h_m <- h_m + q; the worker adds the
same q to its own copy (`pulled`, bit for bit h_m) before computing on it.
The residual is e_m = w - h_m: with Delta_m = w_t - w_{t'} the updates
applied since m's last pull at version t', q = C(Delta_m + e_m) and
e_m <- Delta_m + e_m - q, DoubleSqueeze's rule with a residual per worker
(one residual for all would mix what each worker lacks). The ledger is a
worker's state as the server keeps it (checkpointed with it); the worker
never reads it.

Versions read: `compute` reads the parameters the worker pulled (its entry in
the staleness buffer; with --compress-pull, its copy as the reply moved
it); `apply` updates the server as it is when the push arrives.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdl.algorithms import compression
from jaxdl.algorithms.base import AlgorithmSpec, Problem, server_evaluated
from jaxdl.algorithms.families import Centralized
from jaxdl.errors import ConfigError
from jaxdl.optim import LR, MOMENTUM
from jaxdl.settings import Settings, at_least, setting


class ServerState(NamedTuple):
  params: Any
  opt_state: Any
  version: jax.Array  # int32: updates applied


class WorkerState(NamedTuple):
  pulled: Any       # the parameters its gradient is computed on: the server's, as it last
  #                   pulled them (its staleness buffer entry; --compress-pull: its copy)
  model_state: Any  # this worker's batch-norm statistics
  grads: Any        # its push: the gradient's message (with --compress, its payload)
  outbox: Any = optax.EmptyState()  # the compression state of its pushes (--compress)
  reply: Any = ()   # --compress-pull: the server's last reply, q's payload
  held: Any = ()    # --compress-pull: the server's ledger h_m, the copy the worker holds
  inbox: Any = optax.EmptyState()  # --compress-pull: the replies' compression state


def init_server(problem: Problem, key, optimizer: optax.GradientTransformation) -> ServerState:
  """The server's parameters and the state of its update rule."""
  params, _ = problem.init_model(key)
  return ServerState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def init(problem: Problem, key, worker=0) -> WorkerState:
  """Every worker starts from the server's initial parameters (with
  --compress-pull, its copy and the server's ledger both)."""
  params, model_state = problem.init_model(key)
  state = WorkerState(params, model_state, compression.zeros(problem.compress, params),
                      problem.init_outbox(params, worker))
  if not problem.compresses_pull:
    return state
  return state._replace(reply=compression.zeros(problem.compress_pull, params), held=params,
                        inbox=problem.init_inbox(params, worker))


def pull(problem: Problem, server, worker):
  """The server's reply to a worker: its parameters, or with
  --compress-pull q = C(w - h_m) with h_m <- h_m + q (the worker adds q to
  its copy when it computes: `received`)."""
  if not problem.compresses_pull:
    return worker._replace(pulled=server.params)
  key, draw = jax.random.split(jax.random.wrap_key_data(worker.inbox.key))
  reply, held, memory = compression.toward(problem.compress_pull, server.params, worker.held,
                                           draw, worker.inbox.memory)
  return worker._replace(reply=reply, held=held, inbox=worker.inbox._replace(
      memory=memory, key=jax.random.key_data(key)))


def received(problem: Problem, worker):
  """The parameters the worker computes on: what it pulled, or with
  --compress-pull its copy moved by the server's last reply (the bits of
  the server's ledger)."""
  if not problem.compresses_pull:
    return worker.pulled
  return compression.moved(problem.compress_pull, worker.pulled, worker.reply)


def computed_on(problem: Problem, worker):
  """The parameters a worker's pushed gradient was computed on, as the server
  knows them (DC-ASGD's w_bak): what it pulled, or its ledger entry."""
  return worker.held if problem.compresses_pull else worker.pulled


def compute(problem: Problem, worker, batch):
  """A worker's gradient on the parameters it pulled, as it pushes it
  (the payload of C(g + e) with --compress) -> (worker, metric shares)."""
  pulled = received(problem, worker)
  grads, model_state, metrics = problem.own_gradients(pulled, worker.model_state, batch)
  sent, outbox = problem.encode_message(grads, worker.outbox)
  return worker._replace(pulled=pulled, model_state=model_state, grads=sent,
                         outbox=outbox), metrics


def update(server, grads, optimizer: optax.GradientTransformation, **extra_args):
  """One server update with `optimizer` (extra arguments for an ExtraArgs
  chain, e.g. DC-ASGD's w_bak) -> the server, one version on."""
  updates, opt_state = optimizer.update(grads, server.opt_state, server.params, **extra_args)
  return server._replace(params=optax.apply_updates(server.params, updates),
                         opt_state=opt_state, version=server.version + 1)


def ps_bytes(problem: Problem, num_workers: int) -> float:
  """Bytes of one round of M updates: M pushes (compressed with --compress)
  and M pulls (with --compress-pull)."""
  return float(num_workers * (problem.message_bytes() + problem.pull_bytes()))


def parameter_server(problem: Problem, num_workers: int, *,
                     optimizer: optax.GradientTransformation | None = None,
                     staleness_bound: int | None = None) -> Centralized:
  """ASP's handlers with the server's update rule `optimizer` (the run's
  optax rule unless given) and SSP's bound."""
  optimizer = optimizer or problem.optimizer

  def apply(server: ServerState, worker: WorkerState, seconds):
    del seconds
    return update(server, problem.decode_message(worker.grads, server.params), optimizer), worker

  return Centralized(
      init_server=lambda key: init_server(problem, key, optimizer),
      init=lambda key, worker: init(problem, key, worker),
      pull=lambda server, worker, seconds: pull(problem, server, worker),
      compute=lambda worker, batch: compute(problem, worker, batch),
      apply=apply, evaluated=server_evaluated, bytes_per_step=ps_bytes(problem, num_workers),
      staleness_bound=staleness_bound)


STALENESS_RULE = ("unset lr and momentum: lr = 0.05 / sqrt(M), momentum = max(0, 0.9 - (1 - 1/M))"
                  " for M workers")


def staleness_defaults(num_workers: int) -> dict:
  """A parameter server's learning rate and momentum for M asynchronous
  workers, where the user sets neither: the defaults (jaxdl.optim.LR, 0.05,
  and MOMENTUM, 0.9) are tuned for a step of the global batch B = M b, and a
  push is one worker's batch b, applied on parameters M - 1 updates stale.

  - lr x sqrt(b / B) = lr / sqrt(M): the square-root scaling rule for a batch
    M times smaller (Krizhevsky, "One weird trick for parallelizing
    convolutional neural networks", 2014);
  - momentum - (1 - 1/M), at least 0: M asynchronous workers act as an
    implicit momentum of about 1 - 1/M, so the explicit one is lowered to keep
    the total near the tuned value (Mitliagkas, Zhang, Hadjis, Re, "Asynchrony
    begets momentum, with an application to deep learning", Allerton 2016).

  With the defaults' own 0.05 and 0.9 (momentum 0 from M = 10 on), ASP,
  DC-ASGD and LC-ASGD reach >= 0.91 on digits at 4, 8 and 16 workers, where
  lr 0.05 with momentum 0.9 diverged (bench/defaults.py, BENCHMARKS.md).
  """
  return {"lr": LR / math.sqrt(num_workers),
          "momentum": max(0.0, MOMENTUM - (1.0 - 1.0 / num_workers))}


def check_pull(family: type, name: str, compress_pull: str, these: str) -> None:
  """A ConfigError naming --compress-pull unless it is none or algorithms of
  `family` (here `name`) keep a parameter server that workers pull from
  (`these`: the registered algorithms that do, for the message)."""
  if compression.parse_compress(compress_pull, "compress_pull").name != "none" and (
      family is not Centralized):
    raise ConfigError("compress_pull", compress_pull, f"none for {name}: only a parameter "
                      f"server's reply to a pull is compressed ({these})")


def build_asp(settings: Settings, problem: Problem, num_workers: int) -> Centralized:
  del settings
  return parameter_server(problem, num_workers)


@dataclasses.dataclass(frozen=True)
class SSPSettings(Settings):
  staleness_bound: int = setting(3, symbol="s", allowed=at_least(
      0, note="iterations the fastest worker may lead"))
  """SSP's bound s: a worker may start iteration c once the slowest has finished c - s."""


def build_ssp(settings: SSPSettings, problem: Problem, num_workers: int) -> Centralized:
  return parameter_server(problem, num_workers, staleness_bound=settings.staleness_bound)


# A parameter server's defaults, for every algorithm built on it.
STALENESS_DEFAULTS = dict(optim_defaults=staleness_defaults, optim_rule=STALENESS_RULE)
ASP = AlgorithmSpec("asp", "asynchronous parameter server: every push applied on arrival",
                    Centralized, build_asp, **STALENESS_DEFAULTS)
SSP = AlgorithmSpec("ssp", "stale synchronous parallel: asp with --staleness-bound",
                    Centralized, build_ssp, SSPSettings, **STALENESS_DEFAULTS,
                    reduces_to=ASP.name)
