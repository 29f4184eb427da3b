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

  def init_state(self, key: jax.Array) -> TrainState:
    params, model_state = self.model.init(key)
    return TrainState(params, model_state, self.optimizer.init(params))

  def _loss(self, params, model_state, batch: Batch, axis: WorkerAxis):
    stats = BatchStats(mask=batch.mask, psum=axis.psum if self.sync_bn else None)
    logits_BxK, model_state = self.model.apply(params, model_state, batch.images, True, stats)
    losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxK, batch.labels)
    correct_B = (jnp.argmax(logits_BxK, -1) == batch.labels).astype(jnp.float32)
    loss = jnp.sum(losses_B * batch.weights)
    return loss, (model_state, {"loss": loss, "accuracy": jnp.sum(correct_B * batch.weights)})

  def gradients(self, params, model_state, batch: Batch, axis: WorkerAxis):
    """This worker's share of the global gradient -> (grads, model state, metrics).

    Metrics are shares too: their sum over workers is the global batch's mean.
    """
    grad_fn = jax.grad(self._loss, has_aux=True)
    grads, (model_state, metrics) = grad_fn(params, model_state, batch, axis)
    return grads, model_state, metrics

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


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """A registry entry: an algorithm's pure functions and its declared policy.

  Collective shape (run by the mesh engine, and the sim engine later):
    init(problem, cfg, key, worker, num_workers) -> one worker's state
    step(problem, cfg, state, batch, step, axis) -> (state, metric shares)
      `step` is the global step (the same on every worker); collectives go
      through `axis`, a WorkerAxis.
    evaluated(problem, cfg, states) -> (params, model_state) evaluated, from
      the states stacked over workers.
    bytes_per_step(cfg, model_bytes, num_workers) -> bytes all workers send
      in one step, for the summary and the cost model.
  """
  name: str
  init: Callable[..., Any]
  step: Callable[..., tuple[Any, Metrics]]
  evaluated: Callable[..., tuple[Any, Any]]
  bytes_per_step: Callable[[Any, int, int], float]
  engines: tuple[str, ...]
  max_workers: int | None = None
  check: Callable[[Any], None] = lambda cfg: None  # raises ConfigError on bad policy
