"""Every algorithm setting's allowed range, checked at its edges.

The table is written from the papers' definitions (REFERENCE.md), not from
the code: a value on the edge is accepted, the next one out is refused with
a ConfigError naming the setting.
"""
from __future__ import annotations

import dataclasses

import pytest

from jaxdl.algorithms import ALGORITHMS
from jaxdl.errors import ConfigError

# algorithm: {setting: (values allowed at the edges, values just outside,
#                        how the refusal states the range)}
RANGES = {
    "local_sgd": {"communication_period": ([1], [0, -1], "an integer >= 1")},
    "diloco": {"inner_steps": ([1], [0, -1], "an integer >= 1"),
               "outer_optimizer": (["nesterov", "sgd", "adam"], ["adamw", "Nesterov", ""],
                                   "one of nesterov, sgd, adam"),
               "outer_lr": ([1e-9], [0.0, -0.7], "a number > 0"),
               "outer_momentum": ([0.0, 0.999], [1.0, -1e-6], "a number in [0, 1)")},
    "ssp": {"staleness_bound": ([0], [-1], "an integer >= 0")},
    "dc_asgd": {"dc_lambda": ([0.0], [-1e-6], "a number >= 0"),
                "dc_adaptive": ([False, True], [], None),
                "dc_beta": ([0.0, 0.999], [1.0, -1e-6], "a decay in [0, 1)")},
    "lc_asgd": {"lc_lambda": ([0.0], [-1e-6], "a number >= 0"),
                "lc_max_delay": ([None, 1], [0], "an integer >= 1")},
    "easgd": {"communication_period": ([1], [0], "an integer >= 1"),
              "elasticity": ([None, 0.0, 1.0], [-1e-6, 1.000001], "a number in [0, 1]")},
    "ad_psgd": {"consensus_step": ([1e-9, 1.0], [0.0, -0.05, 1.000001],
                                   "a step size in (0, 1]")},
    "gosgd": {"gossip_probability": ([0.0, 1.0], [-1e-6, 1.000001],
                                     "a probability in [0, 1]")},
}
CASES = [(name, field, value, ok)
         for name, fields in RANGES.items()
         for field, (good, bad, _) in fields.items()
         for ok, values in ((True, good), (False, bad))
         for value in values]


def test_the_table_covers_every_registered_setting():
  declared = {(name, f.name) for name in ALGORITHMS
              for f in dataclasses.fields(ALGORITHMS.get(name).settings)}
  tabled = {(name, field) for name, fields in RANGES.items() for field in fields}
  assert declared == tabled


@pytest.mark.parametrize("name,field,value,ok", CASES,
                         ids=[f"{n}-{f}={v}" for n, f, v, _ in CASES])
def test_a_setting_on_the_edge_is_taken_and_one_past_it_refused(name, field, value, ok):
  cls = ALGORITHMS.get(name).settings
  if ok:
    assert getattr(cls(**{field: value}), field) == value
    return
  with pytest.raises(ConfigError) as error:
    cls(**{field: value})
  assert (error.value.field, error.value.value) == (field, value)
  assert str(error.value).startswith(f"--{field.replace('_', '-')}=")
  assert error.value.allowed.startswith(RANGES[name][field][2])
