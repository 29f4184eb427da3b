"""Sequential SGD on one worker: the baseline every distributed algorithm is held to.

w_{t+1} = w_t - lr * u(g_t), with u any optax update rule.
"""
from __future__ import annotations

from jaxdl.algorithms.base import Algorithm, Batch, Problem, TrainState


def init(problem: Problem, key, num_workers: int = 1) -> TrainState:
  del num_workers  # always one
  return problem.init_state(key)


def step(problem: Problem, state: TrainState, batch: Batch):
  grads, model_state, metrics = problem.gradients(state.params, state.model_state, batch)
  return problem.apply_gradients(state, grads, model_state), metrics


def evaluated(state: TrainState):
  return state.params, state.model_state


ALGORITHM = Algorithm(name="sgd", init=init, step=step, evaluated=evaluated,
                      engines=("local",), max_workers=1)
