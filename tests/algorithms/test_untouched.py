"""What no worker moved stays as it was, bit for bit, through every average:
DiLoCo's outer steps, local SGD's averagings, GoSGD's merges, AD-PSGD's
averages, and the evaluated model (a mean over workers)."""
import jax
import numpy as np
import pytest

from jaxdl.algorithms.base import mean_over_workers
from jaxdl.config import RunConfig
from tests.helpers import frozen_layer_engine, frozen_part


@pytest.mark.parametrize("num_workers", [3, 5, 6, 7])
def test_a_mean_over_workers_of_equal_values_is_that_value(num_workers):
  """Equally and by weights; elsewhere it is the mean. (jnp.mean of equal
  float32 values was another value for 20% to 56% of these, by M.)"""
  rng = np.random.default_rng(num_workers)
  x = rng.standard_normal(4096).astype(np.float32)
  agree = rng.random(4096) < 0.5
  stacked = np.where(agree, x, rng.standard_normal((num_workers, 4096))).astype(np.float32)
  weights = rng.random(num_workers).astype(np.float32)
  weights /= weights.sum()
  for w in (None, weights):
    mean = np.asarray(mean_over_workers({"x": stacked}, w)["x"])
    np.testing.assert_array_equal(mean[agree], x[agree])
    expected = np.average(stacked.astype(np.float64), axis=0, weights=w)
    np.testing.assert_allclose(mean, expected, rtol=1e-6, atol=1e-6)


SIM = dict(engine="sim", compute_time=1e-3)
RUNS = {
    "diloco_sim": dict(algorithm="diloco", inner_steps=2, outer_optimizer="adam", **SIM),
    "diloco_mesh": dict(algorithm="diloco", inner_steps=2, outer_optimizer="adam",
                        engine="mesh"),
    # each worker its own program, their sums on the host (as on the ray engine)
    "diloco_mesh_split": dict(algorithm="diloco", inner_steps=2, outer_optimizer="adam",
                              engine="mesh", compute_time=1e-3),
    "local_sgd_sim": dict(algorithm="local_sgd", communication_period=2, **SIM),
    "gosgd_sim": dict(algorithm="gosgd", gossip_probability=0.5, **SIM),
    "ad_psgd_sim": dict(algorithm="ad_psgd", **SIM),
}


def worker_models(engine, state):
  """Every worker's model (DiLoCo's inner one), stacked over workers."""
  if hasattr(engine, "worker_states"):  # the mesh engine's states are in rows
    workers = engine.worker_states(state)
  else:
    workers = getattr(state, "workers", state)
  return workers.inner.params if hasattr(workers, "inner") else workers.params


@pytest.mark.parametrize("name", list(RUNS))
def test_a_frozen_layer_stays_as_it_was(name):
  """3 workers train the mlp with its first layer frozen (its updates are
  zeros) for 8 steps: the evaluated model's copy of that layer and every
  worker's hold its initial bits, and the head trained."""
  config = RunConfig.make(workers=3, model="mlp", steps=8, **RUNS[name])
  engine = frozen_layer_engine(config)
  initial = engine.problem.task.init(jax.random.key(0))[0]  # where every worker starts
  state = engine.init(jax.random.key(0))
  for t in range(8):
    state, _ = engine.step(state, t)
  params = engine.evaluated(state)[0]
  np.testing.assert_array_equal(frozen_part(params), frozen_part(initial))
  assert (frozen_part(params, "['head']") != frozen_part(initial, "['head']")).any()
  models = worker_models(engine, state)
  for m in range(3):
    np.testing.assert_array_equal(frozen_part(jax.tree.map(lambda x: x[m], models)),
                                  frozen_part(initial))
