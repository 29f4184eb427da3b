"""Defaults that train: a parameter server's rule for its learning rate and
momentum at M workers, and an asynchronous default run at 8 workers."""
import dataclasses
import math

import pytest

import jaxdl
from jaxdl.algorithms import ALGORITHMS
from jaxdl.algorithms.asp import staleness_defaults
from jaxdl.config import OptimConfig, RunConfig
from jaxdl.optim import LR, MOMENTUM, with_defaults


def test_the_staleness_rule():
  assert staleness_defaults(1) == {"lr": LR, "momentum": MOMENTUM}
  four = staleness_defaults(4)
  assert four["lr"] == pytest.approx(LR / 2) and four["momentum"] == pytest.approx(0.15)
  assert staleness_defaults(16) == {"lr": pytest.approx(LR / 4), "momentum": 0.0}
  # the papers' parameter-server algorithms follow it; the other built-in ones do not
  for name in ("asp", "ssp", "dc_asgd", "lc_asgd"):
    assert ALGORITHMS.get(name).optim_defaults is staleness_defaults, name
  for name in ("sgd", "bsp", "ar_sgd", "easgd", "gosgd", "ad_psgd"):
    assert ALGORITHMS.get(name).optim_defaults is not staleness_defaults, name


def test_every_algorithms_defaults_are_optimizer_fields():
  """An algorithm's rule (any registered one's) fills only the optimizer
  section's fields, for every worker count."""
  fields = {f.name for f in dataclasses.fields(OptimConfig)}
  for name in ALGORITHMS:
    rule = ALGORITHMS.get(name).optim_defaults
    for workers in (1, 2, 7, 64):
      assert set(rule(workers) if rule else {}) <= fields, (name, workers)


def test_what_the_user_sets_is_kept():
  optim = RunConfig.make(lr=0.2).optim
  filled = with_defaults(optim, staleness_defaults(16))
  assert filled.lr == 0.2 and filled.momentum == 0.0
  assert with_defaults(RunConfig.make(momentum=0.5).optim).momentum == 0.5
  unset = with_defaults(RunConfig().optim)
  assert unset.lr == LR and math.isclose(unset.momentum, MOMENTUM)


def test_a_recipe_holds_for_its_own_optimizer_only():
  recipe = {"optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.1}
  unset = with_defaults(RunConfig().optim, recipe)
  assert (unset.optimizer, unset.lr, unset.weight_decay) == ("adamw", 3e-3, 0.1)
  named = with_defaults(RunConfig.make(optimizer="adamw", lr=1e-2).optim, recipe)
  assert (named.optimizer, named.lr, named.weight_decay) == ("adamw", 1e-2, 0.1)
  other = with_defaults(RunConfig.make(optimizer="sgd").optim, recipe)
  assert (other.optimizer, other.lr, other.momentum, other.weight_decay) == (
      "sgd", LR, MOMENTUM, 0.0)
  plain = with_defaults(RunConfig().optim)
  assert (plain.optimizer, plain.weight_decay) == ("sgd", 0.0)


# An 8-worker run of a full epoch, with the slow cases (asp learns by default
# in tests/algorithms/test_common.py).
@pytest.mark.slow
def test_asp_with_its_defaults_trains_at_8_workers(tmp_path):
  # With lr 0.05 and momentum 0.9 for every push it ended at 0.11 (diverged).
  summary = jaxdl.run(RunConfig.make(algorithm="asp", workers=8, progress=False,
                                     out=str(tmp_path / "asp")))
  assert summary["test_accuracy"] >= 0.85
