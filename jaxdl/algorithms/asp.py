"""ASP and SSP: asynchronous parameter-server SGD, without and with a staleness bound.

ASP (Recht et al. 2011; Dean et al. 2012, "Downpour"): each worker loops
pull w -> compute g on it -> push; the server applies every push on arrival,
w <- w - lr * u(g), so a gradient computed on version t lands at t + tau.
SSP (Ho et al. 2013): the same math; a worker may start iteration c only if
the slowest worker has finished c - s iterations (--staleness-bound s). The
bound is scheduling policy: the engine enforces it, the math is ASP's.

With --compress, a worker pushes C(g + e) and keeps its residual e (error
feedback, in its `outbox`, which travels with its state); the server applies
the push as it is. The pull stays whole: the server's parameters.

Versions read: `compute` reads the parameters the worker pulled (its entry in
the staleness buffer); `apply` updates the server as it is when the push
arrives.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdl.algorithms.base import AlgorithmSpec, Problem, server_evaluated
from jaxdl.algorithms.shapes import Centralized
from jaxdl.settings import Settings, require, setting


class ServerState(NamedTuple):
  params: Any
  opt_state: Any
  version: jax.Array  # int32: updates applied


class WorkerState(NamedTuple):
  pulled: Any       # the server parameters this worker last pulled (its staleness buffer entry)
  model_state: Any  # this worker's batch-norm statistics
  grads: Any        # the gradient of its current iteration, once computed (what it pushes)
  outbox: Any = optax.EmptyState()  # the compression state of its pushes (--compress)


def init_server(problem: Problem, key, optimizer: optax.GradientTransformation) -> ServerState:
  """The server's parameters and the state of its update rule."""
  params, _ = problem.init_model(key)
  return ServerState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def init(problem: Problem, key, worker=0) -> WorkerState:
  params, model_state = problem.init_model(key)
  return WorkerState(params, model_state, jax.tree.map(jnp.zeros_like, params),
                     problem.init_outbox(params, worker))


def compute(problem: Problem, worker: WorkerState, batch):
  """A worker's gradient on the parameters it pulled, as it pushes it
  (compressed with --compress) -> (worker, metric shares)."""
  grads, model_state, metrics = problem.own_gradients(worker.pulled, worker.model_state, batch)
  sent, outbox = problem.compress_message(grads, worker.outbox)
  return WorkerState(worker.pulled, model_state, sent, outbox), metrics


def update(server, grads, optimizer: optax.GradientTransformation, **extra_args):
  """One server update with `optimizer` (extra arguments for an ExtraArgs
  chain, e.g. DC-ASGD's w_bak) -> the server, one version on."""
  updates, opt_state = optimizer.update(grads, server.opt_state, server.params, **extra_args)
  return server._replace(params=optax.apply_updates(server.params, updates),
                         opt_state=opt_state, version=server.version + 1)


def ps_bytes(problem: Problem, num_workers: int) -> float:
  """Bytes of one round of M updates: M pushes (compressed with --compress) and M pulls."""
  return float(num_workers * (problem.message_bytes() + problem.model_bytes()))


def parameter_server(problem: Problem, num_workers: int, *,
                     optimizer: optax.GradientTransformation | None = None,
                     staleness_bound: int | None = None) -> Centralized:
  """ASP's handlers with the server's update rule `optimizer` (the run's
  optax rule unless given) and SSP's bound."""
  optimizer = optimizer or problem.optimizer

  def apply(server: ServerState, worker: WorkerState, seconds):
    del seconds
    return update(server, worker.grads, optimizer), worker

  def pull(server: ServerState, worker: WorkerState, seconds) -> WorkerState:
    del seconds
    return worker._replace(pulled=server.params)

  return Centralized(
      init_server=lambda key: init_server(problem, key, optimizer),
      init=lambda key, worker: init(problem, key, worker),
      pull=pull, compute=lambda worker, batch: compute(problem, worker, batch),
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
  from jaxdl.optim import LR, MOMENTUM
  return {"lr": LR / math.sqrt(num_workers),
          "momentum": max(0.0, MOMENTUM - (1.0 - 1.0 / num_workers))}


def build_asp(settings: Settings, problem: Problem, num_workers: int) -> Centralized:
  del settings
  return parameter_server(problem, num_workers)


@dataclasses.dataclass(frozen=True)
class SSPSettings(Settings):
  staleness_bound: int = setting(3, symbol="s")
  """SSP's bound s: a worker may start iteration c once the slowest has finished c - s."""

  def validate(self) -> None:
    require("staleness_bound", self.staleness_bound, self.staleness_bound >= 0,
            "an integer >= 0 (iterations the fastest worker may lead)")


def build_ssp(settings: SSPSettings, problem: Problem, num_workers: int) -> Centralized:
  return parameter_server(problem, num_workers, staleness_bound=settings.staleness_bound)


# A parameter server's defaults, for every algorithm built on it.
STALENESS_DEFAULTS = dict(optim_defaults=staleness_defaults, optim_rule=STALENESS_RULE)
ASP = AlgorithmSpec("asp", "asynchronous parameter server: every push applied on arrival",
                    Centralized, build_asp, **STALENESS_DEFAULTS)
SSP = AlgorithmSpec("ssp", "stale synchronous parallel: asp with --staleness-bound",
                    Centralized, build_ssp, SSPSettings, **STALENESS_DEFAULTS)
