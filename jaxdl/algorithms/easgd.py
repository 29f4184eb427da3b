"""EASGD: elastic averaging SGD, asynchronous (Zhang, Choromanska, LeCun 2015).

Worker m keeps its own x_m and takes tau = --communication-period local steps
x_m <- x_m - lr * u(g_m); then it meets the center w:
    d = alpha (x_m - w);  x_m <- x_m - d;  w <- w + d
with alpha = --elasticity (the paper's alpha = lr * rho; unset: 0.9 / M, the
synchronous variant's moving rate beta = M alpha = 0.9). The evaluated model
is the center w (with the workers' mean batch-norm statistics).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxdl import sim
from jaxdl.algorithms.base import Algorithm, Problem, TrainState, server_model
from jaxdl.errors import ConfigError


class Center(NamedTuple):
  params: Any


def elasticity(cfg) -> float:
  alpha = cfg.algorithm.elasticity
  return 0.9 / cfg.algorithm.workers if alpha is None else alpha


def init_server(problem: Problem, cfg, key) -> Center:
  del cfg
  return Center(problem.model.init(key)[0])


def init(problem: Problem, cfg, key, worker, num_workers) -> TrainState:
  del cfg, worker, num_workers  # every worker starts at the center
  return problem.init_state(key)


def local(problem: Problem, cfg, worker: TrainState, batch, axis):
  """One local step on the worker's own parameters."""
  del cfg, axis
  grads, model_state, metrics = problem.own_gradients(worker.params, worker.model_state, batch)
  return problem.apply_gradients(worker, grads, model_state), metrics


def exchange(problem: Problem, cfg, center: Center, worker: TrainState):
  """The elastic update between a worker and the center -> (center, worker)."""
  del problem
  alpha = elasticity(cfg)
  d = jax.tree.map(lambda x, w: alpha * (x - w), worker.params, center.params)
  return (Center(jax.tree.map(lambda w, di: w + di, center.params, d)),
          worker._replace(params=jax.tree.map(lambda x, di: x - di, worker.params, d)))


def check(cfg) -> None:
  if cfg.algorithm.communication_period < 1:
    raise ConfigError("communication_period", cfg.algorithm.communication_period,
                      "an integer >= 1 (local steps between exchanges)")
  alpha = cfg.algorithm.elasticity
  if alpha is not None and not 0 <= alpha <= 1:
    raise ConfigError("elasticity", alpha, "a number in [0, 1]")


ALGORITHM = Algorithm(
    name="easgd", shape="elastic", init=init, init_server=init_server, local=local,
    exchange=exchange, evaluated=server_model, engines=("sim",), check=check,
    # each exchange is a round trip of the model with the center
    bytes_per_step=lambda cfg, b, m: 2.0 * m * b / cfg.algorithm.communication_period,
    schedule=lambda cost, iterations, cfg: sim.elastic(
        cost, iterations, cfg.algorithm.communication_period))
