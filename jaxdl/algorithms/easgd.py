"""EASGD: elastic averaging SGD, asynchronous (Zhang, Choromanska, LeCun 2015).

Worker m keeps its own x_m and takes tau = --communication-period local steps
x_m <- x_m - lr * u(g_m); then it meets the center w:
    d = alpha (x_m - w);  x_m <- x_m - d;  w <- w + d
with alpha = --elasticity (the paper's alpha = lr * rho; unset: 0.9 / M, the
synchronous variant's moving rate beta = M alpha = 0.9). The evaluated model
is the center w (with the workers' mean batch-norm statistics).

With --compress, the worker's part of an exchange is the elastic
difference d, a model difference: it sends c = C(d + e) to the center and
keeps e <- d + e - c (error feedback, in its `outbox`); the center moves by
c, the worker by its own d. Center + workers + residuals is conserved, as
center + workers is without compression. The center's model, which the
worker reads to compute d, travels whole. As without compression the
exchange is atomic (the worker reads w and the center adds c under one
lock: `meet` on the worker, `take` at the center).

Versions read: `local` reads the worker's own parameters; `exchange` the
worker's parameters as they were when it sent them (it takes no step while
the exchange is in flight) and the center as it is on their arrival.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax

from jaxdl.algorithms.base import AlgorithmSpec, Problem, TrainState, server_evaluated
from jaxdl.algorithms.families import Elastic
from jaxdl.settings import Settings, at_least, between, setting


class Center(NamedTuple):
  params: Any


class ElasticWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  outbox: Any  # the compression state of its elastic differences (--compress)


@dataclasses.dataclass(frozen=True)
class EASGDSettings(Settings):
  communication_period: int = setting(4, symbol="tau", allowed=at_least(
      1, note="local steps between exchanges"))
  """EASGD's tau: local steps between elastic exchanges with the center."""
  elasticity: float | None = setting(None, symbol="alpha", allowed=between(0, 1))
  """EASGD's alpha: the fraction of the worker-center difference exchanged (unset: 0.9 / M)."""


def local(problem: Problem, worker: TrainState | ElasticWorker, batch):
  """One local step on the worker's own parameters -> (worker, metric shares)."""
  grads, model_state, metrics = problem.own_gradients(worker.params, worker.model_state, batch)
  return problem.apply_gradients(worker, grads, model_state), metrics


def meet(problem: Problem, alpha: float, worker: ElasticWorker, center: Center):
  """The worker's part of an exchange with the center as it is -> (worker,
  message): d = alpha (x - w); it moves by d and sends d (with --compress,
  the payload of C(d + e), keeping its residual)."""
  d = jax.tree.map(lambda x, w: alpha * (x - w), worker.params, center.params)
  sent, outbox = problem.encode_message(d, worker.outbox)
  return worker._replace(params=jax.tree.map(lambda x, di: x - di, worker.params, d),
                         outbox=outbox), sent


def take(problem: Problem, center: Center, message) -> Center:
  """The center's part: it adds what the worker sent."""
  return Center(jax.tree.map(lambda w, di: w + di, center.params,
                             problem.decode_message(message, center.params)))


def exchange(problem: Problem, alpha: float, center: Center, worker: ElasticWorker):
  """The elastic update between a worker and the center -> (center, worker);
  what the center adds is compressed with --compress."""
  worker, message = meet(problem, alpha, worker, center)
  return take(problem, center, message), worker


def init(problem: Problem, key, worker) -> ElasticWorker:
  """Every worker starts at the center."""
  state = problem.init_state(key)
  return ElasticWorker(*state, problem.init_outbox(state.params, worker))


def build(settings: EASGDSettings, problem: Problem, num_workers: int) -> Elastic:
  alpha = 0.9 / num_workers if settings.elasticity is None else settings.elasticity
  period = settings.communication_period
  return Elastic(
      init_server=lambda key: Center(problem.init_model(key)[0]),
      init=lambda key, worker: init(problem, key, worker),
      local=lambda worker, batch: local(problem, worker, batch),
      exchange=lambda center, worker: exchange(problem, alpha, center, worker),
      meet=lambda worker, center: meet(problem, alpha, worker, center),
      take=lambda center, message: take(problem, center, message),
      evaluated=server_evaluated,
      # each exchange: the worker's (compressed) difference, the center's model back
      bytes_per_step=(num_workers * (problem.message_bytes() + problem.model_bytes())
                      / period),
      period=period)


SPEC = AlgorithmSpec("easgd", "elastic averaging with a center every --communication-period "
                     "local steps", Elastic, build, EASGDSettings)
