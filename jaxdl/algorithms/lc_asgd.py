"""LC-ASGD: loss-prediction compensated ASGD (Li, He, Ren, Mao, ICPP 2020).

ASP whose server, on receiving worker m's report (its loss l_m, t_comm, t_comp):
  1. predicts k_m, the updates that land between m's pull and its gradient
     (the step predictor), before it observes the true delay, then learns it;
  2. learns the loss sequence (latest loss -> l_m) and rolls the loss
     predictor out k_m steps from l_m: l_delay is the sum of the predictions;
  3. applies the gradient of l_m + lambda * l_delay (the loss-compensation
     transformation, chained before the run's optax rule).
In the simulation a worker's report and its gradient travel together (one
compute event), so the delay predicted is the gradient's staleness.
Asynchronous batch norm is `--async-bn` (jaxdl.algorithms.async_bn), for this
and the other algorithms with a server. Every piece is swappable: `make(pieces)`
builds the algorithm from other predictors or another compensation.

With --compress, the pushed gradient is compressed as asp's is
(jaxdl.algorithms.asp), the loss reported beside it whole; with
--compress-pull, the server's replies as asp's are.

Versions read: `compute` reads what the worker pulled; `apply` the server's
predictors and parameters as they are on arrival. Settings: --lc-lambda
(lambda), --lc-max-delay (the longest rollout). The summary
adds the predictors' errors: lc_delay_mae (|predicted - actual delay|, mean
over updates), lc_delay_predicted_mean, lc_delay_actual_mean, lc_loss_mae
(|predicted next loss - received loss|).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdl.algorithms import asp
from jaxdl.algorithms.base import AlgorithmSpec, Problem
from jaxdl.algorithms.compensation import loss_compensation
from jaxdl.algorithms.predictors import LossPredictor, StepPredictor
from jaxdl.algorithms.families import Centralized
from jaxdl.settings import Settings, at_least, setting


@dataclasses.dataclass(frozen=True)
class LCSettings(Settings):
  lc_lambda: float = setting(0.01, allowed=at_least(0))
  """LC-ASGD's lambda: workers descend on loss + lambda * l_delay, the predicted losses of the updates landing before their gradient."""
  lc_max_delay: int | None = setting(None, allowed=at_least(1))
  """LC-ASGD: the longest delay the loss predictor rolls out (unset: 2 M)."""


class Pieces(NamedTuple):
  """LC-ASGD's swappable parts (see jaxdl.algorithms.predictors for the methods)."""
  steps: Any         # StepPredictor-like
  losses: Any        # LossPredictor-like
  compensation: optax.GradientTransformationExtraArgs  # takes delay_loss_slope


def default_pieces(settings: LCSettings, num_workers: int) -> Pieces:
  return Pieces(StepPredictor(),
                LossPredictor(max_delay=settings.lc_max_delay or 2 * num_workers),
                loss_compensation(settings.lc_lambda))


class ServerState(NamedTuple):
  params: Any
  opt_state: Any
  version: jax.Array    # int32: updates applied
  steps: Any            # the step predictor's state
  losses: Any           # the loss predictor's state
  next_loss: jax.Array  # the loss predicted for the next report
  errors: jax.Array     # (6,) sums: |k - delay|, k, delay, updates, |loss error|, losses


class WorkerState(NamedTuple):
  pulled: Any
  model_state: Any
  grads: Any
  loss: jax.Array     # the mean loss of its current batch (its report)
  version: jax.Array  # int32: the server version it pulled
  t_comm: jax.Array   # seconds its last pull took
  index: jax.Array    # int32: which worker
  outbox: Any = optax.EmptyState()  # the compression state of its pushes (--compress)
  reply: Any = ()     # --compress-pull: the server's last reply (jaxdl.algorithms.asp)
  held: Any = ()      # --compress-pull: the server's ledger, the copy the worker holds
  inbox: Any = optax.EmptyState()  # --compress-pull: the replies' compression state


class Prediction(NamedTuple):
  k: jax.Array          # the delay predicted for the report, before its true one is known
  slope: jax.Array      # the loss compensation's delay_loss_slope, rolled out over k
  steps: Any            # the step predictor's state, having learned the true delay
  losses: Any           # the loss predictor's state, having learned the reported loss
  next_loss: jax.Array  # the loss it predicts for the next report


def predict(p: Pieces, steps, losses, index, t_comm, t_comp, delay, loss) -> Prediction:
  """The server's predictions on worker `index`'s report (steps 1 and 2 above):
  what `apply` computes before the compensated gradient, and all of it."""
  k = p.steps.predict(steps, index, t_comm, t_comp)
  steps = p.steps.update(steps, index, t_comm, t_comp, delay)
  losses = p.losses.update(losses, loss)
  _, slope = p.losses.compensation(losses, loss, k)
  return Prediction(k, slope, steps, losses, p.losses.predict_next(losses, loss))


def build(settings: LCSettings, problem: Problem, num_workers: int,
          pieces: Callable[[LCSettings, int], Pieces] = default_pieces) -> Centralized:
  """LC-ASGD with its predictors and compensation from `pieces(settings, num_workers)`."""
  p = pieces(settings, num_workers)
  optimizer = optax.chain(p.compensation, problem.optimizer)

  def init_server(key) -> ServerState:
    server = asp.init_server(problem, key, optimizer)
    return ServerState(*server, p.steps.init(num_workers), p.losses.init(),
                       jnp.zeros((), jnp.float32), jnp.zeros((6,), jnp.float32))

  def init(key, worker) -> WorkerState:
    state = asp.init(problem, key, worker)
    return WorkerState(*state[:3], jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32),
                       jnp.zeros((), jnp.float32), jnp.asarray(worker, jnp.int32), *state[3:])

  def compute(worker: WorkerState, batch):
    worker, metrics = asp.compute(problem, worker, batch)
    return worker._replace(loss=metrics["loss"] / batch.weights.sum()), metrics  # its mean

  def pull(server: ServerState, worker: WorkerState, t_comm):
    return asp.pull(problem, server, worker)._replace(version=server.version, t_comm=t_comm)

  def apply(server: ServerState, worker: WorkerState, t_comp):
    delay = (server.version - worker.version).astype(jnp.float32)
    seen = (server.losses.seen > 0).astype(jnp.float32)
    loss_error = seen * jnp.abs(server.next_loss - worker.loss)
    pred = predict(p, server.steps, server.losses, worker.index, worker.t_comm, t_comp,
                   delay, worker.loss)
    errors = server.errors + jnp.stack([jnp.abs(pred.k - delay), pred.k, delay, 1.0,
                                        loss_error, seen])
    grads = problem.decode_message(worker.grads, server.params)
    server = asp.update(server, grads, optimizer, delay_loss_slope=pred.slope)
    return server._replace(steps=pred.steps, losses=pred.losses, errors=errors,
                           next_loss=pred.next_loss), worker

  def report(server: ServerState) -> dict:
    e = server.errors
    n = jnp.maximum(e[3], 1)
    return {"lc_delay_mae": e[0] / n, "lc_delay_predicted_mean": e[1] / n,
            "lc_delay_actual_mean": e[2] / n, "lc_loss_mae": e[4] / jnp.maximum(e[5], 1)}

  ps = asp.parameter_server(problem, num_workers)  # its optimizer's handlers replaced below
  return dataclasses.replace(ps, init_server=init_server, init=init, compute=compute,
                             pull=pull, apply=apply, report=report)


def make(pieces: Callable[[LCSettings, int], Pieces] = default_pieces
         ) -> Callable[[LCSettings, Problem, int], Centralized]:
  """LC-ASGD's factory from other predictors or another compensation:
  `pieces(settings, num_workers)` gives them."""
  return functools.partial(build, pieces=pieces)


SPEC = AlgorithmSpec("lc_asgd", "asp with loss-prediction compensation (--lc-lambda), "
                     "step and loss predictors", Centralized, build, LCSettings,
                     **asp.STALENESS_DEFAULTS)
