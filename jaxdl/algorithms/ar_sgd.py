"""AR-SGD: synchronous all-reduce SGD (Goyal et al. 2017; IPDPS'21 "AR-SGD").

Every worker holds a replica and its own optimizer state; each step the
workers' gradients are all-reduced (weighted by b_m / B) and every replica
applies the same update:  w <- w - lr * u(sum_m (b_m / B) g_m).
Mathematically one worker with the global batch; differs from BSP in where the
state lives and in traffic (a ring moves 2(M-1)/M of the model per worker).

Versions read: every worker's gradient of step t reads its replica after step
t - 1, the same on every worker (the all-reduce is a barrier).
"""
from __future__ import annotations

import jax

from jaxdl.algorithms.base import AlgorithmSpec, Problem, TrainState, mean_over_workers
from jaxdl.algorithms.shapes import Collective


def init(problem: Problem, key) -> TrainState:
  """Every replica starts from the same parameters."""
  return problem.init_state(key)


def step(problem: Problem, state: TrainState, batch, step, axis):
  del step
  grads, model_state, metrics = problem.gradients(state.params, state.model_state,
                                                  batch, axis)
  grads = axis.psum(grads)  # the all-reduce
  return problem.apply_gradients(state, grads, model_state), metrics


def evaluated(states: TrainState):
  """Worker 0's replica (all are equal) with the workers' mean batch-norm statistics."""
  return jax.tree.map(lambda x: x[0], states.params), mean_over_workers(states.model_state)


def ring_bytes(model_bytes: float, num_workers: int) -> float:
  """Bytes all workers send in one ring all-reduce of the model."""
  return 2.0 * (num_workers - 1) * model_bytes


def build(settings, problem: Problem, num_workers: int) -> Collective:
  del settings
  return Collective(init=lambda key, worker: init(problem, key),
                    step=lambda state, batch, t, axis: step(problem, state, batch, t, axis),
                    evaluated=evaluated,
                    bytes_per_step=ring_bytes(problem.model_bytes(), num_workers))


SPEC = AlgorithmSpec("ar_sgd", "synchronous all-reduce SGD, a replica per worker",
                     Collective, build)
# Sequential SGD is AR-SGD's update on one worker: the baseline every
# distributed algorithm is compared with.
SGD = AlgorithmSpec("sgd", "sequential SGD on one worker (any optax update rule)",
                    Collective, build, max_workers=1)
