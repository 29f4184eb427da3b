"""Partitions of a synchronous step's global batch (jaxdl.partition)."""
import numpy as np
import pytest

from jaxdl.errors import ConfigError
from jaxdl.partition import Partitioner, Policy, ideal_step_time, split, step_time

SPEEDS = (1.0, 3.0, 3.0)  # examples per second, relative: the seed's 1 slow, 2 fast


def times(sizes, speeds=SPEEDS, jitter=None):
  """Each worker's seconds for its batch: its size over its speed (times a factor)."""
  factor = np.ones(len(sizes)) if jitter is None else jitter
  return [b / s * f for b, s, f in zip(sizes, speeds, factor)]


def test_split_is_exact_in_proportion_and_sums_to_the_batch():
  assert split(70, SPEEDS) == (10, 30, 30)
  assert split(96, SPEEDS) == (14, 41, 41)  # largest remainder: 13.71, 41.14, 41.14
  assert split(3, (1.0, 1000.0, 1.0)) == (1, 1, 1)  # at least one each
  assert split(100, (2.0, 1.0)) == (67, 33)
  with pytest.raises(ConfigError) as e:
    split(2, SPEEDS)
  assert e.value.field == "batch_size"


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
  ideal = ideal_step_time(total, speeds)
  assert step_time((32, 32, 32), speeds) / ideal == pytest.approx(32 * 7 / 96)
  steps = []
  for _ in range(400):
    jitter = np.exp(0.25 * rng.standard_normal(3) - 0.25 ** 2 / 2)
    seconds = times(p.sizes, speeds, jitter)
    steps.append(max(seconds))
    p.observe(seconds)
    assert sum(p.sizes) == total and min(p.sizes) >= 1
  settled = np.mean(steps[100:])
  jittered_ideal = np.mean([max(times(split(total, speeds), speeds,
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
