"""Delay and loss compensation as optax transformations."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.algorithms.compensation import delay_compensation, loss_compensation
from jaxdl.algorithms.dc_asgd import DCSettings

RNG = np.random.default_rng(0)
G, W, B = (RNG.normal(size=(3, 4)).astype(np.float32) for _ in range(3))  # grads, w, w_bak


def test_delay_compensation_composes_with_sgd_momentum_by_hand():
  tx = optax.chain(delay_compensation(0.04), optax.sgd(0.1, momentum=0.9))
  state = tx.init(W)
  compensated = G + 0.04 * G * G * (W - B)
  updates, state = tx.update(G, state, W, w_bak=B)
  np.testing.assert_allclose(updates, -0.1 * compensated, rtol=1e-6)
  # second step: the momentum trace holds the first compensated gradient
  updates, _ = tx.update(G, state, W, w_bak=W)  # no staleness: no compensation
  np.testing.assert_allclose(updates, -0.1 * (G + 0.9 * compensated), rtol=1e-6)


@pytest.mark.parametrize("rule", [optax.adam(1e-3), optax.lion(1e-4), optax.adafactor(1e-2)])
def test_delay_compensation_composes_with_any_optax_rule(rule):
  tx = optax.chain(delay_compensation(0.5), rule)
  params = {"w": W, "b": B[0]}
  updates, _ = tx.update({"w": G, "b": G[0]}, tx.init(params), params,
                         w_bak={"w": B, "b": W[0]})
  expected, _ = rule.update({"w": G + 0.5 * G * G * (W - B), "b": G[0] + 0.5 * G[0] ** 2 *
                             (B[0] - W[0])}, rule.init(params), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), updates, expected)


def test_zero_lambda_or_zero_staleness_changes_nothing():
  for tx, bak in [(delay_compensation(0.0), B), (delay_compensation(0.04), W)]:
    updates, _ = tx.update(G, tx.init(W), W, w_bak=bak)
    np.testing.assert_array_equal(updates, G)


def test_adaptive_lambda_follows_its_formula():
  lam0, beta, eps = 2.0, 0.95, 1e-7
  tx = delay_compensation(lam0, adaptive=True, beta=beta, eps=eps)
  state, v = tx.init(W), np.zeros_like(G)
  for g in (G, 2 * G - 1):
    v = beta * v + (1 - beta) * g * g
    updates, state = tx.update(g, state, W, w_bak=B)
    np.testing.assert_allclose(updates, g + lam0 / np.sqrt(v + eps) * g * g * (W - B),
                               rtol=1e-5)
  np.testing.assert_allclose(state.mean_square, v, rtol=1e-6)


def test_compensation_needs_its_extra_arguments():
  with pytest.raises(ValueError) as error:
    delay_compensation().update(G, delay_compensation().init(W), W)
  assert str(error.value) == ("delay_compensation needs the current params and w_bak, the "
                              "parameters the gradient was computed on")
  with pytest.raises(ValueError) as error:
    loss_compensation(0.1).update(G, optax.EmptyState())
  assert str(error.value) == "loss_compensation needs delay_loss_slope, d l_delay / d l_m"


def test_loss_compensation_scales_by_the_rollout_slope():
  tx = optax.chain(loss_compensation(0.1), optax.sgd(1.0))
  updates, _ = tx.update(G, tx.init(W), W, delay_loss_slope=jnp.float32(3.0))
  np.testing.assert_allclose(updates, -(1 + 0.1 * 3.0) * G, rtol=1e-6)
  # stateless, and the updates keep their dtype (bfloat16 parameters)
  alone = loss_compensation(0.1)
  assert alone.init(W) == optax.EmptyState()
  half = alone.update(G.astype(jnp.bfloat16), alone.init(W), delay_loss_slope=jnp.float32(3.0))[0]
  assert half.dtype == jnp.bfloat16


def test_the_transform_defaults_are_dc_asgds_and_constant_lambda_keeps_no_state():
  # delay_compensation() alone is DC-ASGD's default: lambda 0.04, constant
  settings = DCSettings()
  assert (settings.dc_lambda, settings.dc_adaptive, settings.dc_beta) == (0.04, False, 0.95)
  default, explicit = delay_compensation(), delay_compensation(0.04, False, 0.95)
  np.testing.assert_array_equal(default.update(G, default.init(W), W, w_bak=B)[0],
                                explicit.update(G, explicit.init(W), W, w_bak=B)[0])
  assert default.init(W).mean_square is None  # no moving mean square without adaptive
  # the adaptive default beta: a mean square of 0.05 g^2 after one step
  adaptive = delay_compensation(adaptive=True)
  _, state = adaptive.update(G, adaptive.init(W), W, w_bak=B)
  np.testing.assert_allclose(state.mean_square, 0.05 * G * G, rtol=1e-6)
