"""Asynchronous algorithms on the sim engine: the invariants of REFERENCE.md."""
import tempfile

import jax
import numpy as np
import pytest

from jaxdl.algorithms import ALGORITHMS, Problem
from jaxdl.config import RunConfig
from jaxdl.data import WorkerStreams
from jaxdl.engines.sim import SimEngine
from jaxdl.models import build_model
from jaxdl.optim import make_optimizer
from jaxdl.trace import Event, write_trace
from tests.helpers import DIGITS, leaves, make_engine, train

CONFIG = RunConfig.make(model="mlp", schedule="constant", lr=0.05, batch_size=32)


def _sim(name, events, workers, config=CONFIG):
  """A sim engine replaying `events` (written as a trace file)."""
  path = tempfile.mktemp(suffix=".jsonl")
  write_trace(path, events)
  streams = WorkerStreams(DIGITS.train, (32,) * workers, 0)
  problem = Problem(build_model("mlp", 10, DIGITS.image_shape),
                    make_optimizer(config.optim, 1000, 40))
  steps = sum(e.kind == "apply" for e in events) // workers
  return SimEngine(ALGORITHMS.get(name), problem, streams,
                   config.replace(algorithm=name, workers=workers, replay=path), steps)


def _run_sim(engine, steps):
  state = engine.init(jax.random.key(0))
  for t in range(steps):
    state, _ = engine.step(state, t)
  return state


def _round_robin(workers, iterations):
  """Zero delay: each worker pulls right after the previous update."""
  events, t = [], 0.0
  for c in range(iterations):
    for m in range(workers):
      events += [Event(t, "pull", m, c), Event(t + 0.5, "apply", m, c)]
      t += 1.0
  return events


class RoundRobinStreams:
  """One worker whose step t is worker (t mod M)'s iteration t // M."""

  def __init__(self, streams):
    self.inner, self.num_workers = streams, 1
    self.batch_sizes = streams.batch_sizes[:1]

  def stacked_batch(self, step, workers=None):
    m = self.inner.num_workers
    images, labels, weights = self.inner.stacked_batches([(step % m, step // m)])
    return images, labels, weights * m  # one worker's batch is the whole batch


@pytest.mark.parametrize("workers", [1, 3])
def test_asp_under_a_zero_delay_schedule_is_sequential_sgd(workers):
  steps = 6
  sim = _sim("asp", _round_robin(workers, steps), workers)
  params = leaves(sim.evaluated(_run_sim(sim, steps))[0])
  sgd = make_engine(CONFIG.replace(algorithm="sgd"), streams=RoundRobinStreams(sim.streams))
  reference = leaves(sgd.evaluated(train(sgd, steps * workers)[0])[0])
  for x, y in zip(params, reference):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_stale_gradients_are_applied_exactly():
  # Two workers pull version 0; worker 0's update lands first, so worker 1's
  # gradient, computed on version 0, is applied to version 1 (staleness 1).
  events = [Event(0, "pull", 0, 0), Event(0, "pull", 1, 0),
            Event(1, "apply", 0, 0), Event(2, "apply", 1, 0)]
  sim = _sim("asp", events, 2)
  state = _run_sim(sim, 1)
  problem, streams = sim.problem, sim.streams
  params, _ = problem.model.init(jax.random.key(0))
  opt = problem.optimizer.init(params)

  def grad(worker):
    images, labels, _ = streams.batch(worker, 0) + (None,)
    batch = jax.tree.map(lambda x: x[0], streams.stacked_batches([(worker, 0)]))
    from jaxdl.algorithms import Batch, WorkerAxis
    batch = Batch(*batch)
    g, _, _ = problem.gradients(params, {}, batch, WorkerAxis(1))
    return jax.tree.map(lambda x: x / batch.weights.sum(), g)

  import optax
  w = params
  for worker in (0, 1):  # both gradients at version 0, applied in order
    updates, opt = problem.optimizer.update(grad(worker), opt, w)
    w = optax.apply_updates(w, updates)
  for x, y in zip(leaves(sim.evaluated(state)[0]), leaves(w)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
  assert int(state.server.version) == 2


RUN = dict(model="mlp", epochs=1, workers=4, batch_size=8, progress=False,
           schedule="constant", momentum=0.0, lr=0.1, jitter=0.3)


def test_sim_runs_are_reproducible_and_replayable(tmp_path):
  import jaxdl
  a = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "a"), **RUN))
  b = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "b"), **RUN))
  trace = (tmp_path / "a" / "trace.jsonl").read_text()
  assert a["params_fingerprint"] == b["params_fingerprint"]
  assert trace == (tmp_path / "b" / "trace.jsonl").read_text()
  replayed = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "r"),
                                      replay=str(tmp_path / "a" / "trace.jsonl"), **RUN))
  assert replayed["params_fingerprint"] == a["params_fingerprint"]
  fast = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "f"),
                                  network="56gbps", **RUN))
  assert (tmp_path / "f" / "trace.jsonl").read_text() != trace
  assert fast["simulated_time_s"] < a["simulated_time_s"]
  assert a["staleness_max"] >= 1 and a["simulated_time_s"] > 0 and a["bytes_total"] > 0


def test_ssp_with_an_unreachable_bound_is_asp(tmp_path):
  import jaxdl
  asp = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "asp"), **RUN))
  ssp = jaxdl.run(RunConfig.make(algorithm="ssp", staleness_bound=10**6,
                                 out=str(tmp_path / "ssp"), **RUN))
  assert ssp["params_fingerprint"] == asp["params_fingerprint"]
  tight = jaxdl.run(RunConfig.make(algorithm="ssp", staleness_bound=0,
                                   out=str(tmp_path / "s0"), **RUN))
  assert tight["staleness_max"] <= asp["staleness_max"]
  assert tight["params_fingerprint"] != asp["params_fingerprint"]


def _trained(name, steps=6, **extra):
  from tests.helpers import make_engine as engine_for
  config = CONFIG.replace(algorithm=name, workers=4, batch_size=16, momentum=0.0, **extra)
  engine = engine_for(config, total_steps=steps)
  state, _ = train(engine, steps)
  return engine, state


def test_gosgd_conserves_weight_and_the_weighted_model():
  from jaxdl.algorithms import gosgd
  engine, state = _trained("gosgd", gossip_probability=1.0)
  weights = np.asarray(state.workers.weight)
  assert abs(weights.sum() - 1.0) < 1e-6 and len(set(weights.tolist())) > 1
  sender, receiver = _take_two(state.workers, 0, 1)
  before = _weighted_sum([sender, receiver])
  after = _weighted_sum(gosgd.pair(engine.problem, engine.config, sender, receiver))
  for x, y in zip(before, after):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_ad_psgd_averaging_preserves_the_mean():
  from jaxdl.algorithms import ad_psgd
  engine, state = _trained("ad_psgd")
  a, b = _take_two(state.workers, 1, 2)
  assert not np.allclose(leaves(a.params)[0], leaves(b.params)[0])
  a2, b2 = ad_psgd.pair(engine.problem, engine.config, a, b)
  for x, y, x2, y2 in zip(leaves(a.params), leaves(b.params), leaves(a2.params),
                          leaves(b2.params)):
    np.testing.assert_allclose(x + y, x2 + y2, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(x2, y2)


class OneWorkerStreams:
  """Worker `w`'s own batches, as a one-worker stream."""

  def __init__(self, streams, w):
    self.inner, self.w, self.num_workers = streams, w, 1
    self.batch_sizes = (streams.batch_sizes[w],)

  def stacked_batch(self, step, workers=None):
    images, labels, weights = self.inner.stacked_batches([(self.w, step)])
    return images, labels, weights * self.inner.num_workers


def test_easgd_without_elasticity_leaves_workers_independent():
  engine, state = _trained("easgd", elasticity=0.0, communication_period=2)
  initial = leaves(engine.init(jax.random.key(0)).server.params)
  for c, i in zip(leaves(state.server.params), initial):
    np.testing.assert_array_equal(c, i)  # nothing ever reaches the center
  for w in range(4):  # each worker is one-worker SGD on its own shard
    steps = sum(e.kind == "local" and e.worker == w for e in engine.events)
    sgd = make_engine(engine.config.replace(algorithm="sgd", workers=1),
                      streams=OneWorkerStreams(engine.streams, w))
    alone = leaves(sgd.evaluated(train(sgd, steps)[0])[0])
    for x, y in zip(leaves(jax.tree.map(lambda x: x[w], state.workers.params)), alone):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def _take_two(workers, i, j):
  return jax.tree.map(lambda x: x[i], workers), jax.tree.map(lambda x: x[j], workers)


def _weighted_sum(pair):
  return [a.weight * x + b.weight * y
          for x, y in zip(leaves(pair[0].params), leaves(pair[1].params))
          for a, b in [(pair[0], pair[1])]]


@pytest.mark.parametrize("name", ["ssp", "ad_psgd"])
def test_sim_resume_equals_the_uninterrupted_run(tmp_path, name):
  import shutil

  import jaxdl
  config = RunConfig.make(algorithm=name, out=str(tmp_path / "run"), checkpoint_every=20,
                          **dict(RUN, epochs=2))
  full = jaxdl.run(config)
  steps = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()
                 if p.name.isdigit())
  shutil.rmtree(tmp_path / "run" / "checkpoints" / str(steps[-1]))  # as if killed
  (tmp_path / "run" / "summary.json").unlink()
  resumed = jaxdl.run(config.replace(resume=True))
  assert resumed["params_fingerprint"] == full["params_fingerprint"]
  assert resumed["simulated_time_s"] == full["simulated_time_s"]


@pytest.mark.slow
def test_dry_run_shows_the_parameter_server_bottleneck(tmp_path):
  """F3 of IPDPS'21, timing only: ResNet-50 on Titan Vs at 10 Gbps, 4 -> 24 workers."""
  import jaxdl
  speedup = {}
  for algorithm in ("bsp", "asp", "ar_sgd", "ad_psgd"):
    rate = {}
    for workers in (4, 24):
      summary = jaxdl.run(RunConfig.make(
          algorithm=algorithm, workers=workers, dry_run=True, model="resnet50",
          dataset="synthetic", image_size=224, batch_size=32, compute_time=0.066,
          network="10gbps", steps=30, progress=False,
          out=str(tmp_path / f"{algorithm}-{workers}")))
      assert summary["dry_run"] and not (tmp_path / f"{algorithm}-{workers}" /
                                         "checkpoints").exists()
      rate[workers] = summary["samples_per_simulated_s"]
    speedup[algorithm] = rate[24] / rate[4]
  assert max(speedup["bsp"], speedup["asp"]) < min(speedup["ar_sgd"], speedup["ad_psgd"])
