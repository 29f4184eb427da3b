"""`jaxdl report DIR`: tables (markdown) and plots (PNG) of a comparison directory.

cells.py reads the cells' run directories, comparison.py splits and looks
them up, tables.py makes the markdown tables (prediction.py: the cost
model's of the ASU seed's strategies; findings.py: the grid's findings
judged by the cells' intervals over their seeds, intervals.py), jaxdl.plots
the PNG plots, and document.py writes both into report.md. A diverged run (jaxdl.runner.divergence)
has no figures: the tables say "diverged" in their place, the plots mark it
with an x.
"""
from __future__ import annotations

from jaxdl.errors import ConfigError  # noqa: F401  (a Report's refusal of a target)
from jaxdl.report.cells import ACCURACY, CellResult, load
from jaxdl.report.comparison import Comparison, metric_label
from jaxdl.report.document import REPORT, Report, ReportArgs
from jaxdl.report.prediction import prediction_note, prediction_table
from jaxdl.report.tables import DIVERGED, WAIT_NOTE, Tables, degradation

__all__ = ["ACCURACY", "DIVERGED", "REPORT", "WAIT_NOTE", "CellResult",
           "Comparison", "Report", "ReportArgs", "Tables", "degradation",
           "load", "metric_label", "prediction_note", "prediction_table"]
