"""Local SGD / periodic model averaging (Stich 2019; Lin et al. 2020).

Each worker takes H = --communication-period local steps with its own
optimizer state on its own mean gradient, x_m <- x_m - lr * u(g_m); after
every H-th step the models (and batch-norm statistics) are averaged, weighted
by b_m / B: x_m <- sum_k (b_k / B) x_k. Optimizer states stay local.
With H = 1 and plain SGD this is AR-SGD.

The average is taken as the last averaged model x_ref, which every worker
holds, plus the mean of the workers' differences from it:
x_m = x_ref <- x_ref + sum_k (b_k / B) (x_k - x_ref). A coordinate that no
worker moved since then stays as it is, bit for bit; sum_k (b_k / B) x_k
would move it by an ulp for about 30% of values at weights 1/3 in float32,
at every averaging.

With --compress, an averaging sends those differences compressed: worker m
sends c_m = C(x_m - x_ref + e_m) and keeps e_m <- x_m - x_ref + e_m - c_m, and
every worker sets x_m = x_ref <- x_ref + sum_k (b_k / B) c_k (Qsparse-local-SGD:
Basu, Data, Karakus, Diggavi, NeurIPS 2019). The messages are all-gathered,
as AR-SGD's (jaxdl.algorithms.ar_sgd); batch-norm statistics are averaged
whole.

Versions read: a local step reads the worker's own model; an averaging reads
every worker's model after the same local step (a barrier).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
from jax import lax

from jaxdl.algorithms import ar_sgd
from jaxdl.algorithms.base import AlgorithmSpec, Problem, mean_over_workers
from jaxdl.algorithms.families import Collective
from jaxdl.settings import Settings, at_least, setting


@dataclasses.dataclass(frozen=True)
class LocalSGDSettings(Settings):
  communication_period: int = setting(4, symbol="tau", allowed=at_least(
      1, note="local steps between averagings"))
  """Local SGD's H: local steps between model averagings."""


class LocalWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  reference: Any  # x_ref, the last averaged model, the same on every worker
  outbox: Any     # the compression state of its model differences (--compress)


def evaluated(states: LocalWorker):
  """The mean of the workers' models (equal to each right after an averaging)."""
  return mean_over_workers(states.params), mean_over_workers(states.model_state)


def build(settings: LocalSGDSettings, problem: Problem, num_workers: int) -> Collective:
  period = settings.communication_period

  def init(key, worker) -> LocalWorker:
    state = problem.init_state(key)
    return LocalWorker(*state, state.params, problem.init_outbox(state.params, worker))

  def average(state: LocalWorker, share, axis) -> LocalWorker:
    difference = jax.tree.map(lambda x, r: x - r, state.params, state.reference)
    sent, outbox = problem.compress_message(difference, state.outbox)
    mean_sent, model_state = axis.psum(jax.tree.map(lambda x: x * share,
                                                    (sent, state.model_state)))
    params = jax.tree.map(lambda r, d: r + d, state.reference, mean_sent)
    return state._replace(params=params, model_state=model_state, reference=params,
                          outbox=outbox)

  def step(state: LocalWorker, batch, step, axis):
    share = batch.weights.sum()  # b_m / B
    grads, model_state, metrics = problem.gradients(state.params, state.model_state,
                                                    batch, axis)
    grads = jax.tree.map(lambda g: g / share, grads)  # this worker's own mean gradient
    state = problem.apply_gradients(state, grads, model_state)
    return lax.cond((step + 1) % period == 0, lambda s: average(s, share, axis),
                    lambda s: s, state), metrics

  return Collective(
      init=init, step=step, evaluated=evaluated,
      bytes_per_step=ar_sgd.allreduce_bytes(problem, num_workers) / period,
      sync="local", period=period)


SPEC = AlgorithmSpec("local_sgd", "local steps, then model averaging every "
                     "--communication-period steps", Collective, build, LocalSGDSettings)
