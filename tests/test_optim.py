"""Optimizers by name, schedules and weight decay."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.config import OptimConfig
from jaxdl.errors import ConfigError
from jaxdl.optim import OPTIMIZERS, make_optimizer, make_schedule
from tests import marks


# sgd, adam(w), nadam(w), the layer-wise lamb and lars, and lion by default
@pytest.mark.parametrize("name", marks.default_first(OPTIMIZERS.names(), keep=8))
def test_every_optimizer_descends_a_quadratic(name):
  cfg = OptimConfig(optimizer=name, lr=0.01, schedule="constant")
  tx = make_optimizer(cfg, total_steps=200, steps_per_epoch=10)
  params = {"w": jnp.full((3,), 2.0), "b": jnp.array(-1.0)}
  loss = lambda p: jnp.sum((p["w"] - 1.0) ** 2) + (p["b"] - 0.5) ** 2
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  start = loss(params)
  for _ in range(200):
    params, state = step(params, state)
  chex.assert_tree_all_finite(params)
  assert loss(params) < start, name  # lars and adadelta move slowly at this lr


def test_plain_sgd_is_exactly_minus_lr_times_gradient():
  tx = make_optimizer(OptimConfig(lr=0.1, momentum=0.0, schedule="constant"), 10, 10)
  g = {"w": jnp.array([1.0, -2.0])}
  updates, _ = tx.update(g, tx.init(g), g)
  chex.assert_trees_all_equal(updates, {"w": -0.1 * g["w"]})


def test_weight_decay_is_added_to_the_gradient_for_sgd():
  tx = make_optimizer(OptimConfig(lr=0.1, momentum=0.0, weight_decay=0.01,
                                  schedule="constant"), 10, 10)
  w = {"w": jnp.array([3.0])}
  updates, _ = tx.update({"w": jnp.zeros(1)}, tx.init(w), w)
  chex.assert_trees_all_close(updates, {"w": np.array([-0.1 * 0.01 * 3.0])}, rtol=1e-6)


def test_schedules():
  cosine = make_schedule(OptimConfig(lr=1.0, schedule="cosine"), 100, 10)
  assert cosine(0) == 1.0 and abs(cosine(100)) < 1e-6 and 0.49 < cosine(50) < 0.51
  assert make_schedule(OptimConfig(lr=0.3, schedule="constant"), 100, 10) == 0.3
  warm = make_schedule(OptimConfig(lr=1.0, schedule="constant", warmup_steps=10), 100, 10)
  assert warm(0) == 0.0 and abs(warm(5) - 0.5) < 1e-6 and warm(10) == 1.0 and warm(99) == 1.0
  step = make_schedule(OptimConfig(lr=1.0, schedule="step", lr_milestones=(2.0, 5.0),
                                   lr_decay=0.1), 100, 10)
  np.testing.assert_allclose([step(19), step(20), step(49), step(50)],
                             [1.0, 0.1, 0.1, 0.01], rtol=1e-6)
  linear = make_schedule(OptimConfig(lr=1.0, schedule="linear"), 100, 10)
  assert abs(linear(50) - 0.5) < 1e-6


def test_a_server_schedule_follows_steps_not_pushes():
  # A parameter server updates M = 4 times a step: its count 200 is step 50.
  cfg = OptimConfig(lr=1.0, schedule="step", lr_milestones=(2.0,), lr_decay=0.1)
  server = make_schedule(cfg, 100, 10, updates_per_step=4)
  np.testing.assert_allclose([server(79), server(80)], [1.0, 0.1], rtol=1e-6)
  cosine = OptimConfig(lr=1.0, schedule="cosine", warmup_steps=10)
  per_step = make_schedule(cosine, 100, 10)
  np.testing.assert_allclose(make_schedule(cosine, 100, 10, updates_per_step=4)(200),
                             per_step(50), rtol=1e-6)
  assert make_schedule(OptimConfig(lr=0.3, schedule="constant"), 100, 10, 4) == 0.3


def test_opt_args_reach_the_optimizer():
  tx = make_optimizer(OptimConfig(optimizer="adam", opt_args='{"b1": 0.0, "b2": 0.0}',
                                  lr=1.0, schedule="constant"), 10, 10)
  g = {"w": jnp.array([4.0, -0.5])}
  updates, _ = tx.update(g, tx.init(g), g)
  # with b1 = b2 = 0 adam's step is -lr * g / (|g| + eps) = -sign(g)
  chex.assert_trees_all_close(updates, {"w": np.array([-1.0, 1.0])}, rtol=1e-6)


def test_nesterov_only_for_sgd():
  with pytest.raises(ConfigError, match="--nesterov"):
    make_optimizer(OptimConfig(optimizer="adam", nesterov=True), 10, 10)
