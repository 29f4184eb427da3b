"""`jaxdl compare`'s command line: its flags, and the grid they make of a
named or loaded one (the `jaxdl run` flags it passes on to every cell included)."""
from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Annotated, Any

import tyro

from jaxdl import labels
from jaxdl.algorithms import ALGORITHMS, Collective, settings_owners
from jaxdl.build import TASK_FIELDS
from jaxdl.cluster import EMULATED, MODELLED, is_profile
from jaxdl.compare import sweep
from jaxdl.compare.grid import (PER_CELL, Grid, Variant, algorithms_of, has_setting, one_worker,
                                per_cell, section_fields)
from jaxdl.compare.grids import DEFAULT_GRID, GRID_DOCS, GRIDS, load_experiment
from jaxdl.config import TASK_PREFIX, field_owner
from jaxdl.engines import ENGINES
from jaxdl.errors import ConfigError, flag
from jaxdl.validation import check_numbers


def _baselines() -> list[str]:
  """The registered one-worker baselines."""
  return [name for name in ALGORITHMS if one_worker(name)]


def _alias_help(name: str) -> str:
  field = sweep.ALIASES[name]
  owners = ", ".join(s.name for s in settings_owners()[field])
  return f"Alias of --sweep {field}=V1,V2,...: {owners} variants, one per value."


_GRID_HELP = ("The grid: " + " or ".join(
    f"{name} ({'the comparison above' if grid is DEFAULT_GRID else GRID_DOCS[name]})"
    for name, grid in GRIDS.items()) + ". The flags below override it.")
_ALGORITHMS_HELP = (
    "Variants: ALGORITHM (see `jaxdl list`), ALGORITHM_<symbol><value> (with a setting), "
    f"ALGORITHM_{labels.ASYNC_BN} (with --async-bn), e.g. the default grid's "
    f"{' '.join(v.label for v in DEFAULT_GRID.variants)}; a bare algorithm takes the values of "
    "--sweep.")
_WORKERS_HELP = (f"Worker counts ({', '.join(_baselines())}, the one-worker baseline, runs at "
                 "1 only: a grid of it alone needs 1 among them).")
_SWEEP_HELP = (
    "NAME=V1,V2,...: one variant per value of NAME, an algorithm's setting (see `jaxdl "
    "list`), for each variant whose algorithm has it, or a `jaxdl run` field (e.g. lr, seed, "
    "compress), for each variant but the one-worker baseline, which keeps the shared value "
    "(every table's reference). Repeatable: every combination, the first sweep varying "
    "slowest. A variant is named ALGORITHM_<symbol or name><value>... (e.g. _lr0.1). Values "
    "are read by the field's type, and checked as `jaxdl run` checks them.")


@dataclasses.dataclass(frozen=True)
class CompareArgs:
  """Run a grid of algorithms x workers x networks; each cell is a run directory
  under --out. Any `jaxdl run` flag (e.g. --epochs 3 --lr 0.1) sets a run setting
  that every cell shares. Finished cells are skipped, so rerunning the same
  command resumes an interrupted comparison; a failed cell is reported and the
  others go on (exit code 1 if any failed); a diverged cell is reported and
  shown as "diverged" in the tables (not an error: exit code 0). `jaxdl report
  DIR` redoes the tables and plots."""
  grid: Annotated[str, tyro.conf.arg(help=_GRID_HELP)] = "default"
  experiment: str | None = None
  """Python file that defines GRID = jaxdl.compare.Grid(...) (e.g. experiments/NAME.py), instead of --grid; the flags below override it."""
  algorithms: Annotated[tuple[str, ...] | None, tyro.conf.arg(help=_ALGORITHMS_HELP)] = None
  workers: Annotated[tuple[int, ...] | None, tyro.conf.arg(help=_WORKERS_HELP)] = None
  sweep: Annotated[tuple[str, ...], tyro.conf.UseAppendAction,
                   tyro.conf.arg(help=_SWEEP_HELP)] = ()
  staleness_bounds: Annotated[tuple[int, ...] | None,
                              tyro.conf.arg(help=_alias_help("staleness_bounds"))] = None
  communication_periods: Annotated[tuple[int, ...] | None,
                                   tyro.conf.arg(help=_alias_help("communication_periods"))] = None
  gossip_probabilities: Annotated[tuple[float, ...] | None,
                                  tyro.conf.arg(help=_alias_help("gossip_probabilities"))] = None
  networks: tuple[str, ...] | None = None
  """Networks of the training cells, e.g. 10gbps 1gbps."""
  timing_networks: tuple[str, ...] | None = None
  """Networks of the timing-only (--dry-run) cells, for speedup at other bandwidths."""
  seeds: tuple[int, ...] | None = None
  """Seeds, e.g. 0 1 2: every cell runs once per seed, each run a directory CELL-seedN; the tables give the mean over the seeds and its 95% interval (unset: one run per cell, with --seed)."""
  out: str = "runs/compare"
  """The comparison directory."""
  jobs: int = 0
  """Cells run at once, each in its own process (0: one per CPU core, at most 8)."""
  overwrite: bool = False
  """Delete the grid's cells in --out and run them all again."""
  target: float | None = None
  """Target of the time-to-target columns, in the task's metric: test accuracy, or test nats per char on a text dataset (unset: 95% of one-worker SGD's accuracy rounded down, or 105% of its nats rounded up)."""
  report: bool = True
  """Write report.md and the PNG plots into --out at the end."""
  progress: bool = True
  """Show a progress bar."""


def sweeps(args: CompareArgs) -> list[sweep.Sweep]:
  """The command line's sweeps: its aliases', then its --sweep's."""
  return sweep.given(args.sweep, {name: getattr(args, name) for name in sweep.ALIASES})


def description() -> str:
  """compare's --help text above its flags."""
  return (f"{inspect.cleandoc(CompareArgs.__doc__)}\n\nWith no flags: {GRID_DOCS['default']}."
          f"\n\n{passed_on()}")


def passed_on() -> str:
  """What compare's --help says of the `jaxdl run` flags."""
  shared = [flag(f) for f in field_owner() if f not in PER_CELL]
  cell = [f"{flag(f)} ({per_cell(f)})" for f in PER_CELL]
  return (f"Run flags passed on to every cell (see `jaxdl run --help`): {', '.join(shared)}; "
          "and each algorithm's settings (e.g. --dc-lambda), to the cells whose algorithm "
          f"has them. Set per cell, so refused here: {', '.join(cell)}.")


def named_grid(args: CompareArgs) -> Grid:
  """The grid that --grid or --experiment names."""
  if args.experiment is not None:
    if args.grid != CompareArgs.grid:
      raise ConfigError("grid", args.grid, f"its default ({CompareArgs.grid}) with "
                        "--experiment, which gives the grid")
    return load_experiment(args.experiment)
  if args.grid not in GRIDS:
    raise ConfigError("grid", args.grid, "one of " + ", ".join(GRIDS))
  return GRIDS[args.grid]


def apply_args(grid: Grid, args: CompareArgs, run_flags: dict[str, Any]) -> Grid:
  """The grid with the command line's choices: `args`, then the shared run flags."""
  for field, value in run_flags.items():
    if field in PER_CELL:
      raise ConfigError(field, value, f"set per cell by jaxdl compare; {per_cell(field)}")
  check_numbers(dataclasses.asdict(args), typing.get_type_hints(CompareArgs))
  for field in ("algorithms", "workers", "networks"):
    if getattr(args, field) == ():
      raise ConfigError(field, (), "one value or more")
  if args.algorithms is not None:
    grid = grid.replace(variants=tuple(Variant.parse(s) for s in args.algorithms))
  shared = section_fields(tuple(run_flags.items()))
  for field, value in run_flags.items():
    if field not in shared and not any(has_setting(v.algorithm, field) for v in grid.variants):
      raise ConfigError(field, value, f"a setting of an algorithm in the grid "
                        f"({algorithms_of(grid)})")
  if args.workers is not None:
    if min(args.workers) < 1:
      raise ConfigError("workers", args.workers, "worker counts >= 1")
    grid = grid.replace(workers=tuple(args.workers))
  _check_one_worker(grid)
  swept = sweeps(args)
  for s in swept:
    sweep.check_taken(grid, s, run_flags)
  grid = grid.with_sweeps([(s.field, s.values) for s in swept]) if swept else grid
  if args.seeds is not None:
    grid = _with_seeds(grid, args.seeds, run_flags, swept)
  if args.networks is not None:
    grid = grid.replace(networks=tuple(args.networks))
  if args.timing_networks is not None:
    grid = grid.replace(timing_networks=tuple(args.timing_networks))
  grid = grid.with_run(**run_flags) if run_flags else grid
  if run_flags.get("dataset", "").startswith(TASK_PREFIX):
    # a registered task brings its own data and model: the grid's give way
    grid = grid.replace(run=tuple((k, v) for k, v in grid.run
                                  if k not in TASK_FIELDS or k in run_flags))
  if is_profile(run_flags.get("cluster", "")) and "compute_time" not in run_flags:
    # a measured profile's compute time, not the default grid's
    grid = grid.replace(run=tuple((k, v) for k, v in grid.run if k != "compute_time"))
  return _on_real_devices(grid, args, run_flags) if grid.measured else grid


def _on_real_devices(grid: Grid, args: CompareArgs, run_flags: dict[str, Any]) -> Grid:
  """A grid of cells on real devices: the simulated cluster's flags refused,
  and its defaults dropped (but the compute times its workers emulate)."""
  engine = dict(grid.run)["engine"]
  for field, value in (("networks", args.networks), ("timing_networks", args.timing_networks),
                       ("jobs", args.jobs if args.jobs > 1 else None)):
    if value is not None:
      allowed = ("1 (or 0)" if field == "jobs" else "left unset") + (
          f" with --engine {engine}: its cells measure wall time on this machine"
          + (", one at a time" if field == "jobs" else ", with no simulated network"))
      raise ConfigError(field, value, allowed)
  # (the real engines emulate the compute times of an emulated grid, or of
  # a grid of synchronous algorithms; those given here are kept in any case)
  emulated = EMULATED if not ENGINES.get(engine).simulated and (grid.emulated or all(
      ALGORITHMS.get(v.algorithm).family is Collective for v in grid.variants)) else ()
  return grid.replace(run=tuple((k, v) for k, v in grid.run
                                if k not in MODELLED or k in run_flags or k in emulated))


def _with_seeds(grid: Grid, seeds: tuple[int, ...], run_flags: dict[str, Any],
                swept: list[sweep.Sweep]) -> Grid:
  """The grid run once per seed of --seeds, which gives every run's seed."""
  if "seed" in run_flags:
    raise ConfigError("seeds", seeds, "seeds without --seed beside them (each run's seed "
                      "is one of --seeds)")
  if any(s.field == "seed" for s in swept):
    raise ConfigError("seeds", seeds, "seeds without a sweep of seed beside them")
  return grid.with_seeds(seeds)


def _check_one_worker(grid: Grid) -> None:
  """Refuses a grid of one-worker baselines alone (sgd) at worker counts
  without 1: its cells would run at 1 worker, none at the counts asked for."""
  if all(one_worker(v.algorithm) for v in grid.variants) and 1 not in grid.workers:
    several = [name for name in ALGORITHMS if not one_worker(name)][:2]
    raise ConfigError("workers", grid.workers, f"1 for a grid of {algorithms_of(grid)} alone: "
                      "the one-worker baseline runs at 1 worker only (add a distributed "
                      f"algorithm, e.g. {' or '.join(several)}, to train at more)")
