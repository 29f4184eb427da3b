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
"""
from __future__ import annotations

from jaxdl import labels
from jaxdl.algorithms import ALGORITHMS
from jaxdl.plots import ratio
from jaxdl.report.cells import CellResult
from jaxdl.report.comparison import Comparison
from jaxdl.report.markdown import fmt, table
from jaxdl.report.prediction import prediction_note, prediction_table

WAIT_NOTE = ("Wait is the time a worker is held by its algorithm's rule: at a synchronous "
             "step's barrier (at a parameter server, until the last gradient has arrived), "
             "by SSP's bound, or with a GoSGD push behind its last message still in flight. "
             "An asynchronous worker's own transfers, and their queueing on busy links, are "
             "not in it.")
"""The scaling table's note on what its wait column counts."""


DIVERGED = "diverged"  # a diverged run's entry in every table, in place of a figure


def _error(c: CellResult | None) -> float | None:
  """Test error %, or the metric itself where lower is better (a loss)."""
  if c is None or c.score is None:
    return None
  return 100 * (1 - c.score) if c.higher_is_better else c.score


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


class Tables(Comparison):
  """The markdown tables of one comparison directory."""

  def metric_table(self, network: str) -> str:
    """IPDPS'21 Table III: the test metric, rows workers, columns algorithms."""
    cells = [c for c in self.train if c.network == network]
    variants = _variants(cells)
    rows = []
    for m in _workers(cells):
      row = [self._cell(v, m, network) for v in variants]
      if any(row):
        rows.append([str(m)] + [DIVERGED if c and c.diverged else fmt(c and c.score)
                                for c in row])
    return table(["workers"] + variants, rows)

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
        pair = [next((c for c in cells if c.bn_variant == v and c.workers == m
                      and c.async_bn == abn), None) for abn in (False, True)]
        errors = [DIVERGED if c and c.diverged else fmt(_error(c), ".2f") for c in pair]
        row.append("" if not any(pair) else " / ".join(errors))
      rows.append(row)
    return table(["workers"] + variants, rows)

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
      row = [f"{c.variant} ×{c.workers}", fmt(c.time_s, ".4g"), fmt(c.throughput, ",.0f"),
             fmt(ratio(c.throughput, base and base.throughput), ".2f")]
      for n in timing_nets:
        t, b = self._cell(c.variant, c.workers, n, True), self.baseline(n, True)
        row.append(fmt(ratio(t and t.throughput, b and b.throughput), ".2f"))
      tta = c.time_to(self.target)
      wait = s.get("wait_s")
      wait_pct = (100 * sum(wait) / len(wait) / c.time_s if wait and c.time_s else None)
      stale = (f"{s['staleness_mean']:.2f} / {s['staleness_max']}"
               if s.get("staleness_mean") is not None else "—")
      mb = s.get("bytes_total")
      row += [fmt(tta, ".4g"), fmt(ratio(base and base.time_to(self.target), tta), ".2f"),
              fmt(wait_pct, ".1f"), stale, fmt(mb / 1e6 if mb is not None else None, ".1f")]
      rows.append(row)
    return table(header, rows)


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
                   fmt(per_epoch, ".4g"), fmt(100 * s["idle_fraction"], ".1f"), batches,
                   fmt(c.score)])
    return table(["cell", "batch sizes at step 0", "time per epoch (s)",
                      "idle (% of worker time)", "batch seconds per worker (mean ± std)",
                      self.label], rows)

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
             fmt(c.throughput, ",.0f"),
             " / ".join(f"{100 * b:.0f}" for b in busy) if busy else "—", bubble,
             fmt(mb, ".2f"), fmt(s.get("seconds_per_epoch"), ".4g"),
             fmt(c.time_to(self.target), ".4g"), fmt(s.get("cost"), ".4g")]
      rows.append(row if not c.diverged else row[:4] + [DIVERGED] + ["—"] * 6)
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
      same: dict[str, list[CellResult]] = {}
      idle = []
      for c in (c for c in cells if c.workers == m and _reduces_to(c.algorithm)):
        unbound = _reduces_to(c.algorithm)
        twin = self._cell(unbound + (f"_{labels.ASYNC_BN}" if c.async_bn else ""), m, network)
        fingerprint = c.summary.get("params_fingerprint")
        if twin and not twin.diverged and fingerprint and \
            twin.summary.get("params_fingerprint") == fingerprint:
          same.setdefault(unbound, []).append(c)
        elif c.summary.get("wait_s") is not None and not any(c.summary["wait_s"]):
          idle.append(c)
      groups = [(group, f"identical to {unbound} (the same parameters fingerprint)")
                for unbound, group in same.items()] + [(idle, "no worker ever waited on it")]
      for group, why in groups:
        if group:
          lines.append(f"- {', '.join(c.variant for c in group)}: the staleness bound s "
                       f"never bound at {m} workers: {why}.")
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

