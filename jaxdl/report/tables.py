"""The report's markdown tables of a comparison: the layouts of IPDPS'21
Table III and LC-ASGD Table 3, the scaling, partition and parallelism tables,
and the notes that explain them (what `jaxdl compare` prints).

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
"diverged" in their place.

A cell run over several seeds (`jaxdl compare --seeds`) shows each figure as
its mean over the seeds and its 95% interval (intervals.py), e.g.
``0.9731 ± 0.0042 (3 seeds)``, a ratio or degradation taken against the
baseline's run of the same seed; "(2 of 3 seeds)" where a run lacks the
figure (it diverged, or never reached the target). The partition and
parallelism tables give a per-worker (per-device) list as each element's
mean over the seeds.
"""
from __future__ import annotations

from typing import Callable

from jaxdl import labels
from jaxdl.algorithms import ALGORITHMS
from jaxdl.plots import ratio
from jaxdl.report.cells import CellResult, error_of
from jaxdl.report.comparison import Comparison
from jaxdl.report.findings import FINDINGS_NOTE, findings_table
from jaxdl.report.intervals import Interval
from jaxdl.report.markdown import fmt, table
from jaxdl.report.prediction import prediction_note, prediction_table
from jaxdl.report.staleness import staleness_table

RESUMED_NOTE = ("A real engine counts bytes, batch times and CPU seconds in the process "
                "that runs the steps: these cells' are those of the steps after the one they "
                "resumed from. Their waits, staleness, batches and trace time are the whole "
                "run's (from its trace), as are their accuracy, steps, wall time and "
                "samples/s.\n\n")
WAIT_NOTE = ("Wait is the time a worker is held by its algorithm's rule: at a synchronous "
             "step's barrier (at a parameter server, until the last gradient has arrived), "
             "by SSP's bound, or with a GoSGD push behind its last message still in flight. "
             "An asynchronous worker's own transfers, and their queueing on busy links, are "
             "not in it.")
"""The scaling table's note on what its wait column counts."""


DIVERGED = "diverged"  # a diverged run's entry in every table, in place of a figure


def _variants(cells: list[CellResult]) -> list[str]:
  return list(dict.fromkeys(c.variant for c in cells))


def _workers(cells: list[CellResult]) -> list[int]:
  return sorted({c.workers for c in cells})


def _reduces_to(algorithm: str) -> str | None:
  """The algorithm that `algorithm` runs as when its staleness bound never
  binds (AlgorithmSpec.reduces_to); None for one without such a bound, or
  not registered in this process."""
  return ALGORITHMS.get(algorithm).reduces_to if algorithm in ALGORITHMS else None


def degradation(error: float, base_error: float) -> float:
  """Relative increase of the test error over the baseline's, in %."""
  return 100 * (error - base_error) / base_error


def _seeds(runs: list[CellResult], interval: Interval | None) -> str:
  """How many of a cell's runs a figure is over, where not one of one:
  " (3 seeds)", " (2 of 3 seeds)" (the others without the figure)."""
  n = interval.n if interval else 0
  return "" if n == len(runs) == 1 or not n else (
      f" ({n} seeds)" if n == len(runs) else f" ({n} of {len(runs)} seeds)")


def _entry(runs: list[CellResult], value: Callable[[CellResult], float | None],
           spec: str = ".4f") -> str:
  """A cell's figure: `value` of each run, as its mean over the seeds and its
  95% interval; "diverged" where every run diverged, "—" where none has it."""
  if runs and all(r.diverged for r in runs):
    return DIVERGED
  interval = Interval.of(value(r) for r in runs)
  return fmt(interval, spec) + _seeds(runs, interval)


def per_element(runs: list[CellResult], values: Callable[[CellResult], list[float]],
                spec: str) -> str:
  """A per-worker (or per-device) list of the runs' as each element's mean
  over the runs and its 95% interval, joined by " / "."""
  return " / ".join(format(Interval.of(column), spec) for column in zip(*map(values, runs)))


def _megabytes(r: CellResult) -> float | None:
  """The bytes a run sent, in MB."""
  sent = r.summary.get("bytes_total")
  return None if r.diverged or sent is None else sent / 1e6


def _staleness(runs: list[CellResult]) -> str:
  """The staleness column: mean / max (each over the seeds), "—" where none has it."""
  finished = [r for r in runs if not r.diverged and r.summary.get("staleness_mean") is not None]
  if not finished:
    return "—"
  mean, worst = (_entry(runs, lambda r: r.summary[field] if r in finished else None, spec)
                 for field, spec in (("staleness_mean", ".2f"), ("staleness_max", ".4g")))
  return f"{mean} / {worst}"


class Tables(Comparison):
  """The markdown tables of one comparison directory."""

  def _base(self, run: CellResult, network: str, timing: bool = False) -> CellResult | None:
    """The one-worker baseline's run on `network` with `run`'s seed."""
    return self.same_seed(run, self.runs(self.baseline_variant, 1, network, timing))

  def metric_table(self, network: str) -> str:
    """IPDPS'21 Table III: the test metric, rows workers, columns algorithms."""
    cells = [c for c in self.train if c.network == network]
    variants = _variants(cells)
    rows = []
    for m in _workers(cells):
      row = [self.runs(v, m, network) for v in variants]
      if any(row):
        rows.append([str(m)] + [_entry(runs, lambda r: r.score) for runs in row])
    return table(["workers"] + variants, rows)

  def error_table(self, network: str) -> str:
    """LC-ASGD Table 3: test error % (or a loss) and degradation against one-worker SGD."""
    cells = [c for c in self.train if c.network == network]

    def degraded(r: CellResult) -> float | None:
      error, base_error = error_of(r), error_of(self._base(r, network))
      return degradation(error, base_error) if error is not None and base_error else None

    rows = []
    for m in _workers(cells):
      row = [str(m)]
      for v in _variants(cells):
        runs = self.runs(v, m, network)
        error = Interval.of(error_of(r) for r in runs)
        if error is None:
          row.append(DIVERGED if runs else "")
          continue
        change = (None if v == self.baseline_variant and m == 1 else
                  Interval.of(degraded(r) for r in runs))
        row.append(fmt(error, ".2f") + (f" ({fmt(change, '+.1f')}%)" if change else "")
                   + _seeds(runs, error))
      rows.append(row)
    return table(["workers"] + _variants(cells), rows)

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
        pair = [[c for c in cells if c.bn_variant == v and c.workers == m
                 and c.async_bn == abn] for abn in (False, True)]
        row.append("" if not any(pair) else " / ".join(_entry(runs, error_of, ".2f")
                                                       for runs in pair))
      rows.append(row)
    return table(["workers"] + variants, rows)

  def scaling_table(self, network: str) -> str:
    """Throughput speedup (here and on the timing networks), time to the
    target, waiting, staleness and bytes, one row per cell (each figure its
    mean over the cell's seeds, a ratio taken against the baseline's run of
    the same seed)."""
    timing_nets = list(dict.fromkeys(c.network for c in self.timing if c.network != network))
    header = (["cell", "time (s)", "samples/s", "speedup"]
              + [f"speedup @{n}" for n in timing_nets]
              + [f"time to {self.target:.2f} (s)", "TTA speedup", "wait (% of time)",
                 "staleness mean/max", "bytes sent (MB)"])
    rows = []
    for runs in self.cells(network):
      c = runs[0]
      if all(r.diverged for r in runs):  # none of its figures is a result
        steps = ", ".join(str(r.summary.get("diverged_at_step")) for r in runs)
        rows.append([f"{c.variant} ×{c.workers}", f"{DIVERGED} at step "
                     f"{steps}"] + ["—"] * (len(header) - 2))
        continue
      figures = [_entry(runs, value, spec)
                 for value, spec in self._scaling_figures(network, timing_nets)]
      rows.append([f"{c.variant} ×{c.workers}", *figures, _staleness(runs),
                   _entry(runs, _megabytes, ".1f")])
    return table(header, rows)

  def _scaling_figures(self, network: str, timing_nets: list[str]
                       ) -> list[tuple[Callable[[CellResult], float | None], str]]:
    """The scaling table's figures of a run, each with its format: time,
    samples/s, speedup, speedup @ each timing network, time to target, TTA
    speedup, wait % (a diverged run has none)."""
    def base(r: CellResult) -> CellResult | None:
      return self._base(r, network)

    def speedup_at(n: str) -> Callable[[CellResult], float | None]:
      def speedup(r: CellResult) -> float | None:
        t = self.same_seed(r, self.runs(r.variant, r.workers, n, True))
        b = self._base(r, n, True)
        return ratio(t and t.throughput, b and b.throughput)
      return speedup

    def wait_pct(r: CellResult) -> float | None:
      wait = r.summary.get("wait_s")
      return 100 * sum(wait) / len(wait) / r.time_s if wait and r.time_s else None

    def tta_speedup(r: CellResult) -> float | None:
      b = base(r)
      return ratio(b and b.time_to(self.target), r.time_to(self.target))

    return [(lambda r: None if r.diverged else r.time_s, ".4g"),
            (lambda r: r.throughput, ",.0f"),
            (lambda r: ratio(r.throughput, (b := base(r)) and b.throughput), ".2f"),
            *[(speedup_at(n), ".2f") for n in timing_nets],
            (lambda r: r.time_to(self.target), ".4g"), (tta_speedup, ".2f"),
            (lambda r: None if r.diverged else wait_pct(r), ".1f")]

  def _cells_of(self, picked: list[CellResult]) -> list[list[CellResult]]:
    """The cells of the runs `picked`, in order, each as all its runs over the seeds."""
    keys = dict.fromkeys((c.variant, c.workers, c.network) for c in picked)
    return [self.runs(*key) for key in keys]

  def partition_table(self, network: str) -> str:
    """Time per epoch, idle fraction and each worker's batch seconds of the
    cells with recorded batch times (the Choi seed's comparison of
    partitions), a row per cell (each figure its mean over the seeds)."""
    def per_epoch(r: CellResult) -> float | None:
      epochs = r.summary.get("epochs")
      time_s = r.summary.get("trace_time_s", r.time_s)  # a real run's: its steps' alone
      return time_s / epochs if time_s and epochs and not r.diverged else None

    cells = self._cells_of(self.heterogeneous(network))
    several = any(len(runs) > 1 for runs in cells)
    rows = []
    for runs in cells:
      timed = [r for r in runs if not r.diverged and r.summary.get("batch_seconds_histogram")]
      c = timed[0]
      batches = (per_element(timed, lambda r: r.summary["batch_seconds_per_worker"], ".3g")
                 if several else " / ".join(f"{m:.3g} ± {d:.2g}" for m, d in zip(
                     c.summary["batch_seconds_per_worker"], c.summary["batch_seconds_std"])))
      rows.append([f"{c.variant} ×{c.workers}", str(c.summary.get("batch_sizes")),
                   _entry(runs, per_epoch, ".4g"),
                   _entry(runs, lambda r: None if r not in timed
                          else 100 * r.summary["idle_fraction"], ".1f"),
                   batches, _entry(runs, lambda r: r.score)])
    return table(["cell", "batch sizes at step 0", "time per epoch (s)",
                  "idle (% of worker time)", "batch seconds per worker (mean ± "
                  + ("95% interval over the seeds)" if several else "std)"),
                  self.label], rows)

  def strategies_table(self, network: str) -> str:
    """The ASU seed's table: each cell's strategy, devices, global batch,
    samples/s, utilization (a pipeline's: each device's busy fraction, its
    measured bubble beside the ideal), memory per device, time per epoch,
    time to the target and cost (with --price-per-device-hour), a row per
    cell (each figure its mean over the seeds)."""
    def of(field: str, scale: float = 1.0) -> Callable[[CellResult], float | None]:
      return lambda r: None if r.diverged or r.summary.get(field) is None \
          else scale * r.summary[field]

    def megabytes(r: CellResult) -> float | None:
      memory = r.summary.get("memory_per_device_bytes")
      return None if r.diverged or not memory else \
          (memory["arguments"] + memory["temporaries"]) / 1e6

    rows = []
    for runs in self._cells_of(self.strategies(network)):
      c, s = runs[0], runs[0].summary
      strategy = (f"pipeline, {s['stages']} stages x {s['microbatches']} micro-batches"
                  if s.get("stages") else f"tensor, {s['tensor_parallel']} devices a worker"
                  if s.get("tensor_parallel") else f"data, {c.workers} worker(s)")
      row = [c.variant, strategy, str(s.get("devices")), str(sum(s.get("batch_sizes") or []))]
      if all(r.diverged for r in runs):
        rows.append(row + [DIVERGED] + ["—"] * 6)
        continue
      busy = [r for r in runs if not r.diverged and r.summary.get("busy_fraction_per_device")]
      bubble = (f"{fmt(Interval.of(of('bubble_fraction_measured', 100)(r) for r in busy), '.0f')}"
                f" (ideal {100 * busy[0].summary['bubble_fraction_ideal']:.0f})"
                if busy else "—")
      rows.append(row + [
          _entry(runs, lambda r: r.throughput, ",.0f"),
          per_element(busy, lambda r: [100 * b for b in r.summary["busy_fraction_per_device"]],
                      ".0f") if busy else "—", bubble,
          _entry(runs, megabytes, ".2f"), _entry(runs, of("seconds_per_epoch"), ".4g"),
          _entry(runs, lambda r: r.time_to(self.target), ".4g"),
          _entry(runs, of("cost"), ".4g")])
    return table(["cell", "strategy", "devices", "global batch", "samples/s",
                  "busy (% per device)", "bubble (%)",
                  "memory per device (MB: arguments + temporaries)", "time per epoch (s)",
                  f"time to {self.target:.2f} (s)", "cost"], rows)

  def staleness_notes(self, network: str) -> str:
    """What the staleness column counts, and the cells whose staleness bound
    never bound (those of an algorithm that declares what it then reduces
    to, AlgorithmSpec.reduces_to: ssp's, asp): no worker waited on it, or
    the parameters equal those of that algorithm's cell bit for bit."""
    cells = [c for c in self.train if c.network == network and not c.diverged]
    if not any(c.summary.get("staleness_mean") is not None for c in cells):
      return ""
    lines = ["Staleness of an update is counted in server versions: the updates (of any "
             "worker) that the server applied between the worker's pull and the apply of "
             "its push. SSP's bound s counts a worker's iterations instead: a worker may start "
             "iteration c only once every worker has finished c − s, and waits until "
             "then; a bound that no worker reaches never binds."]
    for m in _workers(cells):
      unbound_runs: dict[str, list[CellResult]] = {}  # why -> the runs it never bound in
      for c in (c for c in cells if c.workers == m and _reduces_to(c.algorithm)):
        unbound = _reduces_to(c.algorithm)
        twin = self.same_seed(c, self.runs(
            unbound + (f"_{labels.ASYNC_BN}" if c.async_bn else ""), m, network))
        fingerprint = c.summary.get("params_fingerprint")
        if twin and not twin.diverged and fingerprint and \
            twin.summary.get("params_fingerprint") == fingerprint:
          why = f"identical to {unbound} (the same parameters fingerprint)"
        elif c.summary.get("wait_s") is not None and not any(c.summary["wait_s"]):
          why = "no worker ever waited on it"
        else:
          continue
        unbound_runs.setdefault(why, []).append(c)
      # the runs with the unbound algorithm's bits first, those that merely never waited after
      for why, runs in sorted(unbound_runs.items(), key=lambda item: item[0].startswith("no")):
        # variants grouped by how often: in every seed of theirs, or in k of n
        often: dict[str, list[str]] = {}
        for variant in dict.fromkeys(c.variant for c in runs):
          k = sum(c.variant == variant for c in runs)
          n = len([c for c in cells if c.workers == m and c.variant == variant])
          often.setdefault("" if k == n else f" in {k} of {n} seeds", []).append(variant)
        for seeds, variants in often.items():
          lines.append(f"- {', '.join(variants)}: the staleness bound s never bound at {m} "
                       f"workers{seeds}: {why}.")
    return "\n".join(lines)

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
      staleness = staleness_table(self.cells(net))
      if staleness:
        parts += [f"### Staleness of the applied updates{where}: distribution", staleness]
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
      if self.findings:
        parts += [f"### Findings{where}", findings_table(self, net), FINDINGS_NOTE]
    diverged = [c for c in self.train + self.timing if c.diverged]
    if diverged:
      parts += ["### Diverged cells (stopped; no test figures)", "\n".join(
          f"- `{c.name}`: {c.summary.get('divergence', DIVERGED)}" for c in diverged)]
    resumed = [c for c in self.train + self.timing if c.summary.get("measured_from_step")]
    if resumed:
      parts += ["### Cells resumed on a real engine", RESUMED_NOTE + "\n".join(
          f"- `{c.name}`: after step {c.summary['measured_from_step']}" for c in resumed)]
    failed = self.failures()
    if failed:
      parts += ["### Failed cells", "\n".join(f"- `{n}`: {e}" for n, e in failed)]
    return "\n\n".join(parts) + "\n"

