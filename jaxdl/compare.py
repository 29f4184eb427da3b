"""`jaxdl compare`: a grid of runs (algorithms x workers x networks), one run
directory per cell under one comparison directory, run in parallel processes.

A grid is a frozen `Grid`: its `variants` (an algorithm with settings, named
like ``ssp_s3``, ``easgd_tau4``, ``gosgd_p0.1``), worker counts, networks and
the run flags every cell shares. `run_grid` runs the cells that have no
``summary.json`` yet (so an interrupted comparison resumes), records each
cell's outcome in ``cells.json`` (done, diverged or failed) and goes on past a
failed cell; a diverged cell is finished (its summary says where it diverged)
and is not run again. Besides the
training cells, each variant gets a *timing* cell per `timing_networks`
entry: a ``--dry-run`` of the same schedule on another network, which gives
its simulated throughput without the math.
"""
from __future__ import annotations

import atexit
import concurrent.futures as futures
import ctypes
import dataclasses
import importlib.machinery
import importlib.util
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import time
import traceback
import typing
from pathlib import Path
from typing import Any, Iterable

from jaxdl import labels, rundir
from jaxdl.cluster import EMULATED, MODELLED, is_profile
from jaxdl.config import RUN_CONTROL_FIELDS, RunConfig
from jaxdl.validation import check_numbers
from jaxdl.errors import ConfigError, flag
from jaxdl.shutdown import exit_within

GRID_FILE, CELLS_FILE = "grid.json", "cells.json"

@dataclasses.dataclass(frozen=True)
class Variant:
  """One column of a comparison: an algorithm with its settings (flat config
  fields: the algorithm's own settings, or async_bn)."""
  algorithm: str
  settings: tuple[tuple[str, Any], ...] = ()
  name: str | None = None
  """Default: the algorithm, then ``_<symbol><value>`` per setting (ssp_s3)."""

  @property
  def label(self) -> str:
    return self.name or labels.label(self.algorithm, self.settings)

  @classmethod
  def parse(cls, spec: str) -> Variant:
    """``ssp_s3`` -> Variant("ssp", (("staleness_bound", 3),)); ``asp_abn`` ->
    Variant("asp", (("async_bn", True),)); ``asp`` -> Variant("asp")."""
    return cls(*labels.parse(spec))


def _has_setting(algorithm: str, field: str) -> bool:
  from jaxdl.algorithms import ALGORITHMS
  return algorithm in ALGORITHMS and field in {
      f.name for f in dataclasses.fields(ALGORITHMS.get(algorithm).settings)}


def _one_worker(algorithm: str) -> bool:
  """A one-worker baseline (sgd): its cells run at one worker only."""
  from jaxdl.algorithms import ALGORITHMS
  return algorithm in ALGORITHMS and ALGORITHMS.get(algorithm).max_workers == 1


def section_fields(run: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
  """The shared run fields that are not an algorithm's settings."""
  from jaxdl.config import field_owner
  owner = field_owner()
  return {k: v for k, v in run if k in owner}


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid: a variant at a worker count on a network."""
  name: str
  variant: str
  algorithm: str
  workers: int
  network: str
  timing: bool
  overrides: dict[str, Any]
  """Flat RunConfig fields of this run, on top of the grid's `run`."""


# Shared run flags of the default grid: the mlp on digits, plain SGD updates at
# a rate that ASP with 16 workers survives (named: an algorithm's own recipe,
# diloco's adamw, does not replace it), and a simulated compute time
# (0.2 ms per batch) that puts the 10 Gb/s link near the compute/communication
# balance of IPDPS'21's ResNet-50 on Titan V (56 Gb/s then takes 5.6x less).
DEFAULT_RUN = (("dataset", "digits"), ("model", "mlp"), ("engine", "sim"),
               ("batch_size", 8), ("optimizer", "sgd"), ("lr", 0.05), ("momentum", 0.0),
               ("schedule", "constant"), ("epochs", 5.0), ("compute_time", 2e-4),
               ("jitter", 0.1), ("seed", 0))


@dataclasses.dataclass(frozen=True)
class Grid:
  """A comparison: variants x workers x networks, with shared run flags."""
  variants: tuple[Variant, ...]
  workers: tuple[int, ...] = (4, 8, 16)
  networks: tuple[str, ...] = ("10gbps",)
  timing_networks: tuple[str, ...] = ("56gbps",)
  """Networks of the timing-only (dry-run) cells: speedup at other bandwidths."""
  run: tuple[tuple[str, Any], ...] = DEFAULT_RUN
  """Flat `jaxdl run` fields shared by every cell."""
  emulated: bool = False
  """Whether its compute times (compute_time, jitter, stragglers) are its
  workers' on every engine: emulated on a real one (each worker slowed for
  real). Otherwise they are the simulated cluster's, which a real engine
  drops, but for a grid of synchronous algorithms, whose workers emulate them."""

  def replace(self, **changes: Any) -> Grid:
    return dataclasses.replace(self, **changes)

  def with_run(self, **flat: Any) -> Grid:
    """The grid with shared run fields added or replaced."""
    RunConfig.make(**flat)  # unknown names fail here, with the field named
    return self.replace(run=tuple({**dict(self.run), **flat}.items()))

  def with_setting(self, field: str, values: Iterable[Any]) -> Grid:
    """Each variant whose algorithm has the setting `field` becomes one
    variant per value."""
    out: list[Variant] = []
    for v in self.variants:
      if not _has_setting(v.algorithm, field):
        out.append(v)
        continue
      rest = tuple((k, x) for k, x in v.settings if k != field)
      for value in values:
        new = Variant(v.algorithm, ((field, value),) + rest)
        if new not in out:
          out.append(new)
    return self.replace(variants=tuple(out))

  @property
  def measured(self) -> bool:
    """Whether the cells run on real processes (--engine ray, mesh), whose
    time is measured: they have no simulated network and no timing cells."""
    return dict(self.run).get("engine", "sim") not in ("sim", "auto")

  def cells(self) -> list[Cell]:
    """Every cell, training cells first, in a fixed order (names are stable)."""
    labels = [v.label for v in self.variants]
    duplicates = {x for x in labels if labels.count(x) > 1}
    if duplicates:
      raise ConfigError("algorithms", sorted(duplicates)[0], "each variant once")
    many_networks = len(self.networks) > 1
    train, timing = [], []
    for v in self.variants:
      workers = (1,) if _one_worker(v.algorithm) else self.workers
      for m in workers:
        base = {**dict(v.settings), "algorithm": v.algorithm, "workers": m}
        for net in self.networks:
          name = f"{v.label}-m{m}" + (f"-{net}" if many_networks else "")
          train.append(Cell(name, v.label, v.algorithm, m, net, False,
                            base if self.measured else {**base, "network": net}))
        for net in () if self.measured else self.timing_networks:
          if net not in self.networks:
            timing.append(Cell(f"{v.label}-m{m}-{net}-timing", v.label, v.algorithm, m, net,
                               True, {**base, "network": net, "dry_run": True}))
    return train + timing

  def config(self, cell: Cell, out: Path) -> RunConfig:
    """The cell's run: the shared fields (shared settings only where the
    cell's algorithm has them), then the cell's own."""
    shared = {k: v for k, v in self.run
              if k in section_fields(self.run) or _has_setting(cell.algorithm, k)}
    return RunConfig.make(**{**shared, **cell.overrides, "out": str(out / cell.name),
                             "resume": True, "progress": False})


# IPDPS'21 Table III's columns (BSP, ASP, SSP s=3/10, EASGD tau=4/8, GoSGD
# p=1/0.1/0.01, AD-PSGD) and LC-ASGD Table 3's (SGD, SSGD, ASGD, DC-ASGD,
# LC-ASGD); AR-SGD stands for the all-reduce family. DC-ASGD is DC-ASGD-a at
# lambda0 = 2 (Zheng et al.'s CIFAR setting): DC-ASGD-c's lambda g*g*(w - w_bak)
# at lambda 0.04 is too small to matter with this model's gradients.
IPDPS21_VARIANTS = tuple(map(Variant.parse, (
    "bsp", "asp", "ssp_s3", "ssp_s10", "easgd_tau4", "easgd_tau8", "gosgd_p1", "gosgd_p0.1",
    "gosgd_p0.01", "ad_psgd")))
DC_ASGD_A = Variant("dc_asgd", (("dc_adaptive", True), ("dc_lambda", 2.0)), name="dc_asgd")
DEFAULT_GRID = Grid(variants=(Variant("sgd"), IPDPS21_VARIANTS[0], Variant("ar_sgd"),
                              *IPDPS21_VARIANTS[1:], DC_ASGD_A, Variant("lc_asgd")))

# The ASU seed's strategies on the mesh engine, a worker's batch the same in
# each: one device (sgd: every table's baseline), data parallel (2 workers),
# GPipe (2 stages, 4 micro-batches), model parallel (2 stages, 1) and tensor
# parallel (2 devices); the ViT, whose uniform blocks each cuts and splits.
_STAGES = (("parallelism", "pipeline"), ("stages", 2))
STRATEGY_VARIANTS = (
    Variant("sgd"), Variant("ar_sgd", name="data"),
    Variant("sgd", (*_STAGES, ("microbatches", 4)), name="gpipe"),
    Variant("sgd", (*_STAGES, ("microbatches", 1)), name="model"),
    Variant("sgd", (("parallelism", "tensor"), ("tensor_parallel", 2)), name="tensor"))
STRATEGIES_GRID = Grid(variants=STRATEGY_VARIANTS, workers=(2,), timing_networks=(), run=(
    ("dataset", "digits"), ("model", "vit"), ("engine", "mesh"), ("batch_size", 32),
    ("lr", 0.05), ("schedule", "constant"), ("epochs", 5.0), ("seed", 0)))
# Communicating less: synchronous (ar_sgd), asynchronous (asp), DiLoCo (an
# outer step every 8 inner steps, its outer Nesterov; plain SGD inside, as
# the grid's others), and messages compressed with error feedback (ar_sgd
# with top-k 1% and PowerSGD rank 2, asp's push with top-k 1%), at 4, 8 and
# 16 workers on a fast (56 Gb/s) and a slow (1 Gb/s) network; the default
# grid's task and compute time, 10 epochs.
COMMUNICATION_VARIANTS = (
    Variant("sgd"), Variant("ar_sgd"), Variant("asp"),
    Variant("diloco", (("inner_steps", 8),), name="diloco_h8"),
    Variant("ar_sgd", (("compress", "topk:0.01"),), name="ar_sgd_topk"),
    Variant("ar_sgd", (("compress", "powersgd:2"),), name="ar_sgd_powersgd"),
    Variant("asp", (("compress", "topk:0.01"),), name="asp_topk"))
COMMUNICATION_GRID = Grid(variants=COMMUNICATION_VARIANTS, networks=("56gbps", "1gbps"),
                          timing_networks=(), run=tuple({**dict(DEFAULT_RUN),
                                                         "epochs": 10.0}.items()))
# Communicating less without a server: GoSGD (p = 0.1) and AD-PSGD, whole
# and with compressed messages (top-k 1%, and 10% for GoSGD: differences
# from pairwise references, jaxdl.algorithms.pairwise), on the communication
# grid's task and networks; sgd sets the target. At 4 and 8 workers: each
# worker holds 2 M references, and compressed AD-PSGD, which exchanges after
# every step, took ~12 minutes a cell at 16 (--workers 16 runs it).
GOSSIP_VARIANTS = (
    Variant("sgd"), Variant("gosgd"),
    Variant("gosgd", (("compress", "topk:0.01"),), name="gosgd_topk"),
    Variant("gosgd", (("compress", "topk:0.1"),), name="gosgd_topk10"),
    Variant("ad_psgd"), Variant("ad_psgd", (("compress", "topk:0.01"),), name="ad_psgd_topk"))
GOSSIP_GRID = COMMUNICATION_GRID.replace(variants=GOSSIP_VARIANTS, workers=(4, 8))
GRIDS = {"default": DEFAULT_GRID, "strategies": STRATEGIES_GRID,
         "communication": COMMUNICATION_GRID, "gossip": GOSSIP_GRID}
"""The grids `jaxdl compare --grid NAME` runs."""


_LOADED: dict[str, Grid] = {}


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


def load_experiment(path: str) -> Grid:
  """The `GRID` that a Python file (e.g. experiments/ipdps21.py) defines; a
  file is run once per process (what it registers is registered once)."""
  key = str(rundir.check_path("experiment", path).resolve())
  if key in _LOADED:
    return _LOADED[key]
  if not Path(path).is_file():
    raise ConfigError("experiment", path, "a Python file that defines GRID")
  # Read as Python whatever its suffix (spec_from_file_location wants ".py").
  loader = importlib.machinery.SourceFileLoader("jaxdl_experiment", path)
  spec = importlib.util.spec_from_loader("jaxdl_experiment", loader)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # as an import does: a dataclass in it looks itself up
  try:
    spec.loader.exec_module(module)
  except ConfigError:
    raise
  except Exception as e:  # a syntax error, or any exception the file raises
    raise ConfigError("experiment", path, f"a file that runs: {_where(e, path)}") from None
  finally:
    del sys.modules[spec.name]
  grid = getattr(module, "GRID", None)
  if not isinstance(grid, Grid):
    raise ConfigError("experiment", path, "a file that defines GRID = jaxdl.compare.Grid(...)")
  _LOADED[key] = grid
  return grid


def _where(error: Exception, path: str) -> str:
  """``SyntaxError at line 3: '(' was never closed``: the error, and its line in `path`."""
  line = getattr(error, "lineno", None) if isinstance(error, SyntaxError) else None
  if line is None:
    here = [f.lineno for f in traceback.extract_tb(error.__traceback__)
            if Path(f.filename).resolve() == Path(path).resolve()]
    line = here[-1] if here else None
  message = (error.msg if isinstance(error, SyntaxError) else str(error)).splitlines()
  at = f" at line {line}" if line else ""
  return f"{type(error).__name__}{at}: {message[0] if message else ''}"


@dataclasses.dataclass(frozen=True)
class CompareArgs:
  """Run a grid of algorithms x workers x networks; each cell is a run directory
  under --out. Any `jaxdl run` flag (e.g. --epochs 3 --lr 0.1) sets a run setting
  that every cell shares. Finished cells are skipped, so rerunning the same
  command resumes an interrupted comparison; a failed cell is reported and the
  others go on (exit code 1 if any failed); a diverged cell is reported and
  shown as "diverged" in the tables (not an error: exit code 0). With no
  flags: a miniature IPDPS'21 + LC-ASGD comparison on digits (mlp, 5 epochs, sim engine, 10gbps; timing at
  56gbps): sgd (1 worker) and bsp, ar_sgd, asp, ssp_s3, ssp_s10, easgd_tau4,
  easgd_tau8, gosgd_p1, gosgd_p0.1, gosgd_p0.01, ad_psgd, dc_asgd (DC-ASGD-a,
  lambda0 2), lc_asgd at 4, 8 and 16 workers. `jaxdl report DIR` redoes the
  tables and plots."""
  grid: str = "default"
  """The grid: default (the miniature IPDPS'21 + LC-ASGD comparison above) or strategies (the ASU seed's: one device, data parallel on 2 workers, GPipe and model parallel on 2 stages, tensor parallel on 2 devices; the ViT on digits, --engine mesh, which needs 2 devices: on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=2) or communication (communicating less: ar_sgd, asp, diloco with H = 8, ar_sgd with top-k 1% and PowerSGD rank 2, asp with top-k 1%, at 4, 8, 16 workers on 56 and 1 Gb/s; --engine sim) or gossip (the same without a server: gosgd with p = 0.1, whole and with top-k 1% and 10%, ad_psgd, whole and with top-k 1%, at 4 and 8 workers). The flags below override it."""
  experiment: str | None = None
  """Python file that defines GRID = jaxdl.compare.Grid(...) (e.g. experiments/NAME.py), instead of --grid; the flags below override it."""
  algorithms: tuple[str, ...] | None = None
  """Variants, e.g. sgd bsp asp ssp_s3 easgd_tau8 gosgd_p0.1 ad_psgd (asp_abn: asp with --async-bn); a bare ssp, easgd, local_sgd or gosgd takes the values of the lists below."""
  workers: tuple[int, ...] | None = None
  """Worker counts (sgd, the one-worker baseline, runs at 1 only: a grid of sgd alone needs 1 among them)."""
  staleness_bounds: tuple[int, ...] | None = None
  """ssp variants, one per bound s."""
  communication_periods: tuple[int, ...] | None = None
  """easgd and local_sgd variants, one per period tau."""
  gossip_probabilities: tuple[float, ...] | None = None
  """gosgd variants, one per probability p."""
  networks: tuple[str, ...] | None = None
  """Networks of the training cells, e.g. 10gbps 1gbps."""
  timing_networks: tuple[str, ...] | None = None
  """Networks of the timing-only (--dry-run) cells, for speedup at other bandwidths."""
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


# Fields that the grid sets per cell: as shared run flags they would be overridden.
PER_CELL = {"algorithm": "--algorithms", "workers": "--workers", "network": "--networks",
            "dry_run": "--timing-networks", "out": "--out", "resume": "always on",
            "overwrite": "--overwrite", "progress": "--progress", "config": "--experiment"}


def _per_cell(field: str) -> str:
  """How compare sets a field that it sets per cell."""
  how = PER_CELL[field]
  return f"use {how}" if how.startswith("--") else how


def passed_on() -> str:
  """What compare's --help says of the `jaxdl run` flags."""
  from jaxdl.config import field_owner
  shared = [flag(f) for f in field_owner() if f not in PER_CELL]
  per_cell = [f"{flag(f)} ({_per_cell(f)})" for f in PER_CELL]
  return (f"Run flags passed on to every cell (see `jaxdl run --help`): {', '.join(shared)}; "
          "and each algorithm's settings (e.g. --dc-lambda), to the cells whose algorithm "
          f"has them. Set per cell, so refused here: {', '.join(per_cell)}.")


def apply_args(grid: Grid, args: CompareArgs, run_flags: dict[str, Any]) -> Grid:
  """The grid with the command line's choices: `args`, then the shared run flags."""
  for field, value in run_flags.items():
    if field in PER_CELL:
      raise ConfigError(field, value, f"set per cell by jaxdl compare; {_per_cell(field)}")
  check_numbers(dataclasses.asdict(args), typing.get_type_hints(CompareArgs))
  for field in ("algorithms", "workers", "networks"):
    if getattr(args, field) == ():
      raise ConfigError(field, (), "one value or more")
  if args.algorithms is not None:
    grid = grid.replace(variants=tuple(Variant.parse(s) for s in args.algorithms))
  shared = section_fields(tuple(run_flags.items()))
  for field, value in run_flags.items():
    if field not in shared and not any(_has_setting(v.algorithm, field)
                                       for v in grid.variants):
      raise ConfigError(field, value, "a setting of an algorithm in the grid ("
                        f"{_algorithms(grid)})")
  if args.workers is not None:
    if min(args.workers) < 1:
      raise ConfigError("workers", args.workers, "worker counts >= 1")
    grid = grid.replace(workers=tuple(args.workers))
  _check_one_worker(grid)
  for field, plural in _LIST_FLAGS.items():
    values = getattr(args, plural)
    if values is not None:
      _check_setting_list(grid, field, plural, values)
      grid = grid.with_setting(field, values)
  if args.networks is not None:
    grid = grid.replace(networks=tuple(args.networks))
  if args.timing_networks is not None:
    grid = grid.replace(timing_networks=tuple(args.timing_networks))
  grid = grid.with_run(**run_flags) if run_flags else grid
  if is_profile(run_flags.get("cluster", "")) and "compute_time" not in run_flags:
    # a measured profile's compute time, not the default grid's
    grid = grid.replace(run=tuple((k, v) for k, v in grid.run if k != "compute_time"))
  if grid.measured:  # the simulated cluster's defaults do not apply
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
    from jaxdl.algorithms import ALGORITHMS, Collective
    from jaxdl.engines import ENGINES
    emulated = EMULATED if not ENGINES.get(engine).simulated and (grid.emulated or all(
        ALGORITHMS.get(v.algorithm).shape is Collective for v in grid.variants)) else ()
    grid = grid.replace(run=tuple((k, v) for k, v in grid.run
                                  if k not in MODELLED or k in run_flags or k in emulated))
  return grid


def _check_one_worker(grid: Grid) -> None:
  """Refuses a grid of one-worker baselines alone (sgd) at worker counts
  without 1: its cells would run at 1 worker, none at the counts asked for."""
  if all(_one_worker(v.algorithm) for v in grid.variants) and 1 not in grid.workers:
    raise ConfigError("workers", grid.workers, f"1 for a grid of {_algorithms(grid)} alone: "
                      "the one-worker baseline runs at 1 worker only (add a distributed "
                      "algorithm, e.g. ar_sgd or asp, to train at more)")


def _check_setting_list(grid: Grid, field: str, plural: str, values: tuple) -> None:
  """Refuses an empty list of a setting's values, or one for a grid in
  which no algorithm has the setting (it would be ignored)."""
  from jaxdl.algorithms import settings_owners
  if not values:
    raise ConfigError(plural, values, "one value or more")
  if not any(_has_setting(v.algorithm, field) for v in grid.variants):
    owners = ", ".join(s.name for s in settings_owners()[field])
    raise ConfigError(plural, values, f"left unset: no algorithm in the grid "
                      f"({_algorithms(grid)}) has {flag(field)} ({owners} do)")


def _algorithms(grid: Grid) -> str:
  """The grid's algorithms, each once: "sgd, asp"."""
  return ", ".join(dict.fromkeys(v.algorithm for v in grid.variants))


def check_cells(grid: Grid, out: Path, args: CompareArgs | None = None) -> dict[str, str]:
  """Validates every cell's config before any runs; returns the cells that
  cannot run, with why. An error in a shared setting is raised: no cell could
  run. With `args` (the command line's), the first bad cell is raised too,
  named by compare's own flag."""
  from jaxdl.validation import validate
  from jaxdl.algorithms import settings_owners
  per_cell = {"algorithm", "workers", "network", *settings_owners()}
  invalid = {}
  for cell in grid.cells():
    try:
      validate(grid.config(cell, out))
    except ConfigError as e:
      if args is not None:
        raise _own_flag(e, cell, args) from None
      if e.field not in per_cell and e.field not in cell.overrides:
        raise
      invalid[cell.name] = f"ConfigError: {e}"
  return invalid


# compare's own flags for the per-cell fields they set.
_LIST_FLAGS = {"staleness_bound": "staleness_bounds",
               "communication_period": "communication_periods",
               "gossip_probability": "gossip_probabilities"}


def _own_flag(error: ConfigError, cell: Cell, args: CompareArgs | None) -> ConfigError:
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
  if setting:  # one of the cell's settings: from a list flag, or from the variant's label
    plural = _LIST_FLAGS.get(error.field)
    values = getattr(args, plural, None) if args and plural else None
    if values and error.value in values:
      return ConfigError(plural, error.value, where)
    if args is not None and args.algorithms is None and args.experiment:
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


# ----------------------------------------------------------------- execution


def _run_cell(config_dict: dict, experiment: str | None = None) -> dict:
  """Runs in a pool process: one cell, errors returned as text (a ConfigError
  does not survive pickling). The experiment file is loaded first, so the
  algorithms it registers exist in this process too."""
  from jaxdl.runner import run
  t0 = time.perf_counter()
  try:
    if experiment:
      load_experiment(experiment)
    summary = run(RunConfig.from_dict(config_dict))
  except _Stopped as stop:
    _exit(stop.code)
  except Exception as e:  # a failed cell is reported, the others go on
    return {"status": "failed", "error": f"{type(e).__name__}: {e}".splitlines()[0],
            "traceback": traceback.format_exc(), "seconds": time.perf_counter() - t0}
  return {**outcome(summary), "seconds": time.perf_counter() - t0}


def target_metric(grid: Grid) -> str:
  """The summary metric the grid's cells are compared on (jaxdl.task.Task)."""
  from jaxdl.config import TASK_PREFIX
  from jaxdl.data import CORPORA
  from jaxdl.build import resolve_task
  dataset = dict(grid.run).get("dataset", "digits")
  if dataset.startswith(TASK_PREFIX):
    return resolve_task(RunConfig.make(dataset=dataset), None)[1].target_metric
  return "test_nats_per_char" if dataset in CORPORA else "test_accuracy"


def outcome(summary: dict) -> dict:
  """A finished cell's record in cells.json: done, or diverged and where."""
  if summary.get("status") == "diverged":
    return {"status": "diverged", "divergence": summary.get("divergence")}
  metric = summary.get("target_metric", "test_accuracy")
  return {"status": "done", metric: summary.get(metric)}


# Seconds an interrupted cell has to stop cleanly before it is killed.
STOP_SECONDS = 5.0


def _worker_init(parent: int) -> None:
  # Several processes on one accelerator: none may take most of its memory.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  # Ctrl-C reaches the whole process group: compare's process alone decides
  # (_stop). SIGTERM ends the running cell and its process (_exit). If
  # compare's process dies, even by SIGKILL, the kernel kills this one
  # (Linux's parent-death signal).
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, _end_cell)
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass  # not Linux: an interrupt still stops the pool; a SIGKILL of compare does not
  if os.getppid() != parent:  # compare died before the signal was set
    os._exit(1)


class _Stopped(SystemExit):
  """compare's SIGTERM to a pool process: its cell stops unfinished."""


def _end_cell(signum, frame) -> None:
  # An asynchronous checkpoint the cell was writing dies with its process
  # (orbax logs its thread's error at shutdown): the next run resumes from the
  # last complete one. The pool itself may send SIGTERM again (as it finds
  # itself broken), once the process is ending: that one is ignored. The
  # cell's cleanup has STOP_SECONDS: a wait on orbax's threads that the
  # signal left stuck never ends.
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  exit_within(STOP_SECONDS, 128 + signum)
  logging.getLogger("absl").setLevel(logging.CRITICAL)
  raise _Stopped(128 + signum)


def _exit(code: int) -> None:
  """Ends a stopped cell's process, its atexit cleanup done, without going
  back to the pool's call queue: another pool process stopped while reading
  it may have taken a message's length and left its body, and a reader after
  it would take those bytes for the next length (a traceback, not a stop)."""
  atexit._run_exitfuncs()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def _stop(pool: futures.ProcessPoolExecutor) -> None:
  """Stops the pool's processes within STOP_SECONDS: their cells stay
  unfinished (the next run resumes them from their last checkpoint)."""
  processes = list((pool._processes or {}).values())  # no public handle before 3.14
  for process in processes:
    process.terminate()
  pool.shutdown(wait=False, cancel_futures=True)
  deadline = time.monotonic() + STOP_SECONDS
  for process in processes:
    process.join(max(0.0, deadline - time.monotonic()))
  for process in processes:
    if process.is_alive():  # busy in native code (a compilation) past the deadline
      process.kill()
      process.join()


def default_jobs() -> int:
  """One process per CPU core, at most 8."""
  return max(1, min(8, len(os.sched_getaffinity(0))))


def _check_existing(grid: Grid, cells: list[Cell], out: Path) -> None:
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
  if overwrite and out.exists():
    for cell in cells:
      shutil.rmtree(out / cell.name, ignore_errors=True)
  _check_existing(grid, cells, out)
  out.mkdir(parents=True, exist_ok=True)
  rundir.write_json(out / GRID_FILE, {"grid": _grid_dict(grid),
                                "cells": [dataclasses.asdict(c) for c in cells]})
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
  rundir.write_json(out / CELLS_FILE, status)
  progress_bar = _Progress(cells, todo, progress, failed=len(invalid))
  for name, error in invalid.items():
    progress_bar.bar.write(f"cell {name} failed: {error}")
  # Cells that measure wall time run one at a time.
  jobs = 1 if grid.measured else min(jobs or default_jobs(), max(1, len(todo)))
  queue, pool, running = list(todo), None, {}
  try:
    while queue or running:
      if pool is None:
        pool = futures.ProcessPoolExecutor(jobs, multiprocessing.get_context("spawn"),
                                           initializer=_worker_init, initargs=(os.getpid(),))
      while queue and len(running) < jobs:
        cell = queue.pop(0)
        running[pool.submit(_run_cell, grid.config(cell, out).to_dict(), experiment)] = cell
        progress_bar.start(cell)
      finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
      broken = False
      for future in finished:
        cell = running.pop(future)
        try:
          result = future.result()
        except futures.process.BrokenProcessPool:  # a process died: its cells fail
          result, broken = {"status": "failed", "error": "the worker process died"}, True
        status[cell.name] = result
        progress_bar.finish(cell, result)
        rundir.write_json(out / CELLS_FILE, status)
      if broken:  # a new pool for the rest
        pool.shutdown(cancel_futures=True)
        pool = None
  except BaseException:  # Ctrl-C, or SIGTERM through the CLI: no cell runs on
    if pool is not None:
      _stop(pool)
      pool = None
    raise
  finally:
    if pool is not None:  # its processes end as the caller goes on (the report)
      pool.shutdown(wait=False, cancel_futures=True)
    progress_bar.close()
  return {c.name: status[c.name] for c in cells if c.name in status}


class _Progress:
  """Cells done of all, failures, the running ones and the time left (a timing
  cell counts as 1/20 of a training cell)."""

  def __init__(self, cells: list[Cell], todo: list[Cell], enabled: bool, failed: int):
    from tqdm.auto import tqdm
    self.weight = {c.name: 0.05 if c.timing else 1.0 for c in cells}
    self.total, self.done = len(cells), len(cells) - len(todo)
    self.failed, self.running = failed, []
    self.bar = tqdm(total=round(sum(self.weight[c.name] for c in todo), 2), disable=not enabled,
                    desc="compare", dynamic_ncols=True,
                    bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
    self._show()

  def start(self, cell: Cell) -> None:
    self.running.append(cell.name)
    self._show()

  def finish(self, cell: Cell, result: dict) -> None:
    self.running.remove(cell.name)
    self.done += 1
    if result["status"] == "failed":
      self.failed += 1
      self.bar.write(f"cell {cell.name} failed: {result['error']}")
    elif result["status"] == "diverged":
      self.bar.write(f"cell {cell.name} diverged: {result['divergence']}")
    self.bar.update(self.weight[cell.name])
    self._show()

  def _show(self) -> None:
    failed = f", {self.failed} failed" if self.failed else ""
    self.bar.set_description_str(f"compare: {self.done}/{self.total} cells{failed}, running "
                                 f"{', '.join(self.running) or '-'};", refresh=True)

  def close(self) -> None:
    self.bar.close()


def _grid_dict(grid: Grid) -> dict:
  return {"variants": [{"name": v.label, "algorithm": v.algorithm,
                        "settings": dict(v.settings)} for v in grid.variants],
          "workers": list(grid.workers), "networks": list(grid.networks),
          "timing_networks": list(grid.timing_networks), "run": dict(grid.run)}

