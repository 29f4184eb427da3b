"""The finished runs of a comparison directory, as the report reads them.

Reads each cell's ``config.json``, ``summary.json``, ``metrics.jsonl`` and,
for simulated runs, ``trace.jsonl`` (the simulated time of each step). The
cells are those of ``grid.json`` when `jaxdl compare` wrote one, else every
run directory in DIR. Time is simulated time for sim runs, wall time otherwise.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from jaxdl import labels, rundir
from jaxdl.compare import CELLS_FILE, GRID_FILE
from jaxdl.compare.findings import Finding, read_findings
from jaxdl.config import FILE_RECORDS
from jaxdl.errors import ConfigError

ACCURACY = "test_accuracy"  # the target metric of runs that do not name one


@dataclasses.dataclass
class CellResult:
  """What the report needs of one run directory."""
  name: str
  variant: str
  workers: int
  network: str
  timing: bool
  summary: dict[str, Any]
  curve: list[dict[str, float]]
  """Evaluations: step, epoch, time (simulated or wall) and score (the metric)."""
  async_bn: bool = False
  """Evaluated with the server's asynchronous batch-norm statistics (--async-bn)."""
  algorithm: str = ""
  last: dict[str, float] | None = None
  """The last logged step, epoch and time (where a diverged run stopped)."""
  seed: int | None = None
  """Its run's seed: the runs of one cell over seeds differ in it alone."""

  @property
  def diverged(self) -> bool:
    """The run stopped because its training loss diverged (jaxdl.runner)."""
    return self.summary.get("status") == "diverged"

  @property
  def metric(self) -> str:
    """The summary's target metric (older runs: test accuracy)."""
    return self.summary.get("target_metric", ACCURACY)

  @property
  def higher_is_better(self) -> bool:
    return self.summary.get("higher_is_better", True)

  @property
  def score(self) -> float | None:
    """The final target metric; None for a diverged run."""
    return None if self.diverged else self.summary.get(self.metric)

  @property
  def simulated(self) -> bool:
    """Its times are simulated seconds (a sim run), not wall seconds."""
    return "simulated_time_s" in self.summary

  @property
  def bn_variant(self) -> str:
    """The variant without its Async-BN suffix: asp_abn -> asp."""
    suffix = "_" + labels.ASYNC_BN
    return self.variant[:-len(suffix)] if self.async_bn and self.variant.endswith(suffix) \
        else self.variant

  @property
  def time_s(self) -> float | None:
    return self.summary.get("simulated_time_s", self.summary.get("wall_time_s"))

  @property
  def throughput(self) -> float | None:
    """Samples per second; None for a diverged run (no result to compare to)."""
    t = self.time_s
    samples = self.summary.get("samples")
    return samples / t if t and samples and not self.diverged else None

  def time_to(self, target: float) -> float | None:
    if self.diverged:
      return None
    hit = rundir.first_reaching(self.curve, target, self.higher_is_better)
    return None if hit is None else hit["time"]


def error_of(c: CellResult | None) -> float | None:
  """Test error %, or the metric itself where lower is better (a loss)."""
  if c is None or c.score is None:
    return None
  return 100 * (1 - c.score) if c.higher_is_better else c.score


def _flat(path: Path) -> dict:
  """A run's config.json as flat fields (its settings included; not its records)."""
  d = {k: v for k, v in json.loads(path.read_text()).items() if k not in FILE_RECORDS}
  if not all(isinstance(v, dict) for v in d.values()):
    return d
  flat = {k: v for s in d.values() for k, v in s.items() if k != "settings"}
  return flat | dict(d.get("algorithm", {}).get("settings") or {})


def _comparison_file(directory: Path, name: str, what: str, valid) -> Any:
  """The content of a comparison's own file (grid.json, cells.json), refused
  (naming the directory) where it is not JSON or `valid(content)` is false."""
  try:
    content = json.loads((directory / name).read_text())
  except (OSError, ValueError) as e:
    why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
  else:
    if valid(content):
      return content
    why = f"it holds a JSON {type(content).__name__} of another layout"
  raise ConfigError("dir", str(directory), f"a comparison directory whose {name} is {what} "
                    f"({why}); rerunning its jaxdl compare writes it anew")


def _grid_cells(grid: Any) -> bool:
  """Whether grid.json's content lists its cells, each with a name and a variant."""
  cells = grid.get("cells") if isinstance(grid, dict) else None
  return isinstance(cells, list) and all(
      isinstance(c, dict) and isinstance(c.get("name"), str)
      and isinstance(c.get("variant"), str) for c in cells)


def load(directory: str | Path) -> tuple[list[CellResult], dict[str, dict], dict[str, str]]:
  """The finished cells of a comparison directory, every cell's status, and
  the cells skipped, with why (their run files are unreadable)."""
  directory = Path(directory)
  status = {}
  if (directory / CELLS_FILE).exists():
    status = _comparison_file(directory, CELLS_FILE, "an object of each cell's status",
                              lambda s: isinstance(s, dict) and all(
                                  isinstance(v, dict) and "status" in v for v in s.values()))
  if (directory / GRID_FILE).exists():
    grid = _comparison_file(directory, GRID_FILE, "the grid and its cells", _grid_cells)
    cells = [(c["name"], c["variant"]) for c in grid["cells"]]
  else:
    cells = [(p.name, None) for p in sorted(directory.iterdir())
             if (p / "config.json").exists()]
  results, skipped = [], {}
  for name, variant in cells:
    run = directory / name
    if not (run / "summary.json").exists():
      continue
    try:
      config = _flat(run / "config.json")
      summary = json.loads((run / "summary.json").read_text())
      if not isinstance(summary.get("samples"), (int, float)):  # as every run's summary has
        raise ValueError("summary.json has no samples count, as a finished run's has")
      workers = config["workers"]
      points = rundir.evaluations(run, summary, workers)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      # a corrupt cell (e.g. a summary.json cut short) costs that cell only
      skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      continue
    results.append(CellResult(name, variant or labels.config_label(config), workers,
                              config["network"], bool(config.get("dry_run")), summary,
                              [p for p in points if p["score"] is not None],
                              bool(config.get("async_bn")), config["algorithm"],
                              points[-1] if points else None, config.get("seed")))
  return results, status, skipped


def grid_findings(directory: str | Path) -> tuple[Finding, ...]:
  """The findings that the comparison's grid.json records (none without one,
  or in one written before grids recorded them), checked against its variants."""
  directory = Path(directory)
  if not (directory / GRID_FILE).exists():
    return ()
  grid = _comparison_file(directory, GRID_FILE, "the grid and its cells", _grid_cells)
  record = grid.get("grid")
  try:
    return read_findings(record.get("findings") if isinstance(record, dict) else None,
                         dict.fromkeys(c["variant"] for c in grid["cells"]))
  except ConfigError as e:
    raise ConfigError("dir", str(directory), f"a comparison directory whose {GRID_FILE} "
                      f"states findings the report can judge ({e.value!r} is not {e.allowed})"
                      ) from None
