"""The common test: every registered algorithm, on every engine that runs its family.

Adding an algorithm to the registry adds it here: it must learn, keep its
state's structure, be bitwise deterministic under a fixed key, and compile its
step once. (tests/algorithms/test_families.py checks each family's invariants.)
"""
import chex
import jax
import numpy as np
import pytest

from jaxdl.algorithms import ALGORITHMS
from jaxdl.config import RunConfig
from jaxdl.engines import ENGINES, engines_for
from tests.helpers import make_engine, train
from tests import marks

# A real engine's case costs its processes' start-up: asp's runs by default,
# the others with the slow end-to-end cases.
CASES = [(name, engine) if ENGINES.get(engine).deterministic or name == "asp"
         else marks.slow(name, engine)
         for name in ALGORITHMS for engine in engines_for(ALGORITHMS.get(name).family)]
STEPS = 30


def _config(name: str, engine: str) -> RunConfig:
  # Plain SGD: with momentum 0.9 at this rate, asp's stale updates diverge
  # (asynchrony acts as extra momentum), which is the algorithm, not a bug.
  # Named, so that an algorithm's own recipe (diloco's adamw) does not apply.
  workers = ALGORITHMS.get(name).max_workers or 4
  return RunConfig.make(algorithm=name, engine=engine, workers=workers, model="mlp",
                        batch_size=16, optimizer="sgd", lr=0.1, momentum=0.0,
                        schedule="constant")


def test_every_algorithm_runs_on_some_engine():
  assert {case.values[0] if hasattr(case, "values") else case[0]
          for case in CASES} == set(ALGORITHMS)


@pytest.mark.parametrize("name,engine", CASES)
def test_common(name, engine):
  config = _config(name, engine)
  first = make_engine(config)
  try:
    _check(name, engine, config, first)
  finally:
    first.close()


def _check(name, engine, config, first):
  initial = first.init(jax.random.key(0))
  state, history = train(first, STEPS)

  # learns: the loss falls well below its start (ln 10 = 2.30 at chance)
  start, end = history[0]["loss"], np.mean([h["loss"] for h in history[-5:]])
  assert end < 0.5 * start, (start, end)

  # keeps its structure: same tree, shapes and dtypes as at initialization
  chex.assert_trees_all_equal_shapes_and_dtypes(state, initial)

  # deterministic: a second engine from the same key gives the same bits (a
  # real engine's order is whatever happened: its trace replays instead,
  # tests/engines/test_ray.py)
  if ENGINES.get(engine).deterministic:
    again, _ = train(make_engine(config), STEPS)
    chex.assert_trees_all_equal(jax.device_get(state), jax.device_get(again))

  # no recompilation: each jitted function compiled at most once (some serve
  # only schedules of other families)
  for jitted in first.jitted_functions():
    assert jitted._cache_size() <= 1, jitted

  # the evaluated model has the model's parameter structure
  params, _ = first.evaluated(state)
  chex.assert_trees_all_equal_shapes_and_dtypes(
      params, first.problem.init_model(jax.random.key(0))[0])
