"""LC-ASGD: ASP with loss-prediction compensation."""
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
