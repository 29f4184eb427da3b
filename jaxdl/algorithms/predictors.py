"""LC-ASGD's online predictors, pure and jittable: the step and loss predictors.

Both are linear models trained online by recursive least squares (RLS), so
each prediction uses only what the server has seen so far and one update is
a few small matrix products (the paper reports ~1.3 ms per predictor per
iteration for its neural predictors).

  StepPredictor: a worker's delay k_m, the number of server updates that land
    between its pull and its gradient, from (its last delay, t_comm, t_comp).
  LossPredictor: the next received loss from the latest one, rolled out k
    steps from a worker's loss l_m; l_delay is the sum of the k predictions.

Each is a small class of pure functions over a NamedTuple state; LC-ASGD takes
any object with the same methods (`jaxdl.algorithms.lc_asgd.make`).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp


ROLLOUT_UNROLL = 16  # rollout steps a loop trip


class Regression(NamedTuple):
  """Recursive least squares: y ~ theta . x, with P the inverse Gram matrix."""
  theta: jax.Array  # (n,)
  cov: jax.Array    # (n, n)

  @staticmethod
  def create(n: int, prior: float = 1e3) -> Regression:
    return Regression(jnp.zeros((n,), jnp.float32), prior * jnp.eye(n, dtype=jnp.float32))

  def predict(self, x: jax.Array) -> jax.Array:
    return self.theta @ x

  def update(self, x: jax.Array, y: jax.Array, forget: float = 1.0) -> Regression:
    """One observation (x, y), with exponential forgetting of old ones (1: none)."""
    px = self.cov @ x
    gain = px / (forget + x @ px)
    theta = self.theta + gain * (y - self.theta @ x)
    cov = (self.cov - jnp.outer(gain, px)) / forget
    return Regression(theta, 0.5 * (cov + cov.T))


class StepState(NamedTuple):
  model: Regression
  last_delay: jax.Array  # (M,): each worker's last observed delay
  time_scale: jax.Array  # (2,): the first observed t_comm and t_comp (0 before)


@dataclasses.dataclass(frozen=True)
class StepPredictor:
  """Predicts a worker's delay from (its last delay, t_comm, t_comp).

  Features (1, last delay, t_comm, t_comp), the times in units of the first
  ones observed, so the fit does not depend on the scale of the cluster.
  """
  forget: float = 0.999

  def init(self, num_workers: int) -> StepState:
    return StepState(Regression.create(4), jnp.zeros((num_workers,), jnp.float32),
                     jnp.zeros((2,), jnp.float32))

  def _scaled(self, state: StepState, t_comm, t_comp):
    """(features, the time scale): the first times observed set the scale."""
    times = jnp.stack([t_comm, t_comp]).astype(jnp.float32)
    scale = jnp.where(state.time_scale > 0, state.time_scale, times)
    relative = times / jnp.where(scale > 0, scale, 1)
    return relative, scale

  def _features(self, state: StepState, worker, relative) -> jax.Array:
    return jnp.concatenate([jnp.ones((1,), jnp.float32), state.last_delay[worker][None],
                            relative])

  def predict(self, state: StepState, worker, t_comm, t_comp) -> jax.Array:
    """The predicted delay (float, >= 0) of `worker`'s current gradient."""
    relative, _ = self._scaled(state, t_comm, t_comp)
    return jnp.maximum(state.model.predict(self._features(state, worker, relative)), 0.0)

  def update(self, state: StepState, worker, t_comm, t_comp, delay) -> StepState:
    """Learns the observed delay of `worker`'s gradient."""
    relative, scale = self._scaled(state, t_comm, t_comp)
    delay = jnp.asarray(delay, jnp.float32)
    model = state.model.update(self._features(state, worker, relative), delay, self.forget)
    return StepState(model, state.last_delay.at[worker].set(delay), scale)


class LossState(NamedTuple):
  model: Regression
  latest: jax.Array  # the latest received loss
  seen: jax.Array    # int32: losses received


@dataclasses.dataclass(frozen=True)
class LossPredictor:
  """Predicts the next received loss from the latest: l' = a * l + b.

  Linear in the loss, so a loss decaying exponentially towards c
  (l' = r * l + (1 - r) * c) is learned exactly. The rollout from l_m gives
  l_1 ... l_k and l_delay = l_1 + ... + l_k.
  """
  max_delay: int = 32  # the longest rollout (static: it sets the scan length)
  forget: float = 0.999

  def init(self) -> LossState:
    return LossState(Regression.create(2), jnp.zeros((), jnp.float32),
                     jnp.zeros((), jnp.int32))

  def predict_next(self, state: LossState, loss) -> jax.Array:
    return state.model.predict(jnp.stack([jnp.float32(1), jnp.asarray(loss, jnp.float32)]))

  def update(self, state: LossState, loss) -> LossState:
    """Learns (latest loss -> this loss), then makes this loss the latest."""
    loss = jnp.asarray(loss, jnp.float32)
    x = jnp.stack([jnp.float32(1), state.latest])
    model = jax.tree.map(lambda new, old: jnp.where(state.seen > 0, new, old),
                         state.model.update(x, loss, self.forget), state.model)
    return LossState(model, loss, state.seen + 1)

  def rollout(self, state: LossState, loss, k) -> jax.Array:
    """The predicted sum of the next `k` losses (k rounded, at most max_delay:
    the scan runs max_delay steps)."""
    steps = jnp.round(k)

    def next_loss(current, i):
      predicted = self.predict_next(state, current)
      return predicted, jnp.where(i < steps, predicted, 0.0)
    # Unrolled (up to 16 steps a trip): a loop's trip costs more than its
    # few scalar operations on the CPU; the same operations, the same bits.
    _, predictions = jax.lax.scan(next_loss, jnp.asarray(loss, jnp.float32),
                                  jnp.arange(self.max_delay),
                                  unroll=min(self.max_delay, ROLLOUT_UNROLL))
    return jnp.sum(predictions)

  def compensation(self, state: LossState, loss, k) -> tuple[jax.Array, jax.Array]:
    """(l_delay, d l_delay / d l_m): the k-step rollout from `loss` and its slope."""
    return jax.value_and_grad(self.rollout, argnums=1)(state, jnp.asarray(loss, jnp.float32), k)
