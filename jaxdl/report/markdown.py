"""Markdown tables, and the figures in them."""
from __future__ import annotations

import math


def fmt(x: float | None, spec: str = ".4f") -> str:
  """`x` formatted by `spec`; "—" for none (or NaN)."""
  return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(header: list[str], rows: list[list[str]]) -> str:
  """A markdown table of `rows` under `header`."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
