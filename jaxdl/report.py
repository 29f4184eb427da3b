"""`jaxdl report DIR`: tables (markdown) and plots (PNG) of a comparison directory.

Reads each cell's ``config.json``, ``summary.json``, ``metrics.jsonl`` and,
for simulated runs, ``trace.jsonl`` (the simulated time of each step). The
cells are those of ``grid.json`` when `jaxdl compare` wrote one, else every
run directory in DIR. Time is simulated time for sim runs, wall time otherwise.

Definitions (the baseline is the one-worker ``sgd`` cell on the same network):
  degradation  = (error - baseline error) / baseline error, in %
  speedup      = samples per second / the baseline's samples per second
  time to target = first evaluation at or past the target (at or above it
                 for accuracy, at or below it for a loss such as nats per char)
  TTA speedup  = the baseline's time to target / the cell's

The metric is the task's target metric, from the cells' summaries: test
accuracy for image classification, test nats per character for a language
model. "Error" is 100 (1 - accuracy) %, or the metric itself when lower is
better.
  staleness    = server versions applied between a worker's pull and the
                 apply of its push (jaxdl.trace.summarize)

A diverged run (jaxdl.runner.divergence) has no figures: the tables say
"diverged" in their place, the plots mark it with an x.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import tyro

from jaxdl import labels, rundir, trace
from jaxdl.plots import ratio, write_all
from jaxdl.compare import CELLS_FILE, GRID_FILE
from jaxdl.config import FILE_RECORDS
from jaxdl.validation import check_target
from jaxdl.errors import ConfigError

BASELINE = "sgd"
ACCURACY = "test_accuracy"  # the target metric of runs that do not name one
REPORT = "report.md"


WAIT_NOTE = ("Wait is the time a worker is held by its algorithm's rule: at a synchronous "
             "step's barrier (at a parameter server, until the last gradient has arrived), "
             "by SSP's bound, or with a GoSGD push behind its last message still in flight. "
             "An asynchronous worker's own transfers, and their queueing on busy links, are "
             "not in it.")
"""The scaling table's note on what its wait column counts."""


@dataclasses.dataclass(frozen=True)
class ReportArgs:
  """Write report.md and PNG plots of a comparison directory (from jaxdl compare)
  into it, and print the tables."""
  dir: tyro.conf.Positional[str]
  """The comparison directory."""
  target: float | None = None
  """Target of the time-to-target columns, in the task's metric (unset: 95% of one-worker SGD's accuracy rounded down, or 105% of its loss rounded up)."""


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
                              points[-1] if points else None))
  return results, status, skipped


# -------------------------------------------------------------------- tables


def _fmt(x: float | None, spec: str = ".4f") -> str:
  return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


DIVERGED = "diverged"  # a diverged run's entry in every table, in place of a figure


def _error(c: CellResult | None) -> float | None:
  """Test error %, or the metric itself where lower is better (a loss)."""
  if c is None or c.score is None:
    return None
  return 100 * (1 - c.score) if c.higher_is_better else c.score


def _markdown(header: list[str], rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _variants(cells: list[CellResult]) -> list[str]:
  return list(dict.fromkeys(c.variant for c in cells))


def _workers(cells: list[CellResult]) -> list[int]:
  return sorted({c.workers for c in cells})


def metric_label(metric: str) -> str:
  """test_nats_per_char -> test nats per char."""
  return metric.replace("_", " ")


class Report:
  """Tables and plots of one comparison directory."""
  baseline_variant = BASELINE

  def __init__(self, directory: str | Path, target: float | None = None):
    self.directory = Path(directory)
    cells, self.status, self.skipped = load(self.directory)
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
    baseline = self.baseline(self.main)
    if target is None:
      finished = [c for c in self.train if c.score is not None]
      pick = max if self.higher else min
      best = (baseline if baseline and baseline.score is not None else
              pick(finished, key=lambda c: c.score, default=None))
      target = (0.0 if best is None else math.floor(0.95 * best.score * 100) / 100
                if self.higher else math.ceil(1.05 * best.score * 100) / 100)
    self.target = target

  @property
  def label(self) -> str:
    """The metric as the tables name it: test accuracy, test nats per char."""
    return metric_label(self.metric)

  @property
  def error_label(self) -> str:
    return "Test error %" if self.higher else metric_label(self.metric).capitalize()

  def baseline(self, network: str | None, timing: bool = False) -> CellResult | None:
    pool = self.timing if timing else self.train
    return next((c for c in pool if c.variant == BASELINE and c.workers == 1
                 and c.network == network), None)

  def _cell(self, variant: str, workers: int, network: str,
            timing: bool = False) -> CellResult | None:
    pool = self.timing if timing else self.train
    return next((c for c in pool if (c.variant, c.workers, c.network) ==
                 (variant, workers, network)), None)

  def metric_table(self, network: str) -> str:
    """IPDPS'21 Table III: the test metric, rows workers, columns algorithms."""
    cells = [c for c in self.train if c.network == network]
    variants = _variants(cells)
    rows = []
    for m in _workers(cells):
      row = [self._cell(v, m, network) for v in variants]
      if any(row):
        rows.append([str(m)] + [DIVERGED if c and c.diverged else _fmt(c and c.score)
                                for c in row])
    return _markdown(["workers"] + variants, rows)

  def error_table(self, network: str) -> str:
    """LC-ASGD Table 3: test error % (or a loss) and degradation against one-worker SGD."""
    cells = [c for c in self.train if c.network == network]
    base = self.baseline(network)
    base_error = _error(base)
    rows = []
    for m in _workers(cells):
      row = [str(m)]
      for v in _variants(cells):
        c = self._cell(v, m, network)
        if c is None or c.diverged:
          row.append(DIVERGED if c else "")
          continue
        error = _error(c)
        row.append(f"{error:.2f}" if c is base or not base_error else
                   f"{error:.2f} ({degradation(error, base_error):+.1f}%)")
      rows.append(row)
    return _markdown(["workers"] + _variants(cells), rows)

  def bn_error_table(self, network: str) -> str:
    """LC-ASGD Table 3's BN / Async-BN cells: test error % of each variant
    evaluated with its own batch-norm statistics and with the server's
    asynchronous ones (its ``_abn`` twin); "—" where one of the two is missing."""
    cells = [c for c in self.train if c.network == network]
    variants = list(dict.fromkeys(c.bn_variant for c in cells))
    rows = []
    for m in _workers(cells):
      row = [str(m)]
      for v in variants:
        pair = [next((c for c in cells if c.bn_variant == v and c.workers == m
                      and c.async_bn == abn), None) for abn in (False, True)]
        errors = [DIVERGED if c and c.diverged else _fmt(_error(c), ".2f") for c in pair]
        row.append("" if not any(pair) else " / ".join(errors))
      rows.append(row)
    return _markdown(["workers"] + variants, rows)

  def scaling_table(self, network: str) -> str:
    """Throughput speedup (here and on the timing networks), time to the
    target, waiting, staleness and bytes, one row per cell."""
    base = self.baseline(network)
    timing_nets = list(dict.fromkeys(c.network for c in self.timing if c.network != network))
    header = (["cell", "time (s)", "samples/s", "speedup"]
              + [f"speedup @{n}" for n in timing_nets]
              + [f"time to {self.target:.2f} (s)", "TTA speedup", "wait (% of time)",
                 "staleness mean/max", "bytes sent (MB)"])
    rows = []
    for c in (c for c in self.train if c.network == network):
      s = c.summary
      if c.diverged:  # none of its figures is a result
        rows.append([f"{c.variant} ×{c.workers}", f"{DIVERGED} at step "
                     f"{s.get('diverged_at_step')}"] + ["—"] * (len(header) - 2))
        continue
      row = [f"{c.variant} ×{c.workers}", _fmt(c.time_s, ".4g"), _fmt(c.throughput, ",.0f"),
             _fmt(ratio(c.throughput, base and base.throughput), ".2f")]
      for n in timing_nets:
        t, b = self._cell(c.variant, c.workers, n, True), self.baseline(n, True)
        row.append(_fmt(ratio(t and t.throughput, b and b.throughput), ".2f"))
      tta = c.time_to(self.target)
      wait = s.get("wait_s")
      wait_pct = (100 * sum(wait) / len(wait) / c.time_s if wait and c.time_s else None)
      stale = (f"{s['staleness_mean']:.2f} / {s['staleness_max']}"
               if s.get("staleness_mean") is not None else "—")
      mb = s.get("bytes_total")
      row += [_fmt(tta, ".4g"), _fmt(ratio(base and base.time_to(self.target), tta), ".2f"),
              _fmt(wait_pct, ".1f"), stale, _fmt(mb / 1e6 if mb is not None else None, ".1f")]
      rows.append(row)
    return _markdown(header, rows)

  def heterogeneous(self, network: str) -> list[CellResult]:
    """The cells whose workers' batch times were recorded (synchronous
    runs on the sim engine, or on the mesh or ray engine with workers of
    their own programs: each worker's per-batch distribution)."""
    return [c for c in self.train if c.network == network and not c.diverged
            and c.summary.get("batch_seconds_histogram")]

  def partition_table(self, network: str) -> str:
    """Time per epoch, idle fraction and each worker's batch seconds of the
    cells with recorded batch times (the Choi seed's comparison of
    partitions)."""
    rows = []
    for c in self.heterogeneous(network):
      s = c.summary
      epochs = s.get("epochs")
      time_s = s.get("trace_time_s", c.time_s)  # a real run's: its steps' alone
      per_epoch = time_s / epochs if time_s and epochs else None
      batches = " / ".join(f"{m:.3g} ± {d:.2g}" for m, d in zip(
          s["batch_seconds_per_worker"], s["batch_seconds_std"]))
      rows.append([f"{c.variant} ×{c.workers}", str(s.get("batch_sizes")),
                   _fmt(per_epoch, ".4g"), _fmt(100 * s["idle_fraction"], ".1f"), batches,
                   _fmt(c.score)])
    return _markdown(["cell", "batch sizes at step 0", "time per epoch (s)",
                      "idle (% of worker time)", "batch seconds per worker (mean ± std)",
                      self.label], rows)

  def strategies(self, network: str) -> list[CellResult]:
    """The cells of a comparison of parallelisms (one of them pipelined or
    tensor parallel): those that ran on devices (the mesh engine's memory
    analysis)."""
    cells = [c for c in self.train if c.network == network
             and c.summary.get("memory_per_device_bytes")]
    split = any(c.summary.get("stages") or c.summary.get("tensor_parallel") for c in cells)
    return cells if split else []

  def strategies_table(self, network: str) -> str:
    """The ASU seed's table: each cell's strategy, devices, global batch,
    samples/s, utilization (a pipeline's: each device's busy fraction, its
    measured bubble beside the ideal), memory per device, time per epoch,
    time to the target and cost (with --price-per-device-hour)."""
    rows = []
    for c in self.strategies(network):
      s = c.summary
      strategy = (f"pipeline, {s['stages']} stages x {s['microbatches']} micro-batches"
                  if s.get("stages") else f"tensor, {s['tensor_parallel']} devices a worker"
                  if s.get("tensor_parallel") else f"data, {c.workers} worker(s)")
      memory = s["memory_per_device_bytes"]
      mb = (memory["arguments"] + memory["temporaries"]) / 1e6
      busy = s.get("busy_fraction_per_device")
      bubble = (f"{100 * s['bubble_fraction_measured']:.0f} (ideal "
                f"{100 * s['bubble_fraction_ideal']:.0f})" if busy else "—")
      row = [c.variant, strategy, str(s.get("devices")), str(sum(s.get("batch_sizes") or [])),
             _fmt(c.throughput, ",.0f"),
             " / ".join(f"{100 * b:.0f}" for b in busy) if busy else "—", bubble,
             _fmt(mb, ".2f"), _fmt(s.get("seconds_per_epoch"), ".4g"),
             _fmt(c.time_to(self.target), ".4g"), _fmt(s.get("cost"), ".4g")]
      rows.append(row if not c.diverged else row[:4] + [DIVERGED] + ["—"] * 6)
    return _markdown(["cell", "strategy", "devices", "global batch", "samples/s",
                      "busy (% per device)", "bubble (%)",
                      "memory per device (MB: arguments + temporaries)", "time per epoch (s)",
                      f"time to {self.target:.2f} (s)", "cost"], rows)

  def staleness_notes(self, network: str) -> str:
    """What the staleness column counts, and the SSP cells whose bound never
    bound: no worker waited on it, or the parameters equal asp's bit for bit."""
    cells = [c for c in self.train if c.network == network and not c.diverged]
    if not any(c.summary.get("staleness_mean") is not None for c in cells):
      return ""
    lines = ["Staleness of an update is counted in server versions: the updates (of any "
             "worker) that the server applied between the worker's pull and the apply of "
             "its push. SSP's bound s counts a worker's iterations instead: a worker may start "
             "iteration c only once every worker has finished c − s, and waits until "
             "then; a bound that no worker reaches never binds."]
    for m in _workers(cells):
      same, idle = [], []
      for c in (c for c in cells if c.workers == m and c.algorithm == "ssp"):
        asp = self._cell("asp" + (f"_{labels.ASYNC_BN}" if c.async_bn else ""), m, network)
        fingerprint = c.summary.get("params_fingerprint")
        if asp and not asp.diverged and fingerprint and \
            asp.summary.get("params_fingerprint") == fingerprint:
          same.append(c)
        elif c.summary.get("wait_s") is not None and not any(c.summary["wait_s"]):
          idle.append(c)
      for group, why in ((same, "identical to asp (the same parameters fingerprint)"),
                         (idle, "no worker ever waited on it")):
        if group:
          lines.append(f"- {', '.join(c.variant for c in group)}: the staleness bound s "
                       f"never bound at {m} workers: {why}.")
    return "\n".join(lines)

  def failures(self) -> list[tuple[str, str]]:
    return [(name, s.get("error", "")) for name, s in self.status.items()
            if s.get("status") == "failed"]

  def tables(self) -> str:
    """Every table, as markdown (also what `jaxdl compare` prints)."""
    parts = []
    for net in self.networks:
      where = f" ({net})" if len(self.networks) > 1 else ""
      parts += [f"### {self.label.capitalize()}{where} (layout of IPDPS'21 Table III)",
                self.metric_table(net),
                f"### {self.error_label}, degradation against one-worker SGD{where} "
                "(layout of LC-ASGD Table 3)", self.error_table(net)]
      if any(c.async_bn for c in self.train if c.network == net):
        parts += [f"### {self.error_label}, BN / Async-BN{where} (LC-ASGD Table 3)",
                  self.bn_error_table(net)]
      parts += [f"### Speedup, time to target, waiting, staleness, bytes{where}",
                self.scaling_table(net), WAIT_NOTE]
      if self.heterogeneous(net):
        parts += [f"### Partitions of the global batch: time per epoch, idle workers{where} "
                  "(the Choi seed's comparison)", self.partition_table(net)]
      if self.strategies(net):
        parts += [f"### Parallelisms: throughput, memory, time and cost{where} (the ASU "
                  "seed's comparison)", self.strategies_table(net),
                  "### The ASU seed's strategies on 2× RTX 3070, predicted (timing only)",
                  prediction_table(), prediction_note()]
      notes = self.staleness_notes(net)
      parts += [notes] if notes else []
    diverged = [c for c in self.train + self.timing if c.diverged]
    if diverged:
      parts += ["### Diverged cells (stopped; no test figures)", "\n".join(
          f"- `{c.name}`: {c.summary.get('divergence', DIVERGED)}" for c in diverged)]
    failed = self.failures()
    if failed:
      parts += ["### Failed cells", "\n".join(f"- `{n}`: {e}" for n, e in failed)]
    return "\n\n".join(parts) + "\n"

  def write(self) -> Path:
    """Writes report.md and the PNG plots into the directory; returns report.md."""
    written = write_all(self, self.directory)
    engines = list(dict.fromkeys(c.summary["engine"] for c in self.train + self.timing
                                 if "engine" in c.summary))
    on = f", on the {' and '.join(engines)} engine{'s' * (len(engines) > 1)}" if engines else ""
    intro = (f"# Comparison: {self.directory.name}\n\n"
             f"{len(self.train)} training runs, {len(self.timing)} timing runs{on}. Time is "
             f"simulated time for sim runs, wall time otherwise. Metric: {self.label}. "
             "Degradation = (error − one-worker SGD's error) / SGD's error; speedup = "
             f"samples/s over one-worker SGD's on the same network; target {self.label} "
             f"{self.target:.2f}.\n\n")
    figures = "\n".join(f"![{p.stem}]({p.name})" for p in written)
    path = self.directory / REPORT
    path.write_text(intro + self.tables() + "\n### Plots\n\n" + figures + "\n")
    return path


def prediction_table() -> str:
  """The ASU seed's strategies, measured and predicted by the cost model
  (jaxdl.cluster.strategies): samples/s, ratios to one device, and the
  predicted ratio over the measured one."""
  from jaxdl.cluster import strategies
  rows = [[p.strategy.name, str(p.strategy.devices), str(p.strategy.batch),
           _fmt(p.strategy.measured, ",.0f"), _fmt(p.predicted, ",.0f"),
           _fmt(p.measured_ratio, ".2f"), _fmt(p.predicted_ratio, ".2f"), _fmt(p.closeness, ".2f")]
          for p in strategies.asu_predictions()]
  return _markdown(["strategy", "devices", "global batch", "seed samples/s",
                    "predicted samples/s", "seed ratio to one device",
                    "predicted ratio to one device", "predicted / seed ratio"], rows)


def prediction_note() -> str:
  """What the prediction table's model includes, the order it gives the
  strategies and how close its ratios come to the seed's."""
  from jaxdl.cluster import strategies as st
  from jaxdl.cluster.cost import DEFAULT_UTILIZATION, DEVICE_PROFILES
  predicted = st.asu_predictions()
  pieces = st.piece_costs(*st.ASU_MODEL)
  devices = st.Devices.of(st.ASU_PROFILE)
  first = st.stage_shares(pieces, 2)[0]
  order = lambda key: " > ".join(p.strategy.name for p in sorted(
      (p for p in predicted if key(p) is not None), key=key, reverse=True))
  measured_order = order(lambda p: p.strategy.measured)
  predicted_order = order(lambda p: p.predicted if p.strategy.measured else None)
  close = "; ".join(f"{p.strategy.name} {p.predicted_ratio:.2f} against {p.measured_ratio:.2f} "
                    f"(× {p.closeness:.2f})" for p in predicted[1:] if p.closeness)
  return (
      f"From XLA's FLOP counts of {st.ASU_MODEL[0]}'s pieces ({st.ASU_MODEL[3]} stem, "
      f"{'x'.join(map(str, st.ASU_MODEL[1]))} inputs, {st.ASU_MODEL[2]} classes) on "
      f"{st.ASU_PROFILE} devices at {DEFAULT_UTILIZATION:.0%} of their "
      f"{DEVICE_PROFILES[st.ASU_PROFILE] / 1e12:g} TFLOP/s, joined by a link of "
      f"{devices.bandwidth / 1e9:g} GB/s and {devices.latency * 1e6:g} µs a message: one "
      "device runs a batch's forward and backward; data parallel adds a ring all-reduce of "
      f"the {st.BYTES_PER_FLOAT * sum(p.params for p in pieces) / 1e6:.1f} MB gradient; the "
      "pipelines cut the pieces by parameter count, as jaxdl's pipeline does (the first stage "
      f"holds {first[0]:.0%} of the parameters and {first[1]:.0%} of the training FLOPs), "
      "recompute each stage's forward in its backward, move each micro-batch's activations "
      "across the boundary, and run the 2(m + p − 1) slots in lock step, the slowest stage "
      "setting each; model parallel is the same with one micro-batch. The model orders the "
      f"measured strategies {predicted_order}, the seed {measured_order}. Predicted ratios "
      f"to one device against the seed's: {close}. Not modelled: the optimizer's update, "
      "input loading, a framework's own costs per operation or per copy.")


def degradation(error: float, base_error: float) -> float:
  """Relative increase of the test error over the baseline's, in %."""
  return 100 * (error - base_error) / base_error


