"""--compress: each algorithm's outgoing messages compressed with error feedback.

What is compressed (jaxdl.config's --compress help): the gradient of sgd,
ar_sgd and bsp before the all-reduce or push, the push of asp, ssp, dc_asgd
and lc_asgd, local_sgd's model difference from the last average, DiLoCo's
outer gradient and EASGD's elastic difference; for gosgd and ad_psgd, a model's
difference from the reference its pair holds (tests/algorithms/test_gossip_compression.py).
"""
import shutil

import chex
import jax
import numpy as np
import optax
import pytest

import jaxdl
from jaxdl.algorithms import WorkerAxis
from jaxdl.config import RunConfig
from jaxdl.engines.events import one_batch
from tests import marks
from tests.helpers import leaves, make_setup, train

SIM = dict(model="mlp", engine="sim", schedule="constant", batch_size=16)
# The mlp on digits, by hand: (64 -> 256 -> 128 -> 10), each kernel and bias a leaf.
LEAF_SIZES = (64 * 256, 256, 256 * 128, 128, 128 * 10, 10)
MODEL_BYTES = 4 * sum(LEAF_SIZES)  # 203,304
# topk:0.01 keeps ceil(d / 100) of a leaf of d: 164 + 3 + 328 + 2 + 13 + 1 = 511,
# each a float32 value and an int32 index
TOPK_BYTES = 8 * (164 + 3 + 328 + 2 + 13 + 1)  # 4,088


def evaluated(config: RunConfig, steps: int):
  engine = make_setup(config, total_steps=steps).engine
  return engine.evaluated(train(engine, steps)[0])


@pytest.mark.parametrize("algorithm", marks.default_first(["bsp", "asp", "lc_asgd"]))
def test_topk_of_everything_is_no_compression(algorithm):
  """topk:1 sends every coordinate and keeps a zero residual: the run of no
  compression, to the bit (a -0.0 gradient becomes +0.0 in g + e, which
  changes no parameter)."""
  config = RunConfig.make(algorithm=algorithm, workers=3, jitter=0.3, compute_time=1e-3,
                          momentum=0.9, lr=0.05, **SIM)
  plain = evaluated(config, 8)
  topk = evaluated(config.replace(compress="topk:1"), 8)
  for a, b in zip(leaves(plain), leaves(topk)):
    np.testing.assert_array_equal(a, b)


# By default, ar_sgd's compressed step is checked against numpy
# (test_ar_sgd_topk_is_error_feedback_per_worker_written_out), EASGD's and
# DiLoCo's by hand (below and tests/algorithms/test_diloco.py).
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ar_sgd", "easgd", "diloco"])
def test_topk_of_everything_is_no_compression_up_to_rounding(algorithm):
  """The same for ar_sgd (whose workers are vmapped in one program) and
  EASGD: there XLA fuses the gradient or the difference with the compressor
  and rounds the last bit of some coordinates otherwise (measured: 6e-7
  relative after 8 steps); DiLoCo's sum of the workers' outer gradients,
  sum_m (b_m / B)(theta - theta_m), is theta less their mean model up to
  rounding (measured: 6e-8 apart, parameters up to 0.3)."""
  extra = {"inner_steps": 2, "optimizer": "sgd"} if algorithm == "diloco" else {}
  config = RunConfig.make(algorithm=algorithm, workers=3, jitter=0.3, compute_time=1e-3,
                          momentum=0.9, lr=0.05, **SIM, **extra)
  chex.assert_trees_all_close(evaluated(config, 8),
                              evaluated(config.replace(compress="topk:1"), 8),
                              rtol=1e-5, atol=1e-7 if algorithm == "diloco" else 1e-8)


@pytest.mark.slow  # by default: test_local_sgd_sends_differences_from_the_last_average_written_out
def test_local_sgd_topk_of_everything_averages_the_models():
  """x_ref + sum_k (b_k / B)(x_k - x_ref) is the weighted mean of the models,
  up to rounding."""
  config = RunConfig.make(algorithm="local_sgd", workers=3, communication_period=2,
                          batch_sizes=(8, 16, 24), lr=0.05, momentum=0.9, **SIM)
  chex.assert_trees_all_close(evaluated(config, 8),
                              evaluated(config.replace(compress="topk:1"), 8),
                              rtol=1e-5, atol=1e-6)


def _top_k(x: np.ndarray, k: int) -> np.ndarray:
  out = np.zeros_like(x.ravel())
  index = np.argsort(-np.abs(x.ravel()), kind="stable")[:k]
  out[index] = x.ravel()[index]
  return out.reshape(x.shape)


def test_ar_sgd_topk_is_error_feedback_per_worker_written_out():
  """Two workers, plain SGD, 3 steps of topk:0.05, against the rule written
  out in numpy: worker m sends c_m = top_k(g_m + e_m), keeps e_m <- g_m + e_m
  - c_m, and every replica steps by -lr * (c_0 + c_1). The gradients (each
  worker's share of the global one) are the Problem's."""
  lr, steps = 0.1, 3
  config = RunConfig.make(algorithm="ar_sgd", workers=2, compress="topk:0.05", lr=lr,
                          momentum=0.0, **SIM)
  run = make_setup(config, total_steps=steps)
  engine, problem = run.engine, run.problem
  state = engine.init(jax.random.key(0))
  params, model_state = engine.evaluated(state)
  state = train(engine, steps, state=state)[0]
  residual = [jax.tree.map(lambda x: np.zeros(x.shape, np.float32), params)] * 2
  for t in range(steps):
    sent = []
    for w in range(2):
      grads = problem.gradients(params, model_state, one_batch(run.streams, w, t),
                                WorkerAxis(1))[0]
      corrected = jax.tree.map(lambda g, e: np.asarray(g) + e, grads, residual[w])
      # k = ceil(0.05 d), in integers
      c = jax.tree.map(lambda x: _top_k(x, -(-x.size * 5 // 100)), corrected)
      residual[w] = jax.tree.map(lambda x, s: x - s, corrected, c)
      sent.append(c)
    params = jax.tree.map(lambda p, a, b: np.asarray(p) - lr * (a + b), params, *sent)
  chex.assert_trees_all_close(engine.evaluated(state)[0], params, rtol=1e-5, atol=1e-7)
  outbox = state.workers.outbox  # the sim engine's workers, stacked
  for w in range(2):  # each worker keeps its own residual
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[w], outbox.residual), residual[w],
                                rtol=1e-4, atol=1e-7)


def test_local_sgd_sends_differences_from_the_last_average_written_out():
  """Two workers, H = 2 local steps of plain SGD, 4 steps of topk:0.05,
  against Qsparse-local-SGD written out in numpy: at an averaging worker m
  sends c_m = top_k(x_m - x_ref + e_m), keeps e_m <- x_m - x_ref + e_m - c_m,
  and both take x_ref <- x_ref + sum_k (b_k / B) c_k."""
  lr, steps = 0.1, 4
  config = RunConfig.make(algorithm="local_sgd", workers=2, communication_period=2,
                          batch_sizes=(8, 24), compress="topk:0.05", lr=lr, momentum=0.0,
                          **SIM)
  run = make_setup(config, total_steps=steps)
  engine, problem = run.engine, run.problem
  state = engine.init(jax.random.key(0))
  reference, model_state = engine.evaluated(state)
  state = train(engine, steps, state=state)[0]
  share = [8 / 32, 24 / 32]
  models = [reference] * 2
  residual = [jax.tree.map(lambda x: np.zeros(x.shape, np.float32), reference)] * 2
  for t in range(steps):
    for w in range(2):
      grads = problem.gradients(models[w], model_state, one_batch(run.streams, w, t),
                                WorkerAxis(1))[0]
      models[w] = jax.tree.map(lambda x, g: np.asarray(x) - lr * np.asarray(g) / share[w],
                               models[w], grads)
    if t % 2 == 1:
      sent = []
      for w in range(2):
        corrected = jax.tree.map(lambda x, r, e: x - np.asarray(r) + e, models[w], reference,
                                 residual[w])
        c = jax.tree.map(lambda x: _top_k(x, -(-x.size * 5 // 100)), corrected)
        residual[w] = jax.tree.map(lambda x, s: x - s, corrected, c)
        sent.append(c)
      reference = jax.tree.map(lambda r, a, b: np.asarray(r) + share[0] * a + share[1] * b,
                               reference, *sent)
      models = [reference] * 2
  chex.assert_trees_all_close(engine.evaluated(state)[0], reference, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(jax.tree.map(lambda x: x[1], state.workers.reference),
                              reference, rtol=1e-5, atol=1e-6)


def test_an_elastic_exchange_sends_the_compressed_difference():
  """EASGD with topk:0.5 on 4 coordinates, by hand: d = alpha (x - w); the
  center adds the 2 largest of d + e, the worker moves by all of d, and
  center + worker + residual is what center + worker was."""
  from jaxdl.algorithms import Problem, easgd
  problem = Problem(task=None, optimizer=optax.sgd(0.1), compress="topk:0.5")
  x = {"w": np.array([1.0, -4.0, 2.0, 0.5], np.float32)}
  w = {"w": np.array([0.0, 0.0, 1.0, 0.0], np.float32)}
  worker = easgd.ElasticWorker(x, {}, (), problem.init_outbox(x, 0))
  center, worker = easgd.exchange(problem, 0.5, easgd.Center(w), worker)
  # d = 0.5 (x - w) = [0.5, -2, 0.5, 0.25]: the two largest, -2 and the first 0.5
  np.testing.assert_array_equal(center.params["w"], [0.5, -2.0, 1.0, 0.0])
  np.testing.assert_array_equal(worker.params["w"], [0.5, -2.0, 1.5, 0.25])
  np.testing.assert_array_equal(worker.outbox.residual["w"], [0.0, 0.0, 0.5, 0.25])
  center, worker = easgd.exchange(problem, 0.5, center, worker)
  # d = 0.5 (x - w) = [0, 0, 0.25, 0.125]; d + e = [0, 0, 0.75, 0.375]: both sent
  np.testing.assert_array_equal(center.params["w"], [0.5, -2.0, 1.75, 0.375])
  np.testing.assert_array_equal(worker.params["w"], [0.5, -2.0, 1.25, 0.125])
  np.testing.assert_array_equal(worker.outbox.residual["w"], [0.0, 0.0, 0.0, 0.0])
  np.testing.assert_array_equal(center.params["w"] + worker.params["w"], x["w"] + w["w"])


@pytest.mark.parametrize("algorithm,compress", [marks.slow("ar_sgd", "randk:0.1"),
                                                ("bsp", "powersgd:1"),
                                                marks.slow("local_sgd", "qsgd:4")])
def test_the_mesh_engine_compresses_as_the_sim_engine(algorithm, compress):
  """Each worker's own residual, memory and draws on its own device (4 of the
  8 CPU devices) give the sim engine's vmapped workers' result."""
  period = dict(communication_period=2) if algorithm == "local_sgd" else {}
  config = RunConfig.make(algorithm=algorithm, workers=4, batch_sizes=(8, 12, 8, 4),
                          model="mlp", schedule="constant", optimizer="adam", lr=1e-3,
                          compress=compress, **period)
  results = [evaluated(config.replace(engine=engine), 10) for engine in ("mesh", "sim")]
  chex.assert_trees_all_close(*results, rtol=1e-5, atol=4e-6)
  plain = evaluated(config.replace(engine="sim", compress="none"), 10)
  assert not np.allclose(leaves(plain)[0], leaves(results[1])[0], rtol=1e-3, atol=1e-5)


# By default: ar_sgd's compressed step against numpy (above), and top-k 1% with
# error feedback converging, without it not (tests/algorithms/test_compression.py).
@pytest.mark.slow
def test_ar_sgd_trains_with_topk_of_one_percent():
  """1% of each leaf a step, with error feedback, still trains the mlp on
  digits: measured, the last 10 steps' mean loss is 0.19 after 100 (2.3 at
  the start; 0.06 uncompressed). Without the residual it stays far above."""
  config = RunConfig.make(algorithm="ar_sgd", workers=4, compress="topk:0.01", **SIM)
  engine = make_setup(config, total_steps=100).engine
  losses = [m["loss"] for m in train(engine, 100)[1]]
  assert np.mean(losses[:10]) > 1.5
  assert np.mean(losses[-10:]) < 0.4


RESUME = dict(model="mlp", steps=12, workers=4, batch_size=8, progress=False,
              schedule="constant", momentum=0.0, lr=0.1, jitter=0.3, compute_time=1e-3,
              checkpoint_every=4, engine="sim")


# Every compressor's state travels as the worker's `outbox` whatever the
# algorithm (gosgd's and ad_psgd's as their pairwise links): the default run
# resumes PowerSGD's Q and residual; a key-drawing compressor's (randk), a
# gossip worker's references and the others run with the slow cases.
@pytest.mark.parametrize("algorithm,compress", [
    ("asp", "powersgd:1"), marks.slow("ar_sgd", "randk:0.05"), marks.slow("gosgd", "randk:0.05"),
    marks.slow("local_sgd", "qsgd:4"),
    marks.slow("easgd", "topk:0.05"),
    marks.slow("diloco", "topk:0.05"),
    marks.slow("ad_psgd", "powersgd:1")])
def test_resume_restores_the_residuals_bit_for_bit(tmp_path, algorithm, compress):
  """The residual, PowerSGD's Q and the key are in the workers' checkpointed
  state (gosgd's and ad_psgd's pairwise references and their Q per pair
  too): a run killed after its second checkpoint and resumed ends with the
  uninterrupted run's parameters (a residual restarted at zero would not)."""
  config = RunConfig.make(algorithm=algorithm, compress=compress, out=str(tmp_path / "run"),
                          **RESUME)
  full = jaxdl.run(config)
  shutil.rmtree(tmp_path / "run" / "checkpoints" / "12")  # as if killed after step 8
  (tmp_path / "run" / "summary.json").unlink()
  resumed = jaxdl.run(config.replace(resume=True))
  assert resumed["params_fingerprint"] == full["params_fingerprint"]
  plain = jaxdl.run(config.replace(compress="none", out=str(tmp_path / "plain")))
  assert plain["params_fingerprint"] != full["params_fingerprint"]


BYTES = dict(SIM, workers=4, compute_time=1e-3, network="1gbps", latency=0.0, progress=False)


def test_ar_sgd_bytes_are_the_compressed_messages_all_gathered(tmp_path):
  """5 steps of 4 workers: each worker's topk:0.01 message to the 3 others,
  5 x 4 x 3 x 4,088 = 245,280 bytes (a ring all-reduce of the model:
  5 x 2 x 3 x 203,304 = 6,099,120), and less simulated time on 1 Gbps."""
  config = RunConfig.make(algorithm="ar_sgd", steps=5, **BYTES)
  plain = jaxdl.run(config.replace(out=str(tmp_path / "plain")))
  topk = jaxdl.run(config.replace(compress="topk:0.01", out=str(tmp_path / "topk")))
  assert plain["bytes_total"] == 5 * 2 * 3 * MODEL_BYTES == 6_099_120
  assert topk["bytes_total"] == 5 * 4 * 3 * TOPK_BYTES == 245_280
  assert topk["bytes_communicated_per_step"] == 4 * 3 * TOPK_BYTES
  # a round: 3 phases of 4,088 bytes at 1.25e8 bytes/s, against 6 of 203,304 / 4
  compute = 5 * 1e-3
  assert topk["simulated_time_s"] == pytest.approx(compute + 5 * 3 * TOPK_BYTES / 1.25e8)
  assert plain["simulated_time_s"] == pytest.approx(compute + 5 * 6 * MODEL_BYTES / 4 / 1.25e8)


def test_bsp_pushes_are_compressed_and_pulls_whole(tmp_path):
  """5 steps of 4 workers at a server: 5 x 4 pushes of 4,088 bytes and, after
  every step but the last, 4 pulls of the model's 203,304."""
  config = RunConfig.make(algorithm="bsp", steps=5, compress="topk:0.01", **BYTES)
  summary = jaxdl.run(config.replace(out=str(tmp_path / "bsp")))
  assert summary["bytes_total"] == 5 * 4 * TOPK_BYTES + 4 * 4 * MODEL_BYTES == 3_334_624
  assert summary["bytes_communicated_per_step"] == 4 * (TOPK_BYTES + MODEL_BYTES)


@pytest.mark.parametrize("algorithm", ["asp", marks.slow("easgd")])
def test_asynchronous_runs_send_fewer_bytes_in_less_time(tmp_path, algorithm):
  """A push of 4,088 bytes instead of 203,304 on 1 Gbps: about half the bytes
  (the pull, the server's model, stays whole) and an earlier end for the
  same budget of samples (a little: the pulls share the server's link, and
  they are what queues there)."""
  period = dict(communication_period=1) if algorithm == "easgd" else {}
  config = RunConfig.make(algorithm=algorithm, steps=5, **period, **BYTES)
  plain = jaxdl.run(config.replace(out=str(tmp_path / "plain")))
  topk = jaxdl.run(config.replace(compress="topk:0.01", out=str(tmp_path / "topk")))
  assert topk["bytes_total"] < 0.6 * plain["bytes_total"]
  assert topk["simulated_time_s"] < plain["simulated_time_s"]
  assert topk["bytes_communicated_per_step"] == 4 * (TOPK_BYTES + MODEL_BYTES)
