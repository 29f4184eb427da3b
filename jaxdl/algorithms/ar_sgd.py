"""AR-SGD: synchronous all-reduce SGD (Goyal et al. 2017; IPDPS'21 "AR-SGD").

Every worker holds a replica and its own optimizer state; each step the
workers' gradients are all-reduced (weighted by b_m / B) and every replica
applies the same update:  w <- w - lr * u(sum_m (b_m / B) g_m).
Mathematically one worker with the global batch; differs from BSP in where the
state lives and in traffic (a ring moves 2(M-1)/M of the model per worker).
"""
from __future__ import annotations

import jax

from jaxdl import sim
from jaxdl.algorithms.base import Algorithm, Problem, TrainState, mean_over_workers


def init(problem: Problem, cfg, key, worker, num_workers) -> TrainState:
  del cfg, worker, num_workers  # every replica starts from the same parameters
  return problem.init_state(key)


def step(problem: Problem, cfg, state: TrainState, batch, step, axis):
  del cfg, step
  grads, model_state, metrics = problem.gradients(state.params, state.model_state,
                                                  batch, axis)
  grads = axis.psum(grads)  # the all-reduce
  return problem.apply_gradients(state, grads, model_state), metrics


def evaluated(problem: Problem, cfg, states: TrainState):
  """Worker 0's replica (all are equal) with the workers' mean batch-norm statistics."""
  del problem, cfg
  return jax.tree.map(lambda x: x[0], states.params), mean_over_workers(states.model_state)


def ring_bytes(model_bytes: float, num_workers: int) -> float:
  """Bytes all workers send in one ring all-reduce of the model."""
  return 2.0 * (num_workers - 1) * model_bytes


ALGORITHM = Algorithm(
    name="ar_sgd", init=init, step=step, evaluated=evaluated,
    bytes_per_step=lambda cfg, model_bytes, m: ring_bytes(model_bytes, m),
    engines=("mesh", "sim"),
    schedule=lambda cost, iterations, cfg: sim.synchronous(cost, iterations, "allreduce"))

# Sequential SGD is AR-SGD's update on one worker: the baseline every
# distributed algorithm is compared with.
SGD = Algorithm(
    name="sgd", init=init, step=step, evaluated=evaluated,
    bytes_per_step=lambda cfg, model_bytes, m: 0.0, engines=("mesh", "sim"), max_workers=1,
    schedule=lambda cost, iterations, cfg: sim.synchronous(cost, iterations, "allreduce"))
