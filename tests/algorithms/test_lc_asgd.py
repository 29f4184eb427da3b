"""LC-ASGD: ASP with loss-prediction compensation."""
import pytest
import jaxdl
from jaxdl.config import RunConfig

RUN = dict(model="mlp", epochs=1, workers=4, batch_size=8, progress=False,
           schedule="constant", momentum=0.0, lr=0.1, jitter=0.3)


def test_zero_lambda_is_asp_and_the_predictors_learn(tmp_path):
  asp = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "asp"), **RUN))
  off = jaxdl.run(RunConfig.make(algorithm="lc_asgd", out=str(tmp_path / "off"),
                                 lc_lambda=0.0, **RUN))
  assert off["params_fingerprint"] == asp["params_fingerprint"]
  on = jaxdl.run(RunConfig.make(algorithm="lc_asgd", out=str(tmp_path / "on"), **RUN))
  assert on["params_fingerprint"] != asp["params_fingerprint"]
  # the predictors' errors are in the summary; delays are learned
  assert 0 <= on["lc_delay_mae"] < 0.5 * on["lc_delay_actual_mean"], on
  assert 0 < on["lc_loss_mae"] < 1.0


def test_the_loss_rollout_is_capped_at_twice_the_workers_unless_set():
  from jaxdl.algorithms.lc_asgd import LCSettings, default_pieces
  assert default_pieces(LCSettings(), 4).losses.max_delay == 8
  assert default_pieces(LCSettings(lc_max_delay=3), 4).losses.max_delay == 3


@pytest.mark.slow
def test_workers_keep_their_batch_norm_statistics():
  import jax
  import numpy as np
  from tests.helpers import leaves, make_setup, train
  config = RunConfig.make(algorithm="lc_asgd", model="cnn_bn", workers=3, batch_size=8,
                          schedule="constant", lr=0.05, momentum=0.0, jitter=0.3)
  engine = make_setup(config, total_steps=3).engine
  initial = leaves(engine.init(jax.random.key(0)).workers.model_state)
  state, _ = train(engine, 3)
  assert all(not np.allclose(a, b) for a, b in
             zip(leaves(state.workers.model_state), initial))


def test_the_report_divides_the_error_sums_by_their_counts():
  """errors = sums of |k - delay|, k, delay, updates, |loss error|, losses seen."""
  import jax
  import jax.numpy as jnp
  import optax
  from jaxdl import algorithms
  from jaxdl.algorithms import ALGORITHMS, Problem
  from jaxdl.models import build_model
  from jaxdl.task import classification
  problem = Problem(classification(build_model("mlp", 10, (8, 8, 1))), optax.sgd(0.1))
  lc = algorithms.build(ALGORITHMS.get("lc_asgd"), RunConfig.make(algorithm="lc_asgd").settings(),
                        problem, 2)
  server = lc.init_server(jax.random.key(0))
  for errors, expected in (([0.5, 2.0, 3.0, 1.0, 0.0, 0.0], [0.5, 2.0, 3.0, 0.0]),
                           ([1.0, 4.0, 6.0, 2.0, 0.3, 1.0], [0.5, 2.0, 3.0, 0.3])):
    report = lc.report(server._replace(errors=jnp.asarray(errors, jnp.float32)))
    got = [float(report[k]) for k in ("lc_delay_mae", "lc_delay_predicted_mean",
                                      "lc_delay_actual_mean", "lc_loss_mae")]
    assert got == pytest.approx(expected)
