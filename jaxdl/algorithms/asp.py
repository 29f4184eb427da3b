"""ASP and SSP: asynchronous parameter-server SGD, without and with a staleness bound.

ASP (Recht et al. 2011; Dean et al. 2012, "Downpour"): each worker loops
pull w -> compute g on it -> push; the server applies every push on arrival,
w <- w - lr * u(g), so a gradient computed on version t lands at t + tau.
SSP (Ho et al. 2013): the same math; a worker may start iteration c only if
the slowest worker has finished c - s iterations (--staleness-bound s). The
bound is scheduling policy: the engine enforces it, the math is ASP's.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdl import sim
from jaxdl.algorithms.base import Algorithm, Problem, server_model
from jaxdl.errors import ConfigError


class ServerState(NamedTuple):
  params: Any
  opt_state: Any
  version: jax.Array  # int32: updates applied


class WorkerState(NamedTuple):
  pulled: Any       # the server parameters this worker last pulled (its staleness buffer entry)
  model_state: Any  # this worker's batch-norm statistics
  grads: Any        # the gradient of its current iteration, once computed


def init_server(problem: Problem, cfg, key, optimizer=None) -> ServerState:
  """The server's parameters and the state of its update rule (`optimizer`,
  the run's optax rule unless given)."""
  del cfg
  params, _ = problem.model.init(key)
  optimizer = optimizer or problem.optimizer
  return ServerState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def init(problem: Problem, cfg, key, worker, num_workers) -> WorkerState:
  del cfg, worker, num_workers
  params, model_state = problem.model.init(key)
  return WorkerState(params, model_state, jax.tree.map(jnp.zeros_like, params))


def compute(problem: Problem, cfg, worker: WorkerState, batch, axis):
  """A worker's gradient on the parameters it pulled -> (worker, metric shares)."""
  del cfg, axis
  grads, model_state, metrics = problem.own_gradients(worker.pulled, worker.model_state, batch)
  return WorkerState(worker.pulled, model_state, grads), metrics


def apply(problem: Problem, cfg, server: ServerState, worker: WorkerState):
  """The server applies a worker's gradient on arrival -> (server, worker)."""
  del cfg
  return update(server, worker.grads, problem.optimizer), worker


def update(server, grads, optimizer: optax.GradientTransformation, **extra_args):
  """One server update with `optimizer` (extra arguments for an ExtraArgs
  chain, e.g. DC-ASGD's w_bak) -> the server, one version on."""
  updates, opt_state = optimizer.update(grads, server.opt_state, server.params, **extra_args)
  return server._replace(params=optax.apply_updates(server.params, updates),
                         opt_state=opt_state, version=server.version + 1)


def pull(problem: Problem, cfg, server: ServerState, worker: WorkerState) -> WorkerState:
  del problem, cfg
  return worker._replace(pulled=server.params)


def check_ssp(cfg) -> None:
  if cfg.algorithm.staleness_bound < 0:
    raise ConfigError("staleness_bound", cfg.algorithm.staleness_bound,
                      "an integer >= 0 (iterations the fastest worker may lead)")


def _ps_bytes(cfg, model_bytes, m):
  return 2.0 * m * model_bytes  # per round of M updates: M pushes and M pulls


CENTRALIZED = dict(init=init, init_server=init_server, compute=compute, apply=apply,
                   pull=pull, evaluated=server_model, bytes_per_step=_ps_bytes,
                   engines=("sim",), shape="centralized")

ASP = Algorithm(name="asp", **CENTRALIZED,
                schedule=lambda cost, iterations, cfg: sim.centralized(cost, iterations))
SSP = Algorithm(name="ssp", check=check_ssp, **CENTRALIZED,
                schedule=lambda cost, iterations, cfg: sim.centralized(
                    cost, iterations, staleness_bound=cfg.algorithm.staleness_bound))
