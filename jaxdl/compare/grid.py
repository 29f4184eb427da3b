"""A comparison's grid: variants (an algorithm with settings) x worker counts x
networks, the run fields every cell shares, and the cells it expands to."""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, Iterable, Sequence

from jaxdl import labels
from jaxdl.algorithms import ALGORITHMS, settings_owners
from jaxdl.compare.findings import Finding, check_findings
from jaxdl.config import AlgorithmConfig, RunConfig, field_owner
from jaxdl.engines import ENGINES
from jaxdl.errors import ConfigError
from jaxdl.validation import SEED_LIMIT

# Fields that the grid sets per cell: as shared run flags they would be overridden.
PER_CELL = {"algorithm": "--algorithms", "workers": "--workers", "network": "--networks",
            "dry_run": "--timing-networks", "out": "--out", "resume": "always on",
            "overwrite": "--overwrite", "progress": "--progress", "config": "--experiment"}


# Shared run flags of the default grid, and of any grid that names none: the
# mlp on digits, plain SGD updates at a rate that ASP with 16 workers survives
# (named: an algorithm's own recipe, diloco's adamw, does not replace it), and
# a simulated compute time (0.2 ms per batch) that puts the 10 Gb/s link near
# the compute/communication balance of IPDPS'21's ResNet-50 on Titan V (56
# Gb/s then takes 5.6x less).
DEFAULT_RUN = (("dataset", "digits"), ("model", "mlp"), ("engine", "sim"),
               ("batch_size", 8), ("optimizer", "sgd"), ("lr", 0.05), ("momentum", 0.0),
               ("schedule", "constant"), ("epochs", 5.0), ("compute_time", 2e-4),
               ("jitter", 0.1), ("seed", 0))


def per_cell(field: str) -> str:
  """How compare sets a field that it sets per cell."""
  how = PER_CELL[field]
  return f"use {how}" if how.startswith("--") else how


@dataclasses.dataclass(frozen=True)
class Variant:
  """One column of a comparison: an algorithm with its settings (flat config
  fields: the algorithm's own settings, or run fields such as async_bn)."""
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


def has_setting(algorithm: str, field: str) -> bool:
  """Whether `algorithm` is registered and has the setting `field`."""
  return algorithm in ALGORITHMS and field in {
      f.name for f in dataclasses.fields(ALGORITHMS.get(algorithm).settings)}


def one_worker(algorithm: str) -> bool:
  """A one-worker baseline (sgd): its cells run at one worker only."""
  return algorithm in ALGORITHMS and ALGORITHMS.get(algorithm).max_workers == 1


def baseline() -> str:
  """The one-worker baseline that every table compares with: the first
  registered algorithm that runs on one worker only (sgd)."""
  return next(name for name in ALGORITHMS if one_worker(name))


def takes(algorithm: str, field: str) -> bool:
  """Whether a variant of `algorithm` is swept over `field`: an algorithm's
  setting, where the algorithm has it; a run field, unless the algorithm is
  the one-worker baseline, which keeps the shared value (every table's
  reference)."""
  if field in field_owner():
    return not one_worker(algorithm)
  return has_setting(algorithm, field)


def section_fields(run: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
  """The shared run fields that are not an algorithm's settings."""
  owner = field_owner()
  return {k: v for k, v in run if k in owner}


def algorithms_of(grid: Grid) -> str:
  """The grid's algorithms, each once: "sgd, asp"."""
  return ", ".join(dict.fromkeys(v.algorithm for v in grid.variants))


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
  seeds: tuple[int, ...] = ()
  """Seeds each cell runs with, a run directory each (CELL-seedN); the report
  gives their mean and its 95% interval. Empty: one run, with the run's seed."""
  findings: tuple[Finding, ...] = ()
  """What the grid's variants are expected to show (a paper's findings),
  which the report judges by the cells' intervals over the seeds."""

  def __post_init__(self):
    check_findings(self.findings, (v.label for v in self.variants))

  def replace(self, **changes: Any) -> Grid:
    """The grid with `changes`; new variants (--algorithms, a sweep) keep the
    findings about those of them that were there before, and drop the others."""
    if "variants" in changes and "findings" not in changes:
      labels = {v.label for v in changes["variants"]}
      changes["findings"] = tuple(f for f in self.findings if {f.better, f.worse} <= labels)
    return dataclasses.replace(self, **changes)

  def with_run(self, **flat: Any) -> Grid:
    """The grid with shared run fields (and settings, for the cells whose
    algorithm has them) added or replaced."""
    owner = field_owner()
    RunConfig.make(**{k: v for k, v in flat.items() if k in owner})  # a bad field fails here
    for field, value in flat.items():
      if field not in owner and field not in settings_owners():
        raise ConfigError(field, value, "not a config field; see `jaxdl run --help`")
    return self.replace(run=tuple({**dict(self.run), **flat}.items()))

  def with_seeds(self, seeds: Sequence[int]) -> Grid:
    """The grid with each cell run once per seed (distinct seeds, each >= 0)."""
    seeds = tuple(seeds)
    if not seeds:
      raise ConfigError("seeds", seeds, "one seed or more")
    if min(seeds) < 0 or max(seeds) >= SEED_LIMIT:
      raise ConfigError("seeds", seeds, "seeds in [0, 2**32), as --seed's")
    if len(set(seeds)) < len(seeds):
      raise ConfigError("seeds", seeds, "each seed once")
    return self.replace(seeds=seeds)

  def with_setting(self, field: str, values: Iterable[Any]) -> Grid:
    """Each variant that takes `field` (`takes`) becomes one variant per value."""
    return self.with_sweeps(((field, tuple(values)),))

  def with_sweeps(self, sweeps: Sequence[tuple[str, Sequence[Any]]]) -> Grid:
    """Each variant becomes one variant per combination of the values of the
    sweeps (field, values) that it takes (`takes`), the first sweep's value
    varying slowest and named first; a variant that takes none is kept."""
    out: list[Variant] = []
    for v in self.variants:
      taken = [(field, values) for field, values in sweeps if takes(v.algorithm, field)]
      if not taken:
        out.append(v)
        continue
      fields = [field for field, _ in taken]
      rest = tuple((k, x) for k, x in v.settings if k not in fields)
      for combination in itertools.product(*(values for _, values in taken)):
        new = Variant(v.algorithm, tuple(zip(fields, combination)) + rest)
        if new not in out:
          out.append(new)
    return self.replace(variants=tuple(out))

  @property
  def measured(self) -> bool:
    """Whether the cells run on real processes (--engine ray, mesh), whose
    time is measured: they have no simulated network and no timing cells
    (--engine auto counts as simulated)."""
    engine = dict(self.run).get("engine", AlgorithmConfig.engine)
    return engine != AlgorithmConfig.engine and not (
        engine in ENGINES and ENGINES.get(engine).simulated)

  def cells(self) -> list[Cell]:
    """Every cell, training cells first, in a fixed order (names are stable)."""
    names = [v.label for v in self.variants]
    duplicates = {x for x in names if names.count(x) > 1}
    if duplicates:
      raise ConfigError("algorithms", sorted(duplicates)[0], "each variant once")
    many_networks = len(self.networks) > 1
    train, timing = [], []
    for v in self.variants:
      workers = (1,) if one_worker(v.algorithm) else self.workers
      for m in workers:
        base = {**dict(v.settings), "algorithm": v.algorithm, "workers": m}
        for net in self.networks:
          name = f"{v.label}-m{m}" + (f"-{net}" if many_networks else "")
          train += self._seeded(Cell(name, v.label, v.algorithm, m, net, False,
                                     base if self.measured else {**base, "network": net}))
        for net in () if self.measured else self.timing_networks:
          if net not in self.networks:
            timing += self._seeded(Cell(f"{v.label}-m{m}-{net}-timing", v.label, v.algorithm,
                                        m, net, True, {**base, "network": net, "dry_run": True}))
    return train + timing

  def _seeded(self, cell: Cell) -> list[Cell]:
    """The cell's runs: one per seed of `seeds` (CELL-seedN), or the cell itself."""
    return [dataclasses.replace(cell, name=f"{cell.name}-seed{s}",
                                overrides={**cell.overrides, "seed": s})
            for s in self.seeds] or [cell]

  def config(self, cell: Cell, out: Path) -> RunConfig:
    """The cell's run: the shared fields (shared settings only where the
    cell's algorithm has them), then the cell's own."""
    shared = {k: v for k, v in self.run
              if k in section_fields(self.run) or has_setting(cell.algorithm, k)}
    return RunConfig.make(**{**shared, **cell.overrides, "out": str(out / cell.name),
                             "resume": True, "progress": False})

  def to_dict(self) -> dict:
    """grid.json's record of the grid."""
    return {"variants": [{"name": v.label, "algorithm": v.algorithm,
                          "settings": dict(v.settings)} for v in self.variants],
            "workers": list(self.workers), "networks": list(self.networks),
            "timing_networks": list(self.timing_networks), "run": dict(self.run),
            **({"seeds": list(self.seeds)} if self.seeds else {}),
            **({"findings": [f.to_dict() for f in self.findings]} if self.findings else {})}
