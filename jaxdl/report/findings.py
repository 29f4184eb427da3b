"""The report's Findings section: each finding of the grid
(jaxdl.compare.findings) judged at each worker count by the two variants'
95% intervals over their seeds (intervals.separation).

  reproduced       the intervals are apart, the better variant's on the better side
  contradicted     they are apart the other way
  not separated    they overlap (or touch): the seeds' noise may hide a
                   difference; "(5 seeds advised)" where fewer than 5 ran
  one seed: not judged   a variant has a single run: no interval to judge by
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxdl.compare.findings import FIGURES, Finding
from jaxdl.report.cells import CellResult, error_of
from jaxdl.report.intervals import Interval, separation
from jaxdl.report.markdown import fmt, table

REPRODUCED, CONTRADICTED, NOT_SEPARATED = "reproduced", "contradicted", "not separated"
ONE_SEED = "one seed: not judged"
NO_FIGURE = "no figure: not judged"
ADVISED_SEEDS = 5  # fewer seeds than this, and overlapping intervals: more seeds advised

FINDINGS_NOTE = (
    "A finding is reproduced where the two variants' 95% intervals over the seeds are apart "
    "with the better variant on the better side, contradicted where they are apart the other "
    "way, not separated where they overlap (the seeds' noise may hide a difference either "
    f"way: {ADVISED_SEEDS} seeds or more advised), not judged with one seed (no interval) "
    "or where a variant has no figure (every run diverged, or none reached the target).")


@dataclasses.dataclass(frozen=True)
class Figure:
  """How the report computes one of FIGURES from a run, and reads it."""
  label: str
  value: Callable[[CellResult], float | None]
  spec: str
  higher_is_better: bool


def figure(report: Any, name: str) -> Figure:
  """The figure `name` (one of FIGURES) of `report`'s runs (a jaxdl.report.Tables)."""
  figures = {
      "metric": Figure(report.label, lambda r: r.score, ".4f", report.higher),
      "error": Figure(report.error_label.lower(), error_of, ".2f", False),
      "loss": Figure("test loss", lambda r: None if r.diverged else r.summary.get("test_loss"),
                     ".4f", False),
      "time_to_target": Figure(f"time to {report.target:.2f} (s)",
                               lambda r: r.time_to(report.target), ".4g", False),
      "samples_per_s": Figure("samples/s", lambda r: r.throughput, ",.0f", True)}
  assert set(figures) == set(FIGURES), "a figure of jaxdl.compare.findings without its function"
  return figures[name]


def verdict(better: Interval | None, worse: Interval | None, higher_is_better: bool) -> str:
  """Whether the intervals of the variant stated `better` and of the one
  stated `worse` show it (module docstring)."""
  if better is None or worse is None:
    return NO_FIGURE
  if min(better.n, worse.n) < 2:
    return ONE_SEED
  apart = separation(better, worse) * (1 if higher_is_better else -1)
  if apart:
    return REPRODUCED if apart > 0 else CONTRADICTED
  return NOT_SEPARATED + (f" ({ADVISED_SEEDS} seeds advised)"
                          if min(better.n, worse.n) < ADVISED_SEEDS else "")


def _workers(report: Any, finding: Finding, network: str) -> list[int]:
  """The worker counts a finding is judged at: its own, or those both variants ran at."""
  if finding.workers:
    return list(finding.workers)
  counts = [{c.workers for c in report.train if c.network == network and c.variant == v}
            for v in (finding.better, finding.worse)]
  return sorted(counts[0] & counts[1])


def findings_table(report: Any, network: str) -> str:
  """A row per finding and worker count: both variants' means ± intervals of
  the figure, the seeds each is over, and the verdict."""
  rows = []
  for finding in report.findings:
    shown = figure(report, finding.figure)
    for m in _workers(report, finding, network):
      better, worse = (Interval.of(shown.value(r) for r in report.runs(v, m, network))
                       for v in (finding.better, finding.worse))
      rows.append([finding.name, str(m), shown.label,
                   f"{finding.better}: {fmt(better, shown.spec)}",
                   f"{finding.worse}: {fmt(worse, shown.spec)}",
                   f"{better.n if better else 0} / {worse.n if worse else 0}",
                   verdict(better, worse, shown.higher_is_better)])
  return table(["finding", "workers", "figure", "better", "worse", "seeds", "verdict"], rows)
