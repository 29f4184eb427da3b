"""Delay compensation as optax transformations: DC-ASGD's and LC-ASGD's terms.

Both sit in front of any optax update rule and read what the server knows
about the gradient's delay as extra arguments of `update`:

  tx = optax.chain(delay_compensation(0.04), optax.sgd(0.1, momentum=0.9))
  updates, state = tx.update(grads, state, params, w_bak=pulled_params)

  tx = optax.chain(loss_compensation(0.01), optax.adam(1e-3))
  updates, state = tx.update(grads, state, params, delay_loss_slope=slope)

`optax.chain` hands the extra arguments to every transformation that takes
them; the ones after these ignore them.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class DelayCompensationState(NamedTuple):
  mean_square: Any  # v: the moving mean of g * g (adaptive lambda); None if constant


def delay_compensation(lam: float = 0.04, adaptive: bool = False, beta: float = 0.95,
                       eps: float = 1e-7) -> optax.GradientTransformationExtraArgs:
  """DC-ASGD's first-order Taylor compensation of a stale gradient.

  Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay
  Compensation", ICML 2017. A gradient g computed on the parameters w_bak a
  worker pulled, applied to the server's current w, is compensated as

    g + lambda * g * g * (w - w_bak)           (elementwise products)

  DC-ASGD-c: a constant lambda (`lam`, 0.04 by default). DC-ASGD-a
  (`adaptive=True`): lambda_t = lam / sqrt(v_t + eps) elementwise, with
  v_t = beta * v_{t-1} + (1 - beta) * g * g (the paper uses lam = lambda0 = 2
  and beta = 0.95 on CIFAR-10).

  Args:
    lam: lambda (constant), or lambda0 (adaptive).
    adaptive: scale lambda by the moving root mean square of the gradient.
    beta: decay of the moving mean square (adaptive only).
    eps: added to v under the square root (adaptive only).

  Returns:
    A transformation whose `update(updates, state, params, *, w_bak)` needs
    the current parameters `params` and the pulled parameters `w_bak`.
  """
  def init_fn(params):
    return DelayCompensationState(
        jax.tree.map(jnp.zeros_like, params) if adaptive else None)

  def update_fn(updates, state, params=None, *, w_bak=None, **extra_args):
    del extra_args
    if params is None or w_bak is None:
      raise ValueError("delay_compensation needs the current params and w_bak, "
                       "the parameters the gradient was computed on")
    mean_square = state.mean_square
    if adaptive:
      mean_square = jax.tree.map(lambda v, g: beta * v + (1 - beta) * g * g,
                                 mean_square, updates)
      lams = jax.tree.map(lambda v: lam * jax.lax.rsqrt(v + eps), mean_square)
    else:
      lams = jax.tree.map(lambda g: lam, updates)
    updates = jax.tree.map(lambda g, l, w, b: g + l * g * g * (w - b),
                           updates, lams, params, w_bak)
    return updates, DelayCompensationState(mean_square)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def loss_compensation(lam: float) -> optax.GradientTransformationExtraArgs:
  """LC-ASGD's loss compensation, as the gradient of l_m + lam * l_delay.

  Li, He, Ren, Mao, "LC-ASGD: Loss-Prediction Compensated ASGD", ICPP 2020.
  The server predicts the losses of the k updates that land before a
  worker's gradient (l_delay, their sum) and the worker descends on
  l_m + lam * l_delay. The paper leaves open how l_delay depends on the
  parameters; jaxdl takes the predicted losses as a differentiable function
  of the worker's own loss l_m (the loss predictor's rollout from l_m), so by
  the chain rule

    grad(l_m + lam * l_delay) = (1 + lam * d l_delay / d l_m) * grad(l_m)

  and the rollout's slope `delay_loss_slope` = d l_delay / d l_m (a scalar,
  from `jaxdl.algorithms.predictors.LossPredictor.compensation`) is the
  extra argument. Another reading is another transformation in its place.

  Args:
    lam: lambda, the weight of the predicted delay loss.

  Returns:
    A stateless transformation whose `update` needs `delay_loss_slope`.
  """
  def update_fn(updates, state, params=None, *, delay_loss_slope=None, **extra_args):
    del params, extra_args
    if delay_loss_slope is None:
      raise ValueError("loss_compensation needs delay_loss_slope, d l_delay / d l_m")
    factor = 1 + lam * delay_loss_slope
    return jax.tree.map(lambda g: (factor * g).astype(g.dtype), updates), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update_fn)
