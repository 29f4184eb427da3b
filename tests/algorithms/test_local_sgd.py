"""Local SGD: local steps, then model averaging every H steps."""
import chex
import jax
import numpy as np
import pytest

from jaxdl.config import RunConfig
from tests.helpers import leaves, make_engine, train

BASE = dict(workers=4, model="mlp", schedule="constant", lr=0.1, momentum=0.0)


@pytest.mark.slow  # by default: test_local_sgd_evaluates_the_mean_model_and_can_sync_batch_norm
def test_local_sgd_with_period_one_and_plain_sgd_is_ar_sgd():
  local = make_engine(RunConfig.make(algorithm="local_sgd", communication_period=1, **BASE))
  ar = make_engine(RunConfig.make(algorithm="ar_sgd", **BASE))
  local_params = local.worker_states(train(local, 10)[0]).params
  ar_params = ar.worker_states(train(ar, 10)[0]).params
  chex.assert_trees_all_close(local_params, ar_params, rtol=1e-5, atol=4e-6)


def test_local_sgd_workers_diverge_between_averagings_and_agree_after():
  config = RunConfig.make(algorithm="local_sgd", workers=4, model="mlp",
                          communication_period=3, schedule="constant")
  engine = make_engine(config)
  state, _ = train(engine, 2)
  w = leaves(engine.worker_states(state).params)[0]
  assert not np.allclose(w[0], w[1])  # two local steps: the replicas differ
  state, _ = train(engine, 3)
  for w in leaves(engine.worker_states(state).params):
    np.testing.assert_allclose(w[0], w[3], rtol=1e-6)  # averaged after step 3


def test_local_sgd_evaluates_the_mean_model_and_can_sync_batch_norm():
  bn = dict(BASE, model="cnn_bn")
  local = make_engine(RunConfig.make(algorithm="local_sgd", sync_bn=True,
                                     communication_period=1, **bn))
  ar = make_engine(RunConfig.make(algorithm="ar_sgd", sync_bn=True, **bn))
  state, _ = train(local, 3)
  params, stats = local.evaluated(state)
  workers = local.worker_states(state)
  chex.assert_trees_all_close(stats, jax.tree.map(lambda x: x.mean(0), workers.model_state),
                              rtol=1e-6)
  # with synchronized statistics and period 1, the all-reduce's model
  ar_params, ar_stats = ar.evaluated(train(ar, 3)[0])
  chex.assert_trees_all_close((params, stats), (ar_params, ar_stats), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algorithm, period", [("local_sgd", {"communication_period": 4}),
                                               ("diloco", {"inner_steps": 4})])
def test_it_communicates_once_every_period(tmp_path, algorithm, period):
  """local_sgd's averaging and DiLoCo's outer step: an all-reduce every 4th step."""
  import jaxdl
  run = dict(workers=4, model="mlp", steps=8, engine="sim", dry_run=True, progress=False,
             compute_time=1e-3)
  local = jaxdl.run(RunConfig.make(algorithm=algorithm, **period,
                                   out=str(tmp_path / "local"), **run))
  ar = jaxdl.run(RunConfig.make(algorithm="ar_sgd", out=str(tmp_path / "ar"), **run))
  assert local["bytes_total"] > 0 and 4 * local["bytes_total"] == ar["bytes_total"]
