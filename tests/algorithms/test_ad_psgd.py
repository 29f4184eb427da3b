"""AD-PSGD on the sim engine: an averaging preserves the workers' mean."""
import chex
import jax
import numpy as np
import optax
import pytest

from jaxdl.algorithms import Problem, ad_psgd
from jaxdl.config import RunConfig
from tests.helpers import leaves, make_setup, train

CONFIG = RunConfig.make(model="mlp", schedule="constant", lr=0.05, batch_size=16, workers=4,
                        momentum=0.0, algorithm="ad_psgd")
PLAIN = Problem(task=None, optimizer=optax.sgd(0.1))  # no compression


def test_ad_psgd_averaging_preserves_the_mean():
  engine = make_setup(CONFIG, total_steps=6).engine
  state, _ = train(engine, 6)
  a, b = (jax.tree.map(lambda x: x[i], state.workers) for i in (1, 2))
  assert not np.allclose(leaves(a.params)[0], leaves(b.params)[0])
  a2, b2 = ad_psgd.average(PLAIN, a, b)
  total = lambda x, y: jax.tree.map(lambda u, v: u + v, x, y)
  chex.assert_trees_all_close(total(a.params, b.params), total(a2.params, b2.params),
                              rtol=1e-5, atol=1e-7)
  chex.assert_trees_all_equal(a2.params, b2.params)


@pytest.mark.slow
def test_batch_norm_statistics_are_averaged_and_kept_with_the_model():
  engine = make_setup(CONFIG.replace(model="cnn_bn"), total_steps=4).engine
  initial = jax.device_get(engine.init(jax.random.key(0)).workers.model_state)
  state, _ = train(engine, 4)
  stats = jax.device_get(state.workers.model_state)
  moved = [not np.allclose(a, b) for a, b in zip(leaves(stats), leaves(initial))]
  assert all(moved)  # each batch updates the running statistics
  a, b = (jax.tree.map(lambda x: x[i], state.workers) for i in (0, 3))
  a2, b2 = ad_psgd.average(PLAIN, a, b)
  mean = jax.tree.map(lambda x, y: (x + y) / 2, a.model_state, b.model_state)
  chex.assert_trees_all_close(a2.model_state, mean, rtol=1e-6)
  chex.assert_trees_all_equal(a2.model_state, b2.model_state)
