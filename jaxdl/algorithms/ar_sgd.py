"""AR-SGD: synchronous all-reduce SGD (Goyal et al. 2017; IPDPS'21 "AR-SGD").

Every worker holds a replica and its own optimizer state; each step the
workers' gradients are all-reduced (weighted by b_m / B) and every replica
applies the same update:  w <- w - lr * u(sum_m (b_m / B) g_m).
Mathematically one worker with the global batch; differs from BSP in where the
state lives and in traffic (a ring moves 2(M-1)/M of the model per worker).

With --compress, each worker sends C(g_m + e_m) of its own share of the
gradient and keeps its own residual e_m (error feedback, in its `outbox`);
the sum of what the workers sent is applied. A compressed message does not
add up on the way as a ring all-reduce's chunks do (top-k's supports differ
between workers), so the workers all-gather their messages: each sends its
message to the M - 1 others, M (M - 1) messages a step.

Versions read: every worker's gradient of step t reads its replica after step
t - 1, the same on every worker (the all-reduce is a barrier).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxdl.algorithms.base import AlgorithmSpec, Problem, mean_over_workers
from jaxdl.algorithms.families import Collective


class Replica(NamedTuple):
  """A worker's replica, its optimizer state and its outbox."""
  params: Any
  model_state: Any
  opt_state: Any
  outbox: Any  # the compression state of its gradients (--compress): residual, memory, key


def init(problem: Problem, key, worker=0) -> Replica:
  """Every replica starts from the same parameters."""
  state = problem.init_state(key)
  return Replica(*state, problem.init_outbox(state.params, worker))


def step(problem: Problem, state: Replica, batch, step, axis):
  del step
  grads, model_state, metrics = problem.gradients(state.params, state.model_state,
                                                  batch, axis)
  sent, outbox = problem.compress_message(grads, state.outbox)  # the identity without --compress
  grads = axis.psum(sent)  # the all-reduce
  return problem.apply_gradients(state._replace(outbox=outbox), grads, model_state), metrics


def evaluated(states: Replica):
  """Worker 0's replica (all are equal) with the workers' mean batch-norm statistics."""
  return jax.tree.map(lambda x: x[0], states.params), mean_over_workers(states.model_state)


def ring_bytes(model_bytes: float, num_workers: int) -> float:
  """Bytes all workers send in one ring all-reduce of the model."""
  return 2.0 * (num_workers - 1) * model_bytes


def allreduce_bytes(problem: Problem, num_workers: int) -> float:
  """Bytes all workers send in one all-reduce of a model-shaped message: a
  ring all-reduce, or with --compress an all-gather of the compressed
  messages (M (M - 1) of them)."""
  if problem.compresses:
    return float(num_workers * (num_workers - 1) * problem.message_bytes())
  return ring_bytes(problem.model_bytes(), num_workers)


def build(settings, problem: Problem, num_workers: int) -> Collective:
  del settings
  return Collective(init=lambda key, worker: init(problem, key, worker),
                    step=lambda state, batch, t, axis: step(problem, state, batch, t, axis),
                    evaluated=evaluated,
                    bytes_per_step=allreduce_bytes(problem, num_workers))


SPEC = AlgorithmSpec("ar_sgd", "synchronous all-reduce SGD, a replica per worker",
                     Collective, build)
# Sequential SGD is AR-SGD's update on one worker: the baseline every
# distributed algorithm is compared with.
SGD = AlgorithmSpec("sgd", "sequential SGD on one worker (any optax update rule)",
                    Collective, build, max_workers=1)
