"""LC-ASGD's online predictors."""
import jax
import numpy as np

from jaxdl.algorithms.predictors import LossPredictor, StepPredictor


def test_loss_predictor_learns_an_exponential_decay():
  predictor, c, r = LossPredictor(max_delay=8), 0.3, 0.9
  losses = c + 2.0 * r ** np.arange(40, dtype=np.float32)
  state = predictor.init()
  for loss in losses[:30]:
    state = jax.jit(predictor.update)(state, loss)
  # the next 5 losses from loss 29, and their sum (l_delay)
  got = [float(predictor.predict_next(state, losses[29]))]
  np.testing.assert_allclose(got[0], losses[30], rtol=1e-3)
  l_delay, slope = predictor.compensation(state, losses[29], 5.0)
  np.testing.assert_allclose(l_delay, losses[30:35].sum(), rtol=1e-3)
  np.testing.assert_allclose(slope, sum(r ** i for i in range(1, 6)), rtol=1e-3)
  assert float(predictor.compensation(state, losses[29], 0.0)[0]) == 0.0  # no delay, no loss
  # a delay past max_delay rolls out max_delay steps
  np.testing.assert_array_equal(predictor.compensation(state, losses[29], 20.0),
                                predictor.compensation(state, losses[29], 8.0))


def test_a_time_first_observed_as_zero_leaves_the_prediction_finite():
  """A zero time (no communication, say) sets no scale: it stays 0, not 0/0."""
  predictor = StepPredictor()
  state = predictor.update(predictor.init(2), 0, 0.0, 2.0, 3.0)
  assert list(state.time_scale) == [0.0, 2.0]
  assert np.isfinite(float(predictor.predict(state, 1, 0.0, 1.0)))
  assert np.all(np.isfinite(np.asarray(state.model.theta)))


def test_step_predictor_learns_delays_linear_in_compute_time():
  rng = np.random.default_rng(0)
  predictor, m = StepPredictor(), 4
  state, errors = predictor.init(m), []
  update, predict = jax.jit(predictor.update), jax.jit(predictor.predict)
  for i in range(300):
    w = i % m
    t_comm, t_comp = 0.01, float(rng.uniform(0.5, 1.5))
    delay = 1.0 + 4.0 * t_comp  # depends linearly on t_comp
    errors.append(abs(float(predict(state, w, t_comm, t_comp)) - delay))
    state = update(state, w, t_comm, t_comp, delay)
  assert np.mean(errors[-100:]) < 0.01, np.mean(errors[-100:])
  assert np.mean(errors[:4]) > 1.0  # it did have to learn


def _step_predictions(unit: float) -> list[float]:
  """Predictions of delays linear in compute time, with times in `unit` seconds."""
  rng = np.random.default_rng(1)
  predictor, m = StepPredictor(), 3
  state, out = predictor.init(m), []
  update, predict = jax.jit(predictor.update), jax.jit(predictor.predict)
  for i in range(60):
    w, t_comp = i % m, float(rng.uniform(0.5, 1.5))
    t_comm, delay = 0.2 + 0.1 * (i % 2), 1.0 + 4.0 * t_comp
    out.append(float(predict(state, w, t_comm * unit, t_comp * unit)))
    state = update(state, w, t_comm * unit, t_comp * unit, delay)
  return out


def test_step_predictor_does_not_depend_on_the_unit_of_time():
  # times in units of the first ones observed: milliseconds or kiloseconds, the same fit
  base = _step_predictions(1.0)
  for unit in (1e-3, 1e3):
    np.testing.assert_allclose(_step_predictions(unit), base, rtol=2e-3, atol=2e-3)


def test_one_step_predictor_update_by_hand_with_forgetting():
  """Recursive least squares from P = 1000 I: the first observation's
  features are (1, last delay 0, 1, 1) (times in units of themselves), so
  P x = 1000 x, x.P x = 3000, gain = P x / (f + 3000), theta = gain * y and
  P' = (P - gain (P x)^T) / f."""
  f, y = 0.9, 5.0
  state = StepPredictor(forget=f).update(StepPredictor().init(2), 1, 0.3, 2.0, y)
  x = np.array([1.0, 0.0, 1.0, 1.0])
  gain = 1000 * x / (f + 3000)
  np.testing.assert_allclose(state.model.theta, gain * y, rtol=1e-5)
  np.testing.assert_allclose(state.model.cov, (1000 * np.eye(4) - np.outer(gain, 1000 * x)) / f,
                             rtol=1e-4, atol=1e-3)
  assert float(state.last_delay[1]) == y and list(state.time_scale) == [0.3, 2.0]


def test_two_loss_predictor_updates_by_hand_with_forgetting():
  """The first loss only becomes the latest; the second is learned from it:
  x = (1, l1), P x = 1000 x, gain = P x / (f + x.P x), theta = gain * l2,
  P' = (P - gain (P x)^T) / f."""
  f, l1, l2 = 0.9, 2.0, 1.5
  predictor = LossPredictor(forget=f)
  state = predictor.update(predictor.init(), l1)
  assert int(state.seen) == 1 and float(state.latest) == l1
  np.testing.assert_array_equal(state.model.theta, np.zeros(2))  # nothing learned yet
  state = predictor.update(state, l2)
  x = np.array([1.0, l1])
  gain = 1000 * x / (f + 1000 * x @ x)
  np.testing.assert_allclose(state.model.theta, gain * l2, rtol=1e-5)
  np.testing.assert_allclose(state.model.cov, (1000 * np.eye(2) - np.outer(gain, 1000 * x)) / f,
                             rtol=1e-4, atol=1e-3)


def test_regression_forgets_nothing_unless_told():
  from jaxdl.algorithms.predictors import Regression
  x, y = np.array([1.0, 2.0], np.float32), np.float32(3.0)
  default, explicit = Regression.create(2).update(x, y), Regression.create(2).update(x, y, 1.0)
  np.testing.assert_array_equal(default.theta, explicit.theta)
  np.testing.assert_array_equal(default.cov, explicit.cov)
