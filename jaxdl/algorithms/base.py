"""The algorithm contract: pure functions over pytree states, plus declared policy."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdl.algorithms.collectives import WorkerAxis
from jaxdl.models import Model
from jaxdl.models.layers import BatchStats

Metrics = dict[str, jax.Array]


class Batch(NamedTuple):
  """One worker's batch, padded to the largest worker's batch size."""
  images: jax.Array   # B x H x W x C, float32
  labels: jax.Array   # B, int32
  weights: jax.Array  # B, float32: 1/B_global for real examples, 0 for padding

  @property
  def mask(self) -> jax.Array:
    return (self.weights > 0).astype(jnp.float32)


class TrainState(NamedTuple):
  """One model's training state."""
  params: Any
  model_state: Any      # e.g. batch-norm statistics
  opt_state: optax.OptState


@dataclasses.dataclass(frozen=True)
class Problem:
  """What every algorithm trains: a model with an optax update rule.

  Losses are weighted sums: a worker's batch weights sum to its share b_m / B
  of the global batch, so summing gradients over workers gives the gradient of
  the global batch's mean loss (Choi's weighted aggregation), and padded
  examples (weight 0) count for nothing.
  """
  model: Model
  optimizer: optax.GradientTransformation
  sync_bn: bool = False  # batch-norm statistics over all workers' batches
  # Async-BN: a worker's batch-norm state holds its last batch's statistics
  # (momentum 0), which the server averages (jaxdl.algorithms.async_bn).
  async_bn: bool = False

  def model_bytes(self) -> int:
    """Bytes of one copy of the parameters (what a push or a pull moves)."""
    shapes = jax.eval_shape(lambda: self.model.init(jax.random.key(0))[0])
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))

  def init_state(self, key: jax.Array) -> TrainState:
    params, model_state = self.model.init(key)
    return TrainState(params, model_state, self.optimizer.init(params))

  def _loss(self, params, model_state, batch: Batch, axis: WorkerAxis):
    stats = BatchStats(mask=batch.mask, psum=axis.psum if self.sync_bn else None,
                       momentum=0.0 if self.async_bn else None)
    logits_BxK, model_state = self.model.apply(params, model_state, batch.images, True, stats)
    losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxK, batch.labels)
    loss = jnp.sum(losses_B * batch.weights)
    # Only the loss: accuracy comes from evaluation, and an argmax in every
    # step costs small models ~10% (bench/ar_sgd_step.py).
    return loss, (model_state, {"loss": loss})

  def gradients(self, params, model_state, batch: Batch, axis: WorkerAxis):
    """This worker's share of the global gradient -> (grads, model state, metrics).

    Metrics are shares too: their sum over workers is the global batch's mean.
    """
    grad_fn = jax.grad(self._loss, has_aux=True)
    grads, (model_state, metrics) = grad_fn(params, model_state, batch, axis)
    return grads, model_state, metrics

  def own_gradients(self, params, model_state, batch: Batch):
    """A lone worker's mean gradient on its own batch -> (grads, model state,
    metric shares). Asynchronous workers share no collective."""
    grads, model_state, metrics = self.gradients(params, model_state, batch, WorkerAxis(1))
    share = batch.weights.sum()  # b_m / B
    return jax.tree.map(lambda g: g / share, grads), model_state, metrics

  def apply_gradients(self, state: TrainState, grads, model_state) -> TrainState:
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    return TrainState(optax.apply_updates(state.params, updates), model_state, opt_state)

  def evaluate(self, params, model_state, images, labels, mask_B) -> Metrics:
    """Sums over the unmasked examples: loss, correct, count."""
    logits_BxK, _ = self.model.apply(params, model_state, images, False)
    losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxK, labels)
    correct_B = jnp.argmax(logits_BxK, -1) == labels
    return {"loss_sum": jnp.sum(losses_B * mask_B),
            "correct": jnp.sum(correct_B * mask_B),
            "count": jnp.sum(mask_B)}


def mean_over_workers(stacked):
  """The mean of a pytree stacked over workers (leading axis M)."""
  return jax.tree.map(lambda x: jnp.mean(x, axis=0), stacked)


def server_model(problem: Problem, cfg, server, workers):
  """The evaluated model of a server-based algorithm: the server's parameters
  with the workers' mean batch-norm statistics."""
  del problem, cfg
  return server.params, mean_over_workers(workers.model_state)


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """A registry entry: an algorithm's pure functions and its declared policy.

  Every shape:
    init(problem, cfg, key, worker, num_workers) -> one worker's state
    bytes_per_step(cfg, model_bytes, num_workers) -> bytes all workers send
      per step (a step is one iteration of every worker), for the summary
    check(cfg) raises a ConfigError on bad policy values.

  "collective" (bsp, ar_sgd, local_sgd; run by the mesh engine):
    step(problem, cfg, state, batch, step, axis) -> (state, metric shares)
      `step` is the global step; collectives go through `axis`, a WorkerAxis.
    evaluated(problem, cfg, workers) -> (params, model_state) evaluated, from
      the worker states stacked over workers.

  Event shapes (run by the sim engine in a schedule's order, jaxdl.sim.events):
    init_server(problem, cfg, key) -> server state (an empty tuple if none)
    pull(problem, cfg, server, worker) -> worker       ("pull": take a snapshot)
    compute(problem, cfg, worker, batch, axis) -> (worker, metric shares)
        (the gradient of the snapshot; batched over workers by the engine)
    apply(problem, cfg, server, worker) -> (server, worker)   ("apply")
    local(problem, cfg, worker, batch, axis) -> (worker, metric shares)
        ("local": a step on the worker's own parameters; batched)
    exchange(problem, cfg, server, worker) -> (server, worker)  ("exchange")
    pair(problem, cfg, worker, peer) -> (worker, peer)  ("gossip", "average")
    evaluated(problem, cfg, server, workers) -> (params, model_state)
  """
  name: str
  init: Callable[..., Any]
  evaluated: Callable[..., tuple[Any, Any]]
  bytes_per_step: Callable[[Any, int, int], float]
  engines: tuple[str, ...]
  shape: str = "collective"
  step: Callable[..., tuple[Any, Metrics]] | None = None
  init_server: Callable[..., Any] | None = None
  pull: Callable[..., Any] | None = None
  compute: Callable[..., tuple[Any, Metrics]] | None = None
  apply: Callable[..., Any] | None = None
  local: Callable[..., tuple[Any, Metrics]] | None = None
  exchange: Callable[..., Any] | None = None
  pair: Callable[..., Any] | None = None
  # Timed: pull and apply also take the event's `duration` (a float32
  # scalar: a pull's transfer seconds, an apply's compute seconds) as a last
  # argument, for algorithms whose math uses the cluster's timing (LC-ASGD).
  timed: bool = False
  # report(problem, cfg, server) -> {name: scalar} for summary.json (e.g.
  # LC-ASGD's predictor errors).
  report: Callable[..., dict] | None = None
  max_workers: int | None = None
  check: Callable[[Any], None] = lambda cfg: None  # raises ConfigError on bad policy
  # The declared policy as a timing schedule: (cost model, iterations per
  # worker, cfg) -> jaxdl.sim.Schedule, for the sim engine and --dry-run.
  schedule: Callable[..., Any] | None = None
