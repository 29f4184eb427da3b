"""Partitions of a synchronous step's global batch (jaxdl.partition)."""
import numpy as np
import pytest

from jaxdl.errors import ConfigError
from jaxdl.partition import Partitioner, Policy, balanced, expected_slowest, quickest

SPEEDS = (1.0, 3.0, 3.0)  # examples per second, relative: the seed's 1 slow, 2 fast


def times(sizes, speeds=SPEEDS, jitter=None):
  """Each worker's seconds for its batch: its size over its speed (times a factor)."""
  factor = np.ones(len(sizes)) if jitter is None else jitter
  return [b / s * f for b, s, f in zip(sizes, speeds, factor)]


def proportional(total, speeds):
  """The split of workers with no fixed cost: seconds per example 1 / speed."""
  return balanced(total, np.asarray([[0.0, 1.0 / s] for s in speeds]))


def test_without_a_fixed_cost_a_split_is_exact_in_proportion_and_sums_to_the_batch():
  assert proportional(70, SPEEDS) == (10, 30, 30)
  assert proportional(96, SPEEDS) == (14, 41, 41)  # largest remainder: 13.71, 41.14, 41.14
  assert proportional(3, (1.0, 1000.0, 1.0)) == (1, 1, 1)  # at least one each
  assert proportional(100, (2.0, 1.0)) == (67, 33)


def test_the_expected_slowest_batch_is_exact():
  """E[max] over independent workers, each uniform over its values, against
  every combination of the values enumerated."""
  import itertools
  rng = np.random.default_rng(3)
  means = np.array([2.0, 0.5, 0.7])
  spreads = [rng.lognormal(0, 0.3, n) for n in (4, 5, 3)]
  every = [max(m * r for m, r in zip(means, rs)) for rs in itertools.product(*spreads)]
  assert expected_slowest(means, spreads) == pytest.approx(np.mean(every), rel=1e-12)


def test_a_split_for_scattered_times_lowers_the_expected_slowest_to_the_best_of_all():
  """The seed's speeds 1:3:3 and lognormal scatter of sigma 0.15: the
  equal-means split (14, 41, 41) is not the quickest on average; `quickest`
  finds the split of the lowest expected slowest batch of every split of 96
  (searched here by brute force), and without scatter keeps the equal
  means' slowest time."""
  rng = np.random.default_rng(0)
  costs = np.asarray([[0.0, 1.0 / s] for s in SPEEDS])
  spreads = [np.exp(0.15 * rng.standard_normal(300) - 0.15 ** 2 / 2) for _ in SPEEDS]
  slowest = lambda sizes: expected_slowest(costs[:, 1] * np.asarray(sizes), spreads)
  every = [(b0, b1, 96 - b0 - b1) for b0 in range(1, 95) for b1 in range(1, 96 - b0)]
  best = min(every, key=slowest)
  got = quickest(96, costs, spreads)
  assert sum(got) == 96 and slowest(got) == pytest.approx(slowest(best), rel=1e-12)
  assert slowest(got) < 0.99 * slowest(balanced(96, costs)) and got[0] < 14
  still = [np.ones(5)] * 3
  assert max(costs[:, 1] * quickest(96, costs, still)) == max(costs[:, 1] * (14, 41, 41))


def test_static_never_splits_again():
  p = Partitioner(Policy("static"), (32, 32, 32))
  assert all(p.observe(times(p.sizes)) is None for _ in range(100))
  assert p.sizes == (32, 32, 32)


def test_proportional_splits_once_after_its_warm_up_from_the_measured_speeds():
  p = Partitioner(Policy("proportional", every=5), (24, 23, 23))
  got = [p.observe(times(p.sizes)) for _ in range(5)]
  assert got[:4] == [None] * 4 and got[4] == (10, 30, 30) == p.sizes
  # the speeds change afterwards: proportional keeps its split
  assert all(p.observe(times(p.sizes, speeds=(3.0, 1.0, 1.0))) is None for _ in range(50))
  assert p.sizes == (10, 30, 30)


def test_adaptive_follows_a_worker_whose_speed_changes():
  p = Partitioner(Policy("adaptive", every=4, window=4), (24, 23, 23))
  for _ in range(4):
    p.observe(times(p.sizes))
  assert p.sizes == (10, 30, 30)
  for _ in range(8):  # worker 0 becomes the fast one: after a full window, B follows
    p.observe(times(p.sizes, speeds=(6.0, 3.0, 3.0)))
  assert p.sizes == (35, 18, 17)
  assert sum(p.sizes) == 70


def test_adaptive_with_jitter_stays_near_the_ideal_step_time():
  """Lognormal jitter (sigma 0.25) on every batch time: the moving window's
  estimate keeps the step's compute within 15% of the ideal (total work over
  total speed) on average, where equal batches take 2.3 times it."""
  rng = np.random.default_rng(0)
  total, speeds = 96, SPEEDS
  p = Partitioner(Policy("adaptive", every=10, window=20), (32, 32, 32))
  ideal = total / sum(speeds)  # the total work over the total speed
  assert max(times((32, 32, 32), speeds)) / ideal == pytest.approx(32 * 7 / 96)
  steps = []
  for _ in range(400):
    jitter = np.exp(0.25 * rng.standard_normal(3) - 0.25 ** 2 / 2)
    seconds = times(p.sizes, speeds, jitter)
    steps.append(max(seconds))
    p.observe(seconds)
    assert sum(p.sizes) == total and min(p.sizes) >= 1
  settled = np.mean(steps[100:])
  jittered_ideal = np.mean([max(times(proportional(total, speeds), speeds,
                                      np.exp(0.25 * rng.standard_normal(3) - 0.25 ** 2 / 2)))
                            for _ in range(2000)])
  assert settled < 1.15 * jittered_ideal
  assert abs(p.sizes[0] - 14) <= 3 and all(abs(b - 41) <= 4 for b in p.sizes[1:])


@pytest.mark.parametrize("field, kwargs", [
    ("partition", dict(kind="dynamic")),
    ("rebalance_every", dict(every=0)),
    ("rebalance_window", dict(window=2.5)),
])
def test_a_bad_policy_names_its_field(field, kwargs):
  with pytest.raises(ConfigError) as e:
    Policy(**kwargs)
  assert e.value.field == field


def test_sliced_streams_cut_one_global_batch_by_the_partition_at_each_step():
  from jaxdl.data import SlicedStreams, make_streams
  from jaxdl.data.fields import ArrayFields, FunctionData
  from jaxdl.errors import TaskError
  from jaxdl.partition import Partitions

  split = ArrayFields({"x": np.arange(50, dtype=np.float32)[:, None],
                       "label": np.zeros(50, np.int32)})
  partitions = Partitions((4, 3, 3), [(2, (1, 6, 3)), (5, (5, 4, 1))])
  streams = SlicedStreams(split, partitions, seed=7)
  one = SlicedStreams(split, Partitions((10,)), seed=7)
  assert streams.steps_per_epoch == 5 and streams.capacity == 6
  for step in range(12):  # two epochs and more: each its own permutation
    rows = [streams.indices(w, step) for w in range(3)]
    assert [len(r) for r in rows] == list(partitions.sizes(step))
    np.testing.assert_array_equal(np.concatenate(rows), one.indices(0, step))
  epoch = np.concatenate([one.indices(0, s) for s in range(5)])
  assert sorted(epoch) == sorted(set(epoch))  # no example twice in an epoch
  fields, weights, _ = streams.stacked_batches([(0, 2), (1, 2)])
  assert fields["x"].shape == (2, 6, 1)
  np.testing.assert_array_equal(weights.sum(axis=1) * 10, [1, 6])  # b_m / B
  with pytest.raises(TaskError) as e:
    make_streams(FunctionData(lambda w, s, seed: {}), (4, 3, 3), 0, "script", sliced=True)
  assert "arrays held in memory" in str(e.value)
  with pytest.raises(ValueError):
    Partitions((4, 3, 3), [(2, (1, 6, 4))])  # no longer B


# --- on the sim engine -------------------------------------------------------

HETEROGENEOUS = dict(workers=3, batch_sizes=(32, 32, 32), worker_speeds=(1.0, 3.0, 3.0))


def test_after_every_split_the_workers_train_as_one_worker_with_the_global_batch():
  """bsp over a global batch split anew every 3 steps (jittered speeds 1:3:3):
  each step's update is the global batch's mean gradient, as one worker's
  with batch B = 96 on the same examples (the training set permuted alike)."""
  import chex

  from jaxdl.config import RunConfig
  from jaxdl.data import SlicedStreams
  from jaxdl.partition import Partitions
  from tests.helpers import make_engine, train

  optim = dict(model="mlp", schedule="constant", optimizer="sgd", lr=0.05, momentum=0.9)
  many = make_engine(RunConfig.make(algorithm="bsp", engine="sim", jitter=0.3,
                                    partition="adaptive", rebalance_every=3, rebalance_window=3,
                                    **HETEROGENEOUS, **optim), total_steps=20)
  partitions = many.streams.partitions
  assert len(partitions.all) >= 3 and all(sum(s) == 96 for s in partitions.all)
  assert partitions.sizes(19) != (32, 32, 32)
  one = SlicedStreams(many.streams.split, Partitions((96,)), many.streams.seed)
  single = make_engine(RunConfig.make(algorithm="sgd", engine="sim", batch_size=96, **optim),
                       streams=one, total_steps=20)
  chex.assert_trees_all_close(many.evaluated(train(many, 20)[0]),
                              single.evaluated(train(single, 20)[0]), rtol=1e-5, atol=1e-6)


def test_the_trace_records_each_split_and_a_replay_follows_it(tmp_path):
  import jaxdl
  from jaxdl.config import RunConfig
  from jaxdl.trace import read_trace

  config = RunConfig.make(algorithm="ar_sgd", engine="sim", model="mlp", steps=30,
                          jitter=0.3, partition="adaptive", progress=False,
                          out=str(tmp_path / "run"), **HETEROGENEOUS)
  run = jaxdl.run(config)
  splits = [e for e in read_trace(tmp_path / "run" / "trace.jsonl") if e.kind == "partition"]
  assert splits[0].iteration == 1  # adaptive: after the first step, then every 5
  assert all(sum(e.sizes) == 96 and e.iteration % 5 == 0 for e in splits[1:])
  assert splits[-1].sizes[0] < 20 < min(splits[-1].sizes[1:])  # the slow worker: a smaller share
  replay = jaxdl.run(config.replace(jitter=0.0, out=str(tmp_path / "replay"),
                                    replay=str(tmp_path / "run" / "trace.jsonl")))
  assert replay["params_fingerprint"] == run["params_fingerprint"]
  with pytest.raises(ConfigError) as e:  # its batches would not be the recorded run's
    jaxdl.run(config.replace(partition="static", out=str(tmp_path / "static"),
                             replay=str(tmp_path / "run" / "trace.jsonl")))
  assert e.value.field == "replay"


def test_adaptive_steps_stay_near_the_ideal_where_equal_batches_take_twice_it(tmp_path):
  """The Choi seed's setting, modelled: speeds 1:3:3, 1.9 s a batch of 32 at
  speed 1, jitter sigma 0.15 (its 1.4-2.5 s around 1.9 s). The ideal step is
  the total work over the total speed, B / 32 * 1.9 / 7 s."""
  import jaxdl
  from jaxdl.config import RunConfig

  base = RunConfig.make(algorithm="ar_sgd", model="mlp", steps=300, compute_time=1.9,
                        jitter=0.15, dry_run=True, progress=False, **HETEROGENEOUS)
  ideal = 300 * 96 / 32 * 1.9 / 7
  time = {p: jaxdl.run(base.replace(partition=p, out=str(tmp_path / p)))["simulated_time_s"]
          for p in ("static", "proportional", "adaptive")}
  assert time["static"] > 2 * ideal
  assert time["adaptive"] < 1.15 * ideal and time["proportional"] < 1.15 * ideal


def test_correlated_jitter_shortens_the_wait_for_the_slowest_of_equal_batch_times(tmp_path):
  """The Choi seed's speeds 1:1.5:1.5, B = 96 split by them (24, 36, 36:
  1.425 s each on average) and jitter sigma 0.25: a step waits for the
  slowest of three lognormal factors, whose mean is 1.216 x independent and
  1.151 x at --jitter-correlation 0.5 (numpy, 400,000 draws); over 300 steps
  the standard error is about 0.01."""
  import jaxdl
  from jaxdl.config import RunConfig

  base = RunConfig.make(algorithm="ar_sgd", model="mlp", steps=300, workers=3,
                        worker_speeds=(1.0, 1.5, 1.5), compute_time=1.9, jitter=0.25,
                        dry_run=True, progress=False)
  ideal = 300 * 96 / 32 * 1.9 / 4
  slowest = {rho: jaxdl.run(base.replace(jitter_correlation=rho, out=str(tmp_path / str(rho))))[
      "simulated_time_s"] / ideal for rho in (0.0, 0.5)}
  assert slowest[0.0] == pytest.approx(1.216, abs=0.03)
  assert slowest[0.5] == pytest.approx(1.151, abs=0.03)


@pytest.mark.slow
def test_a_compare_grid_of_partitions_reports_idle_workers_and_batch_times(tmp_path):
  """`jaxdl compare` over ar_sgd and ar_sgd_adaptive: the report's partition
  table (idle share, time per epoch) and the per-worker batch-time histograms."""
  import json

  from jaxdl.cli import main

  out = tmp_path / "grid"
  assert main(["compare", "--algorithms", "ar_sgd", "ar_sgd_adaptive", "--workers", "3",
               "--batch-sizes", "32", "32", "32", "--worker-speeds", "1", "3", "3",
               "--compute-time", "1.9", "--jitter", "0.15", "--model", "mlp", "--steps", "40",
               "--out", str(out), "--jobs", "1", "--no-progress"]) == 0
  summary = {p: json.loads((out / p / "summary.json").read_text())
             for p in ("ar_sgd-m3", "ar_sgd_adaptive-m3")}
  static, adaptive = summary["ar_sgd-m3"], summary["ar_sgd_adaptive-m3"]
  assert static["idle_fraction"] > 0.4 > 0.2 > adaptive["idle_fraction"]
  assert static["simulated_time_s"] > 1.8 * adaptive["simulated_time_s"]
  # the slow worker's batches take 3 times the others' under equal batches
  slow, fast = static["batch_seconds_per_worker"][0], static["batch_seconds_per_worker"][1]
  assert 2.5 < slow / fast < 3.5
  counts = static["batch_seconds_histogram"]["counts"]
  assert [sum(c) for c in counts] == [40, 40, 40]
  report = (out / "report.md").read_text()
  assert "### Partitions of the global batch" in report and "| ar_sgd_adaptive ×3 |" in report
  assert (out / "batch_times.png").stat().st_size > 0


def test_a_resumed_adaptive_run_equals_the_uninterrupted_one(tmp_path):
  """The sim's splits come from its modelled times: a resumed run splits B as
  the uninterrupted one did, and ends on the same parameters."""
  import shutil

  import jaxdl
  from jaxdl.config import RunConfig

  config = RunConfig.make(algorithm="bsp", engine="sim", model="mlp", steps=24, jitter=0.3,
                          partition="adaptive", checkpoint_every=10, progress=False,
                          out=str(tmp_path / "run"), **HETEROGENEOUS)
  full = jaxdl.run(config)
  trace = (tmp_path / "run" / "trace.jsonl").read_text()
  shutil.rmtree(tmp_path / "run" / "checkpoints" / "20")  # as if killed after step 20
  (tmp_path / "run" / "summary.json").unlink()
  resumed = jaxdl.run(config.replace(resume=True))
  assert resumed["params_fingerprint"] == full["params_fingerprint"]
  assert (tmp_path / "run" / "trace.jsonl").read_text() == trace


def test_a_fixed_cost_per_step_does_not_feed_the_larger_batch():
  """Two equal workers paying 20 ms a step besides 1 ms an example: by
  throughput alone the larger batch looks faster and grows every split; the
  fitted cost (a + c b) splits evenly."""
  p = Partitioner(Policy("adaptive", every=2, window=4), (40, 56))
  for _ in range(20):
    p.observe([0.020 + 0.001 * b for b in p.sizes])
  assert p.sizes == (48, 48)
  # worker 0 (10 s an example) held at one; the others' times equal: 0.2 + 0.9 = 1.1 = 1.1
  costs = np.asarray([[0.0, 10.0], [0.2, 0.1], [0.0, 0.1]])
  assert balanced(21, costs) == (1, 9, 11)
