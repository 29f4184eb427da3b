"""`jaxdl report DIR`'s document: report.md (the tables, then the PNG plots,
jaxdl.plots) written into the comparison directory."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import tyro

from jaxdl.plots import write_all
from jaxdl.report.tables import Tables

REPORT = "report.md"


@dataclasses.dataclass(frozen=True)
class ReportArgs:
  """Write report.md and PNG plots of a comparison directory (from jaxdl compare)
  into it, and print the tables."""
  dir: tyro.conf.Positional[str]
  """The comparison directory."""
  target: float | None = None
  """Target of the time-to-target columns, in the task's metric (unset: 95% of one-worker SGD's accuracy rounded down, or 105% of its loss rounded up)."""


class Report(Tables):
  """Tables and plots of one comparison directory."""

  def write(self) -> Path:
    """Writes report.md and the PNG plots into the directory; returns report.md."""
    written = write_all(self, self.directory)
    engines = list(dict.fromkeys(c.summary["engine"] for c in self.train + self.timing
                                 if "engine" in c.summary))
    on = f", on the {' and '.join(engines)} engine{'s' * (len(engines) > 1)}" if engines else ""
    intro = (f"# Comparison: {self.directory.name}\n\n"
             f"{runs(len(self.train), 'training')}, {runs(len(self.timing), 'timing')}{on}. "
             "Time is simulated time for sim runs, wall time otherwise. "
             f"Metric: {self.label}. "
             "Degradation = (error − one-worker SGD's error) / SGD's error; speedup = "
             f"samples/s over one-worker SGD's on the same network; target {self.label} "
             f"{self.target:.2f}.\n\n")
    figures = "\n".join(f"![{p.stem}]({p.name})" for p in written)
    path = self.directory / REPORT
    path.write_text(intro + self.tables() + "\n### Plots\n\n" + figures + "\n")
    return path


def runs(n: int, kind: str) -> str:
  """'1 training run', '2 training runs'."""
  return f"{n} {kind} run{'s' * (n != 1)}"
