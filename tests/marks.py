"""Which parametrized cases run by default and which with the slow ones.

The default run (`pytest -n 2`) keeps every property and covers every
algorithm and engine; where a property is checked over many cases (models,
algorithms, compressors), a representative few run by default and the rest
with `-m slow`, which CI runs too.
"""
from __future__ import annotations

from typing import Any, Collection, Iterable

import pytest


def slow(*values: Any, id: str | None = None):
  """One parametrized case that runs with the slow ones (`-m slow`)."""
  return pytest.param(*values, marks=pytest.mark.slow, id=id)


def _in_slow_run(case):
  """`case` (a `pytest.param`, a tuple of a test's arguments, or one value;
  a value that is itself a tuple goes in a `pytest.param`) marked slow."""
  if hasattr(case, "values") and hasattr(case, "marks"):
    return pytest.param(*case.values, marks=[*case.marks, pytest.mark.slow], id=case.id)
  return pytest.param(*case, marks=pytest.mark.slow) if isinstance(case, tuple) else slow(case)


def default_first(cases: Iterable[Any], keep: int = 1) -> list:
  """`cases` with all but the first `keep` moved to the slow run (cases as
  `_in_slow_run` takes them)."""
  return [case if i < keep else _in_slow_run(case) for i, case in enumerate(cases)]


def default_only(cases: Iterable[Any], kept: Collection[Any]) -> list:
  """`cases` with those not in `kept` (values or tuples of arguments) moved
  to the slow run."""
  return [case if case in kept else _in_slow_run(case) for case in cases]
