"""Local SGD / periodic model averaging (Stich 2019; Lin et al. 2020).

Each worker takes H = --communication-period local steps with its own
optimizer state on its own mean gradient, x_m <- x_m - lr * u(g_m); after
every H-th step the models (and batch-norm statistics) are averaged, weighted
by b_m / B: x_m <- sum_k (b_k / B) x_k. Optimizer states stay local.
With H = 1 and plain SGD this is AR-SGD.

Versions read: a local step reads the worker's own model; an averaging reads
every worker's model after the same local step (a barrier).
"""
from __future__ import annotations

import dataclasses

import jax
from jax import lax

from jaxdl.algorithms import ar_sgd
from jaxdl.algorithms.base import AlgorithmSpec, Problem, TrainState, mean_over_workers
from jaxdl.algorithms.shapes import Collective
from jaxdl.settings import Settings, require, setting


@dataclasses.dataclass(frozen=True)
class LocalSGDSettings(Settings):
  communication_period: int = setting(4, symbol="tau")
  """Local SGD's H: local steps between model averagings."""

  def validate(self) -> None:
    require("communication_period", self.communication_period, self.communication_period >= 1,
            "an integer >= 1 (local steps between averagings)")


def evaluated(states: TrainState):
  """The mean of the workers' models (equal to each right after an averaging)."""
  return mean_over_workers(states.params), mean_over_workers(states.model_state)


def build(settings: LocalSGDSettings, problem: Problem, num_workers: int) -> Collective:
  period = settings.communication_period

  def step(state: TrainState, batch, step, axis):
    share = batch.weights.sum()  # b_m / B
    grads, model_state, metrics = problem.gradients(state.params, state.model_state,
                                                    batch, axis)
    grads = jax.tree.map(lambda g: g / share, grads)  # this worker's own mean gradient
    state = problem.apply_gradients(state, grads, model_state)

    def average(state: TrainState) -> TrainState:
      params, model_state = axis.psum(jax.tree.map(
          lambda x: x * share, (state.params, state.model_state)))
      return TrainState(params, model_state, state.opt_state)

    return lax.cond((step + 1) % period == 0, average, lambda s: s, state), metrics

  return Collective(
      init=lambda key, worker: ar_sgd.init(problem, key), step=step, evaluated=evaluated,
      bytes_per_step=ar_sgd.ring_bytes(problem.model_bytes(), num_workers) / period,
      sync="local", period=period)


SPEC = AlgorithmSpec("local_sgd", "local steps, then model averaging every "
                     "--communication-period steps", Collective, build, LocalSGDSettings)
