"""A comparison directory's finished cells, split and looked up as the
report's tables and plots need them: training and timing cells, networks,
the one-worker baseline, the metric and its target."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Iterable

from jaxdl.compare.grid import baseline
from jaxdl.report.cells import ACCURACY, CellResult, grid_findings, load
from jaxdl.report.intervals import Interval, MeanCurve, mean_curve
from jaxdl.validation import check_target


def metric_label(metric: str) -> str:
  """test_nats_per_char -> test nats per char."""
  return metric.replace("_", " ")


class Comparison:
  """The finished cells of one comparison directory."""

  def __init__(self, directory: str | Path, target: float | None = None):
    self.directory = Path(directory)
    cells, self.status, self.skipped = load(self.directory)
    self.findings = grid_findings(self.directory)
    for name, why in self.skipped.items() if cells else ():  # (with none: the caller's error)
      print(f"warning: skipping cell {name}: its run files are unreadable ({why})",
            file=sys.stderr)
    self.train = [c for c in cells if not c.timing]
    self.timing = [c for c in cells if c.timing]
    first = (self.train or self.timing or [None])[0]
    self.metric = first.metric if first else ACCURACY
    self.higher = first.higher_is_better if first else True
    check_target(target, self.metric)
    self.networks = list(dict.fromkeys(c.network for c in self.train))
    self.main = self.networks[0] if self.networks else None
    if target is None:
      # the baseline's score (its mean over the seeds), else the best run's
      base = Interval.of(c.score for c in self.runs(self.baseline_variant, 1, self.main))
      pick = max if self.higher else min
      best = base.mean if base else pick(
          (c.score for c in self.train if c.score is not None), default=None)
      target = (0.0 if best is None else math.floor(0.95 * best * 100) / 100
                if self.higher else math.ceil(1.05 * best * 100) / 100)
    self.target = target

  @property
  def label(self) -> str:
    """The metric as the tables name it: test accuracy, test nats per char."""
    return metric_label(self.metric)

  @property
  def error_label(self) -> str:
    return "Test error %" if self.higher else metric_label(self.metric).capitalize()

  @property
  def baseline_variant(self) -> str:
    """The variant of the one-worker baseline (jaxdl.compare.grid.baseline)."""
    return baseline()

  def baseline(self, network: str | None, timing: bool = False) -> CellResult | None:
    """The one-worker baseline's first run on `network` (its first seed's)."""
    return next(iter(self.runs(self.baseline_variant, 1, network, timing)), None)

  def runs(self, variant: str, workers: int, network: str | None,
           timing: bool = False) -> list[CellResult]:
    """The runs of one cell, one per seed (one where its grid has one seed)."""
    pool = self.timing if timing else self.train
    return [c for c in pool if (c.variant, c.workers, c.network) == (variant, workers, network)]

  def cells(self, network: str) -> list[list[CellResult]]:
    """The training cells on `network`, in order, each as its runs over the seeds."""
    cells: dict[tuple[str, int], list[CellResult]] = {}
    for c in self.train:
      if c.network == network:
        cells.setdefault((c.variant, c.workers), []).append(c)
    return list(cells.values())

  @staticmethod
  def interval(values: Iterable[float | None]) -> Interval | None:
    """The mean of a cell's values over its seeds and its 95% interval (for
    jaxdl.plots, which jaxdl.report imports)."""
    return Interval.of(values)

  @staticmethod
  def mean_curve(runs: list[CellResult], x: str) -> MeanCurve | None:
    """The runs' mean learning curve against `x` ("time" or "epoch")."""
    return mean_curve([r.curve for r in runs], x)

  @staticmethod
  def same_seed(run: CellResult, runs: list[CellResult]) -> CellResult | None:
    """Of `runs` (another cell's), the one with `run`'s seed; a cell of one
    run is every run's match (a grid of one seed)."""
    if len(runs) == 1:
      return runs[0]
    return next((r for r in runs if r.seed == run.seed), None)

  def heterogeneous(self, network: str) -> list[CellResult]:
    """The cells whose workers' batch times were recorded (synchronous
    runs on the sim engine, or on the mesh or ray engine with workers of
    their own programs: each worker's per-batch distribution)."""
    return [c for c in self.train if c.network == network and not c.diverged
            and c.summary.get("batch_seconds_histogram")]

  def strategies(self, network: str) -> list[CellResult]:
    """The cells of a comparison of parallelisms (one of them pipelined or
    tensor parallel): those that ran on devices (the mesh engine's memory
    analysis)."""
    cells = [c for c in self.train if c.network == network
             and c.summary.get("memory_per_device_bytes")]
    split = any(c.summary.get("stages") or c.summary.get("tensor_parallel") for c in cells)
    return cells if split else []

  def failures(self) -> list[tuple[str, str]]:
    return [(name, s.get("error", "")) for name, s in self.status.items()
            if s.get("status") == "failed"]
