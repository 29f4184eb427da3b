"""Local SGD / periodic model averaging (Stich 2019; Lin et al. 2020).

Each worker takes H = --communication-period local steps with its own
optimizer state on its own mean gradient, x_m <- x_m - lr * u(g_m); after
every H-th step the models (and batch-norm statistics) are averaged, weighted
by b_m / B: x_m <- sum_k (b_k / B) x_k. Optimizer states stay local.
With H = 1 and plain SGD this is AR-SGD.
"""
from __future__ import annotations

import jax
from jax import lax

from jaxdl import sim
from jaxdl.algorithms import ar_sgd
from jaxdl.algorithms.base import Algorithm, Problem, TrainState, mean_over_workers
from jaxdl.errors import ConfigError


def step(problem: Problem, cfg, state: TrainState, batch, step, axis):
  share = batch.weights.sum()  # b_m / B
  grads, model_state, metrics = problem.gradients(state.params, state.model_state,
                                                  batch, axis)
  grads = jax.tree.map(lambda g: g / share, grads)  # this worker's own mean gradient
  state = problem.apply_gradients(state, grads, model_state)

  def average(state: TrainState) -> TrainState:
    params, model_state = axis.psum(jax.tree.map(
        lambda x: x * share, (state.params, state.model_state)))
    return TrainState(params, model_state, state.opt_state)

  period = cfg.algorithm.communication_period
  return lax.cond((step + 1) % period == 0, average, lambda s: s, state), metrics


def evaluated(problem: Problem, cfg, states: TrainState):
  """The mean of the workers' models (equal to each right after an averaging)."""
  del problem, cfg
  return mean_over_workers(states.params), mean_over_workers(states.model_state)


def check(cfg) -> None:
  if cfg.algorithm.communication_period < 1:
    raise ConfigError("communication_period", cfg.algorithm.communication_period,
                      "an integer >= 1 (local steps between averagings)")


ALGORITHM = Algorithm(
    name="local_sgd", init=ar_sgd.init, step=step, evaluated=evaluated,
    bytes_per_step=lambda cfg, b, m: ar_sgd.ring_bytes(b, m) / cfg.algorithm.communication_period,
    engines=("mesh", "sim"), check=check,
    schedule=lambda cost, iterations, cfg: sim.synchronous(
        cost, iterations, "local", cfg.algorithm.communication_period))
