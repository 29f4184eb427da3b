"""Bytes each algorithm communicates per step (one global batch), as the
papers count their messages, against the figure the algorithm declares
(`bytes_per_step`, the summary's bytes_communicated_per_step).

P is one copy of the parameters, counted here by hand for the mlp on digits
(8x8 inputs, hidden 256 and 128, 10 classes, float32); M the workers.
"""
from __future__ import annotations

import pytest

from jaxdl.algorithms import ALGORITHMS
from jaxdl.config import RunConfig
from jaxdl.runner import setup

P = 4 * ((64 * 256 + 256) + (256 * 128 + 128) + (128 * 10 + 10))
M = 4
TAU, PROB = 3, 0.25
# Per step: a push and a pull per worker at a server; a ring all-reduce sends
# 2 (M - 1) / M of the model from each of M workers; local SGD and EASGD
# communicate every tau-th step, DiLoCo every H-th (H = tau here: one ring
# all-reduce of the model); GoSGD sends one model w.p. p per worker.
EXPECTED = {
    "sgd": (1, 0.0),
    "bsp": (M, 2 * M * P),
    "ar_sgd": (M, 2 * (M - 1) * P),
    "local_sgd": (M, 2 * (M - 1) * P / TAU),
    "diloco": (M, 2 * (M - 1) * P / TAU),
    "asp": (M, 2 * M * P),
    "ssp": (M, 2 * M * P),
    "dc_asgd": (M, 2 * M * P),
    "lc_asgd": (M, 2 * M * P),
    "easgd": (M, 2 * M * P / TAU),
    "gosgd": (M, M * P * PROB),
    "ad_psgd": (M, 2 * M * P),
}
SETTINGS = {"local_sgd": dict(communication_period=TAU), "diloco": dict(inner_steps=TAU),
            "easgd": dict(communication_period=TAU),
            "gosgd": dict(gossip_probability=PROB)}


def test_every_registered_algorithm_is_counted_here():
  assert sorted(EXPECTED) == sorted(ALGORITHMS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bytes_per_step_counts_the_papers_messages(name):
  workers, expected = EXPECTED[name]
  built = setup(RunConfig.make(model="mlp", algorithm=name, workers=workers, steps=1,
                               engine="sim", **SETTINGS.get(name, {})))
  assert built.problem.model_bytes() == P
  assert built.algorithm.bytes_per_step == pytest.approx(expected, rel=1e-12)
