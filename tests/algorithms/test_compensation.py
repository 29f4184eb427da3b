"""Delay compensation (DC-ASGD, LC-ASGD), their predictors and Async-BN."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxdl
from jaxdl.algorithms import ALGORITHMS, Problem, async_bn
from jaxdl.algorithms.asp import WorkerState
from jaxdl.algorithms.compensation import delay_compensation, loss_compensation
from jaxdl.algorithms.predictors import LossPredictor, StepPredictor
from jaxdl.config import RunConfig
from jaxdl.errors import ConfigError
from jaxdl.models import build_model
from jaxdl.models.layers import BatchNorm, BatchStats

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
  with pytest.raises(ValueError, match="w_bak"):
    delay_compensation().update(G, delay_compensation().init(W), W)
  with pytest.raises(ValueError, match="delay_loss_slope"):
    loss_compensation(0.1).update(G, optax.EmptyState())


def test_loss_compensation_scales_by_the_rollout_slope():
  tx = optax.chain(loss_compensation(0.1), optax.sgd(1.0))
  updates, _ = tx.update(G, tx.init(W), W, delay_loss_slope=jnp.float32(3.0))
  np.testing.assert_allclose(updates, -(1 + 0.1 * 3.0) * G, rtol=1e-6)


def _problem(model="mlp"):
  return Problem(build_model(model, 10, (8, 8, 1)), optax.sgd(0.1))


def test_one_dc_asgd_server_update_by_hand():
  config = RunConfig.make(algorithm="dc_asgd", workers=2, dc_lambda=0.3)
  algorithm, problem = ALGORITHMS.get("dc_asgd"), _problem()
  server = algorithm.init_server(problem, config, jax.random.key(0))
  grads = jax.tree.map(lambda p: jnp.asarray(RNG.normal(size=p.shape), jnp.float32),
                       server.params)
  pulled = jax.tree.map(lambda p: p + 0.1, server.params)
  worker = WorkerState(pulled, {}, grads)
  new, _ = jax.jit(lambda s, w: algorithm.apply(problem, config, s, w))(server, worker)
  expected = jax.tree.map(lambda w, g, b: w - 0.1 * (g + 0.3 * g * g * (w - b)),
                          *jax.device_get((server.params, grads, pulled)))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               jax.device_get(new.params), expected)
  assert int(new.version) == 1


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


def test_step_predictor_learns_delays_linear_in_compute_time():
  predictor, m = StepPredictor(), 4
  state, errors = predictor.init(m), []
  update, predict = jax.jit(predictor.update), jax.jit(predictor.predict)
  for i in range(300):
    w = i % m
    t_comm, t_comp = 0.01, float(RNG.uniform(0.5, 1.5))
    delay = 1.0 + 4.0 * t_comp  # depends linearly on t_comp
    errors.append(abs(float(predict(state, w, t_comm, t_comp)) - delay))
    state = update(state, w, t_comm, t_comp, delay)
  assert np.mean(errors[-100:]) < 0.01, np.mean(errors[-100:])
  assert np.mean(errors[:4]) > 1.0  # it did have to learn


RUN = dict(model="mlp", epochs=1, workers=4, batch_size=8, progress=False,
           schedule="constant", momentum=0.0, lr=0.1, jitter=0.3)


@pytest.mark.parametrize("name,zero", [("dc_asgd", dict(dc_lambda=0.0)),
                                       ("lc_asgd", dict(lc_lambda=0.0))])
def test_zero_lambda_or_one_worker_is_asp(tmp_path, name, zero):
  asp = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "asp"), **RUN))
  off = jaxdl.run(RunConfig.make(algorithm=name, out=str(tmp_path / "off"), **zero, **RUN))
  assert off["params_fingerprint"] == asp["params_fingerprint"]
  on = jaxdl.run(RunConfig.make(algorithm=name, out=str(tmp_path / "on"), **RUN))
  assert on["params_fingerprint"] != asp["params_fingerprint"]
  if name == "dc_asgd":  # one worker: zero staleness, nothing to compensate
    one = dict(RUN, workers=1)
    a = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "a1"), **one))
    d = jaxdl.run(RunConfig.make(algorithm=name, out=str(tmp_path / "d1"), **one))
    assert a["params_fingerprint"] == d["params_fingerprint"]
  else:  # the predictors' errors are in the summary; delays are learned
    assert 0 <= on["lc_delay_mae"] < 0.5 * on["lc_delay_actual_mean"], on
    assert 0 < on["lc_loss_mae"] < 1.0


def test_batch_norm_reports_the_batch_statistics_with_momentum_zero():
  bn = BatchNorm(3, rngs=nnx.Rngs(0))
  x = jnp.asarray(RNG.normal(size=(16, 3)), jnp.float32)
  bn(x, True, BatchStats(momentum=0.0))
  np.testing.assert_allclose(bn.mean[...], x.mean(0), rtol=1e-6)
  np.testing.assert_allclose(bn.var[...], x.var(0), rtol=1e-4)


def test_async_bn_keeps_the_moving_average_of_reports():
  config = RunConfig.make(algorithm="asp", workers=2, async_bn=True, bn_decay=0.25)
  algorithm = async_bn.wrap(ALGORITHMS.get("asp"))
  problem = _problem("cnn_bn")
  server = algorithm.init_server(problem, config, jax.random.key(0))
  params, model_state = problem.model.init(jax.random.key(0))
  expected = jax.device_get(server.stats)
  assert all(np.all((x == 0) | (x == 1)) for x in jax.tree.leaves(expected))  # E 0, Var 1
  apply = jax.jit(lambda s, w: algorithm.apply(problem, config, s, w))
  for i in range(3):
    report = jax.tree.map(lambda x: jnp.asarray(RNG.uniform(size=x.shape), jnp.float32),
                          model_state)
    grads = jax.tree.map(jnp.zeros_like, params)
    server, _ = apply(server, WorkerState(params, report, grads))
    expected = jax.tree.map(lambda e, r: 0.75 * e + 0.25 * r, expected, jax.device_get(report))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
               jax.device_get(server.stats), expected)
  assert int(server.inner.version) == 3
  # and the server's statistics are the evaluated ones
  workers = jax.tree.map(lambda x: x[None], WorkerState(params, model_state, grads))
  _, evaluated = algorithm.evaluated(problem, config, server, workers)
  assert evaluated is server.stats


def test_async_bn_runs_and_changes_what_is_evaluated(tmp_path):
  run = dict(RUN, model="cnn_bn", epochs=3, batch_size=16, lr=0.3)
  plain = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "p"), **run))
  abn = jaxdl.run(RunConfig.make(algorithm="asp", async_bn=True, out=str(tmp_path / "a"),
                                 **run))
  # the same training, evaluated with other statistics, which work as well
  assert abn["params_fingerprint"] == plain["params_fingerprint"]
  assert abn["model_state_fingerprint"] != plain["model_state_fingerprint"]
  assert abn["test_accuracy"] > 0.4 and plain["test_accuracy"] > 0.4, (abn, plain)
  assert abs(abn["test_accuracy"] - plain["test_accuracy"]) < 0.1


@pytest.mark.parametrize("name", ["gosgd", "ad_psgd", "ar_sgd"])
def test_async_bn_needs_a_server(name):
  with pytest.raises(ConfigError, match="async-bn"):
    jaxdl.run(RunConfig.make(algorithm=name, workers=2, async_bn=True, progress=False))
