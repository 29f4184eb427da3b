"""Which parametrized cases run by default and which with the slow ones.

The default run (`pytest -n 2`) keeps every property and covers every
algorithm and engine; where a property is checked over many cases (models,
algorithms, compressors), a representative few run by default and the rest
with `-m slow`, which CI runs too.
"""
from __future__ import annotations

from typing import Any, Iterable

import pytest


def slow(*values: Any, id: str | None = None):
  """One parametrized case that runs with the slow ones (`-m slow`)."""
  return pytest.param(*values, marks=pytest.mark.slow, id=id)


def default_first(cases: Iterable[Any], keep: int = 1) -> list:
  """`cases` with all but the first `keep` moved to the slow run.

  A case is a `pytest.param` (its id and marks kept), a tuple of a test's
  arguments (several argument names), or a value (one argument name; a value
  that is itself a tuple goes in a `pytest.param`)."""
  out = []
  for i, case in enumerate(cases):
    if i < keep:
      out.append(case)
    elif hasattr(case, "values") and hasattr(case, "marks"):
      out.append(pytest.param(*case.values, marks=[*case.marks, pytest.mark.slow], id=case.id))
    elif isinstance(case, tuple):
      out.append(pytest.param(*case, marks=pytest.mark.slow))
    else:
      out.append(pytest.param(case, marks=pytest.mark.slow))
  return out
