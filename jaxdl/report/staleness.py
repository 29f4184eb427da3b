"""The staleness distribution of a run's applied updates, from the histogram
its engine recorded (summary.json's ``staleness_histogram``: staleness ->
updates, jaxdl.trace.summarize), and the report's table of it, a row per
cell. The scaling table's mean / max cannot tell a point mass at M - 1 from
a spread whose mean is also M - 1; the standard deviation and percentiles can.
"""
from __future__ import annotations

import math
from typing import Mapping

from jaxdl.report.cells import CellResult
from jaxdl.report.intervals import Interval
from jaxdl.report.markdown import fmt, table

QUANTILES = (10, 50, 90)
"""The percentiles the table gives, in %."""

FIGURES = (("updates", ".0f"), ("mean", ".2f"), ("std", ".2f"),
           *((f"p{q}", ".1f") for q in QUANTILES), ("max", ".4g"))
"""A distribution's figures, in the table's order, each with its format."""


def distribution(histogram: Mapping[str | int, int]) -> dict[str, float] | None:
  """The figures of a staleness histogram (keys: staleness, as int or as
  summary.json's strings; values: updates): the updates counted, mean,
  standard deviation (over the updates: n in the denominator), percentiles
  p10, p50, p90 (nearest rank: the least staleness with at least q% of the
  updates at or below it) and max; None for an empty histogram."""
  counts = sorted((int(k), int(v)) for k, v in histogram.items() if int(v) > 0)
  n = sum(v for _, v in counts)
  if not n:
    return None
  mean = math.fsum(k * v for k, v in counts) / n
  figures = {"updates": float(n), "mean": mean,
             "std": math.sqrt(math.fsum(v * (k - mean) ** 2 for k, v in counts) / n)}
  for q in QUANTILES:
    rank, below = math.ceil(q * n / 100), 0
    for k, v in counts:
      below += v
      if below >= rank:
        figures[f"p{q}"] = float(k)
        break
  figures["max"] = float(counts[-1][0])
  return figures


def _of(run: CellResult) -> dict[str, float] | None:
  """A finished run's distribution; None for a diverged run or one without staleness."""
  histogram = run.summary.get("staleness_histogram")
  return None if run.diverged or not histogram else distribution(histogram)


def staleness_table(cells: list[list[CellResult]]) -> str:
  """A row per cell with staleness (each cell as its runs over the seeds):
  each figure of `distribution` as its mean over the seeds and its 95%
  interval; a seed's count where not every run has it. "" where no run has
  a staleness histogram."""
  rows = []
  for runs in cells:
    figures = [f for f in map(_of, runs) if f]
    if not figures:
      continue
    seeds = "" if len(runs) == 1 else (f"{len(figures)} of {len(runs)}"
                                       if len(figures) < len(runs) else str(len(runs)))
    rows.append([f"{runs[0].variant} ×{runs[0].workers}", seeds] + [
        fmt(Interval.of(f[name] for f in figures), spec) for name, spec in FIGURES])
  if not rows:
    return ""
  return table(["cell", "seeds", "updates", "mean", "std", *(f"p{q}" for q in QUANTILES),
                "max"], rows)
