"""Every algorithm setting's allowed range, checked at its edges.

A setting declares its range where it is declared (`setting(...,
allowed=...)`, jaxdl.settings.Range); the edges tested are derived from
that declaration, for every registered algorithm, a script's included: a
value on an edge is accepted, the next one out is refused with a ConfigError
naming the setting. The built-in algorithms' ranges are checked against a
table written from the papers' definitions (REFERENCE.md), not from the code.
"""
from __future__ import annotations

import dataclasses

import pytest

from jaxdl.algorithms import ALGORITHMS
from jaxdl.errors import ConfigError
from jaxdl.settings import Range, allowed, base_type, field_types

PAPERS = {
    ("local_sgd", "communication_period"): "an integer >= 1",
    ("diloco", "inner_steps"): "an integer >= 1",
    ("diloco", "outer_optimizer"): "one of nesterov, sgd, adam",
    ("diloco", "outer_lr"): "a number > 0",
    ("diloco", "outer_momentum"): "a number in [0, 1)",
    ("ssp", "staleness_bound"): "an integer >= 0",
    ("dc_asgd", "dc_lambda"): "a number >= 0",
    ("dc_asgd", "dc_beta"): "a decay in [0, 1)",
    ("lc_asgd", "lc_lambda"): "a number >= 0",
    ("lc_asgd", "lc_max_delay"): "an integer >= 1",
    ("easgd", "communication_period"): "an integer >= 1",
    ("easgd", "elasticity"): "a number in [0, 1]",
    ("ad_psgd", "consensus_step"): "a step size in (0, 1]",
    ("gosgd", "gossip_probability"): "a probability in [0, 1]",
}
"""(algorithm, setting) -> the range its paper defines, as the refusal states it."""


def edges(valid: Range, kind: type) -> tuple[list, list]:
  """(values on the range's edges, values just outside them)."""
  if valid.choices:
    first = valid.choices[0]
    return list(valid.choices), ["", first.upper(), first + "x"]
  step = (lambda x: 1) if kind is int else (lambda x: 1e-6 * max(1.0, abs(x)))
  inside, outside = [], []
  for bound, is_open, sign in ((valid.low, valid.low_open, 1), (valid.high, valid.high_open, -1)):
    if bound is None:
      continue
    near = kind(bound + sign * step(bound)) if kind is int else bound + sign * step(bound)
    far = kind(bound - sign * step(bound)) if kind is int else bound - sign * step(bound)
    inside.append(near if is_open else kind(bound))
    outside.append(kind(bound) if is_open else far)
  return inside, outside


def _declared():
  """(algorithm, setting, its range, its type) of every registered setting."""
  for name in ALGORITHMS:
    cls = ALGORITHMS.get(name).settings
    for f in dataclasses.fields(cls):
      yield name, f.name, allowed(cls, f.name), base_type(field_types(cls)[f.name])


CASES = [(name, field, value, ok)
         for name, field, valid, kind in _declared() if valid is not None
         for ok, values in zip((True, False), edges(valid, kind))
         for value in values]


def test_every_setting_that_is_not_a_switch_declares_its_range():
  assert [(n, f) for n, f, valid, kind in _declared() if valid is None and kind is not bool] == []


def test_the_built_in_ranges_are_the_papers():
  papers = {name for name, _ in PAPERS}
  declared = {(n, f): valid.describe(kind) for n, f, valid, kind in _declared()
              if n in papers and valid is not None}
  assert set(declared) == set(PAPERS)
  for key, paper in PAPERS.items():
    assert declared[key].startswith(paper), (key, declared[key])


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
  kind = base_type(field_types(cls)[field])
  assert error.value.allowed == allowed(cls, field).describe(kind)


def test_the_edges_are_the_bounds_and_their_neighbours():
  assert edges(Range(0, 1, high_open=True), float) == ([0.0, 1 - 1e-6], [-1e-6, 1.0])
  assert edges(Range(1), int) == ([1], [0])
  assert edges(Range(0, low_open=True), float) == ([1e-6], [0.0])
