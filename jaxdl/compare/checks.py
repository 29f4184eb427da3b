"""The checks a comparison passes before any cell runs: its directory, and
every cell's config, refused in the words of the compare flag that set it."""
from __future__ import annotations

from pathlib import Path

from jaxdl import rundir
from jaxdl.algorithms import settings_owners
from jaxdl.compare.args import CompareArgs, sweeps
from jaxdl.compare.grid import Cell, Grid
from jaxdl.config import RUN_CONTROL_FIELDS, RunConfig
from jaxdl.errors import ConfigError
from jaxdl.validation import validate


def check_cells(grid: Grid, out: Path, args: CompareArgs | None = None) -> dict[str, str]:
  """Validates every cell's config before any runs; returns the cells that
  cannot run, with why. An error in a shared setting is raised: no cell could
  run. With `args` (the command line's), the first bad cell is raised too,
  named by compare's own flag."""
  cell_fields = {"algorithm", "workers", "network", *settings_owners()}
  invalid = {}
  for cell in grid.cells():
    try:
      validate(grid.config(cell, out))
    except ConfigError as e:
      if args is not None:
        raise _own_flag(e, cell, args) from None
      if e.field not in cell_fields and e.field not in cell.overrides:
        raise
      invalid[cell.name] = f"ConfigError: {e}"
  return invalid


def _own_flag(error: ConfigError, cell: Cell, args: CompareArgs) -> ConfigError:
  """`error`, raised by the `jaxdl run` config of `cell`, restated with the
  `jaxdl compare` flag that put the bad value there."""
  where = f"{error.allowed} (cell {cell.name})"
  if error.field == "algorithm":
    return ConfigError("algorithms", cell.variant, where)
  if error.field == "workers":
    return ConfigError("workers", cell.workers, where)
  if error.field == "network":
    return ConfigError("timing_networks" if cell.timing else "networks", cell.network, where)
  setting = error.field in dict(cell.overrides) and error.field not in ("out", "dry_run")
  if setting:  # one of the cell's settings: from a sweep, or from the variant's label
    swept = next((s for s in sweeps(args) if s.field == error.field), None)
    if swept is not None and swept.index(error.value) is not None:
      return swept.refusal_of(error.value, where)
    if args.algorithms is None and args.experiment:
      return ConfigError("experiment", args.experiment, f"{error} (cell {cell.name})")
    return ConfigError("algorithms", cell.variant, f"{error} (cell {cell.name})")
  return error  # a shared `jaxdl run` flag, which compare takes as it is


def check_out(out: Path) -> None:
  """Refuses a comparison directory that cannot be written or that is a
  single run's directory; leaves nothing."""
  rundir.check_writable(out)
  single = [name for name in (rundir.CONFIG, rundir.SUMMARY) if (out / name).exists()]
  if single:
    raise ConfigError("out", str(out), f"a comparison directory, not a run directory "
                      f"(it holds {single[0]}); use a new or empty directory")


def check_existing(grid: Grid, cells: list[Cell], out: Path) -> None:
  """A finished cell is skipped only if it ran this cell's config."""
  for cell in cells:
    stored_path = out / cell.name / "config.json"
    if not stored_path.exists():
      continue
    stored = RunConfig.load(str(stored_path)).flat()
    for field, value in grid.config(cell, out).flat().items():
      if field not in RUN_CONTROL_FIELDS and stored.get(field) != value:
        raise ConfigError("out", str(out), f"a new directory or one holding this comparison "
                          f"(cell {cell.name} has {field}={stored.get(field)!r}, not {value!r}); "
                          "--overwrite replaces it")
