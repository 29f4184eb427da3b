"""The algorithm contract: pure functions over pytree states, plus declared policy."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxdl.models import Model

Metrics = dict[str, jax.Array]


class Batch(NamedTuple):
  images: jax.Array  # B x H x W x C, float32
  labels: jax.Array  # B, int32


class TrainState(NamedTuple):
  """One model's training state."""
  step: jax.Array       # int32 scalar: updates applied
  params: Any
  model_state: Any      # e.g. batch-norm statistics
  opt_state: optax.OptState


@dataclasses.dataclass(frozen=True)
class Problem:
  """What every algorithm trains: a model, with an optax update rule."""
  model: Model
  optimizer: optax.GradientTransformation

  def init_state(self, key: jax.Array) -> TrainState:
    params, model_state = self.model.init(key)
    return TrainState(jnp.zeros((), jnp.int32), params, model_state,
                      self.optimizer.init(params))

  def loss(self, params, model_state, batch: Batch):
    """Mean cross-entropy on `batch` -> (loss, (new model state, metrics))."""
    logits_BxK, model_state = self.model.apply(params, model_state, batch.images, True)
    losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxK, batch.labels)
    accuracy = jnp.mean(jnp.argmax(logits_BxK, -1) == batch.labels)
    loss = jnp.mean(losses_B)
    return loss, (model_state, {"loss": loss, "accuracy": accuracy})

  def gradients(self, params, model_state, batch: Batch):
    """-> (gradients, new model state, metrics)."""
    grad_fn = jax.grad(self.loss, has_aux=True)
    grads, (model_state, metrics) = grad_fn(params, model_state, batch)
    return grads, model_state, metrics

  def apply_gradients(self, state: TrainState, grads, model_state) -> TrainState:
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    return TrainState(state.step + 1, optax.apply_updates(state.params, updates),
                      model_state, opt_state)

  def evaluate(self, params, model_state, batch: Batch, mask_B: jax.Array) -> Metrics:
    """Sums over the unmasked examples of `batch`: loss, correct, count."""
    logits_BxK, _ = self.model.apply(params, model_state, batch.images, False)
    losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxK, batch.labels)
    correct_B = jnp.argmax(logits_BxK, -1) == batch.labels
    return {"loss_sum": jnp.sum(losses_B * mask_B),
            "correct": jnp.sum(correct_B * mask_B),
            "count": jnp.sum(mask_B)}


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """A registry entry: the pure functions of an algorithm and its policy.

  init(problem, key, num_workers) -> state
  step(problem, state, batch) -> (state, metrics)
  evaluated(state) -> (params, model_state) of the model that is evaluated
  """
  name: str
  init: Callable[..., Any]
  step: Callable[..., tuple[Any, Metrics]]
  evaluated: Callable[[Any], tuple[Any, Any]]
  engines: tuple[str, ...]
  max_workers: int | None = None
