"""A grid run into a comparison directory: ``grid.json`` (the grid and its
cells), one run directory per cell, and ``cells.json`` (each cell's outcome),
resumed where it stopped."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from jaxdl import rundir
from jaxdl.build import resolve_task
from jaxdl.compare.args import CompareArgs
from jaxdl.compare.checks import check_cells, check_existing, check_out
from jaxdl.compare.grid import Cell, Grid
from jaxdl.compare.pool import default_jobs, outcome, run_cells
from jaxdl.compare.progress import Progress
from jaxdl.config import TASK_PREFIX, DataConfig, RunConfig
from jaxdl.data import CORPORA
from jaxdl.errors import ConfigError

GRID_FILE, CELLS_FILE = "grid.json", "cells.json"


def target_metric(grid: Grid) -> str:
  """The summary metric the grid's cells are compared on (jaxdl.task.Task)."""
  dataset = dict(grid.run).get("dataset", DataConfig.dataset)
  if dataset.startswith(TASK_PREFIX):
    return resolve_task(RunConfig.make(dataset=dataset), None)[1].target_metric
  return "test_nats_per_char" if dataset in CORPORA else "test_accuracy"


def run_grid(grid: Grid, out: str | Path, *, jobs: int | None = None,
             overwrite: bool = False, progress: bool = True,
             experiment: str | None = None,
             args: CompareArgs | None = None) -> dict[str, dict]:
  """Runs the grid's unfinished cells into `out`; returns cells.json's content.
  `experiment`: the file that defines the grid, loaded in each cell's process.
  `args`: the command line's, which makes any bad cell an error (check_cells)."""
  if jobs is not None and jobs < 0:
    raise ConfigError("jobs", jobs, "a number >= 0 (0: one per CPU core)")
  out = rundir.check_path("out", str(out))
  check_out(out)
  cells = grid.cells()
  invalid = check_cells(grid, out, args)  # a bad shared setting fails here, before any write
  with rundir.claimed(out):
    return _run_claimed(grid, cells, invalid, out, jobs, overwrite, progress, experiment)


def _run_claimed(grid: Grid, cells: list[Cell], invalid: dict[str, str], out: Path,
                 jobs: int | None, overwrite: bool, progress: bool,
                 experiment: str | None) -> dict[str, dict]:
  """run_grid's writing part, `out` held by this process."""
  if overwrite:
    for cell in cells:
      shutil.rmtree(out / cell.name, ignore_errors=True)
  check_existing(grid, cells, out)
  rundir.write_json(out / GRID_FILE, {"grid": grid.to_dict(),
                                      "cells": [dataclasses.asdict(c) for c in cells]})
  status, todo = _recorded(cells, out, invalid)
  rundir.write_json(out / CELLS_FILE, status)
  progress_bar = Progress(cells, todo, progress, failed=len(invalid))
  for name, error in invalid.items():
    progress_bar.bar.write(f"cell {name} failed: {error}")

  def finished(cell: Cell, result: dict) -> None:
    status[cell.name] = result
    progress_bar.finish(cell, result)
    rundir.write_json(out / CELLS_FILE, status)

  # Cells that measure wall time run one at a time.
  jobs = 1 if grid.measured else min(jobs or default_jobs(), max(1, len(todo)))
  try:
    run_cells(grid, todo, out, jobs, experiment, progress_bar.start, finished)
  finally:
    progress_bar.close()
  return {c.name: status[c.name] for c in cells if c.name in status}


def _recorded(cells: list[Cell], out: Path, invalid: dict[str, str]
              ) -> tuple[dict[str, dict], list[Cell]]:
  """The records of the cells that will not run (finished before, or
  invalid), and the cells to run."""
  status: dict[str, dict] = {}
  todo = []
  for cell in cells:
    summary_path = out / cell.name / "summary.json"
    if summary_path.exists():  # its record as the run that made it left it
      summary = json.loads(summary_path.read_text())
      status[cell.name] = {**outcome(summary), "seconds": summary.get("wall_time_s"),
                           "skipped": True}
    elif cell.name in invalid:
      status[cell.name] = {"status": "failed", "error": invalid[cell.name]}
    else:
      todo.append(cell)
  return status, todo
