"""The PNG plots of `jaxdl report` (matplotlib, Agg backend: no display needed).

A variant (its label: ``asp``, ``ssp_s3``) has one colour and one marker in
every plot of every comparison (`color`, `marker`); where a plot's lines are
variants, each has its own line style too (`variant_style`), and where they
are one variant at several worker counts, a worker count has one. So the 14
variants of the default comparison differ in colour, and two whose colours
are alike (tab20's dark and light of a hue) also in marker and line style.
Legends sit outside the axes, one entry per line label; a line hidden under
an identical one says so once, "(= the other)", with the panels where it
was (when not all). A diverged run is marked with an x at the bottom edge
(at the step where it stopped, or at its worker count) and "diverged" in its
legend entry.

A cell of several seeds is drawn as its mean over them (the report's
intervals: jaxdl.report imports this module): a curve with its 95% interval
as a light band of its colour, a point against workers or bytes with the
interval as error bars.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Callable

from jaxdl.algorithms import ALGORITHMS
from jaxdl.compare import DEFAULT_GRID, GRIDS

# The figures `write_all` draws, in its order.
PLOTS = ("curves_time.png", "curves_epochs.png", "accuracy_workers.png", "speedup_workers.png")
BATCH_TIMES = "batch_times.png"  # drawn where cells recorded their workers' batch times
STRATEGIES = "strategies.png"  # drawn for a comparison of parallelisms
ACCURACY_BYTES = "accuracy_bytes.png"  # drawn where cells counted the bytes they sent
Report = Any  # a jaxdl.report.Comparison: its cells, networks and baseline
Figure = Any  # a matplotlib Figure
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*")


def ratio(a: float | None, b: float | None) -> float | None:
  return a / b if a and b else None


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def color_order() -> list[str]:
  """The labels with a colour of their own, in palette order: the default
  comparison's variants, every other registered algorithm, then the other
  named grids' variants."""
  return list(dict.fromkeys([v.label for v in DEFAULT_GRID.variants] + ALGORITHMS.names()
                            + [v.label for g in GRIDS.values() for v in g.variants]))


def _index(label: str) -> int:
  """A label's place in `color_order`, or a stable hash for one outside it."""
  order = color_order()
  return order.index(label) if label in order else zlib.crc32(label.encode())


def color(label: str) -> tuple[float, ...]:
  """A variant's colour, the same in every plot and comparison: tab20's dark
  colours then its light ones, greys left out (they read as "off"), then
  tab20b's, taken in `color_order`; a label outside it takes one by a hash
  of its name (stable, but may be shared)."""
  import matplotlib
  cmap, more = matplotlib.colormaps["tab20"], matplotlib.colormaps["tab20b"]
  palette = [cmap(i) for start in (0, 1) for i in range(start, 20, 2) if i not in (14, 15)]
  palette += [more(i) for start in (0, 2, 1, 3) for i in range(start, 20, 4)]
  return palette[_index(label) % len(palette)]


def marker(label: str) -> str:
  """A variant's marker, the same in every plot: taken in `color_order` from
  MARKERS, whose length shares no factor with the 9 colours between a hue's
  dark and light (so those two differ in marker)."""
  return MARKERS[_index(label) % len(MARKERS)]


def variant_style(label: str) -> dict[str, Any]:
  """Colour, marker and line style of a variant's line in a plot whose lines
  are variants (its line style: in `color_order`, 4 styles, so a hue's dark
  and light, 9 apart, differ in it too)."""
  return dict(color=color(label), marker=marker(label),
              linestyle=LINESTYLES[_index(label) % 4])


def _linestyles(report: Report) -> dict[int, Any]:
  """One line style per worker count of the report (one worker: solid)."""
  counts = sorted({c.workers for c in report.train + report.timing} | {1})
  return {m: LINESTYLES[i % len(LINESTYLES)] for i, m in enumerate(counts)}


def _clock(cells) -> str:
  """Which seconds the cells' times are."""
  kinds = {c.simulated for c in cells}
  return ("simulated" if kinds == {True} else "wall" if kinds == {False}
          else "simulated (sim runs) or wall")


def _mark_diverged(ax, x: float, c, label: str) -> None:
  """An x at the bottom edge, at `x`, where the run `c` diverged."""
  ax.plot([x], [0.03], marker="x", markersize=9, markeredgewidth=2, linestyle="none",
          color=color(c.variant), transform=ax.get_xaxis_transform(), label=label)


def _line(ax, seen: dict, xs, intervals: list, label: str, band: bool = False,
          **style) -> None:
  """Plots a line through the means of `intervals` (a cell's over its seeds,
  jaxdl.report.intervals) on `ax`, with their 95% intervals where a point is
  over several seeds: a light band of the line's colour (`band`), else error
  bars. One that lies exactly on a line `seen` before on the same axes (e.g.
  ssp whose bound never bound, on asp) is recorded as such (`seen[label]`),
  for its legend entry (`_legend`)."""
  ys = [i.mean for i in intervals]
  first = seen.setdefault((tuple(xs), tuple(ys)), label)
  if first != label:
    seen[label] = first
  if all(i.n == 1 for i in intervals):
    ax.plot(xs, ys, label=label, **style)
  elif band:
    ax.plot(xs, ys, label=label, **style)
    ax.fill_between(xs, [i.low for i in intervals], [i.high for i in intervals],
                    color=style["color"], alpha=0.2, linewidth=0)
  else:
    ax.errorbar(xs, ys, yerr=[[i.mean - i.low for i in intervals],
                              [i.high - i.mean for i in intervals]],
                label=label, capsize=3, **style)


def _seeds_title(fig, report: Report, cells, interpolated: list[str], what: str) -> None:
  """Says, above a figure of cells run over several seeds, what its lines and
  `what` (their bands or bars) show, and which variants' curves were
  interpolated (their runs evaluated at different steps)."""
  if all(len(report.runs(c.variant, c.workers, c.network, c.timing)) == 1 for c in cells):
    return
  fig.suptitle(f"mean over the seeds, {what}: 95% interval" + (
      f"; runs evaluated at different steps interpolated: {', '.join(interpolated)}"
      if interpolated else ""), fontsize=9)


def _legend(fig, axes, seen: list[dict] | None = None) -> None:
  """One legend for the figure, right of the axes, each label once. `seen`:
  each axes' record of `_line`; a label whose line lay on another's says so
  once, naming the panels where it did unless it did in every panel it is in."""
  entries: dict[str, Any] = {}
  panels: dict[str, list] = {}
  for i, ax in enumerate(axes):
    for handle, label in zip(*ax.get_legend_handles_labels()):
      entries.setdefault(label, handle)
      panels.setdefault(label, []).append(i)
  texts = []
  for label in entries:
    same = {i: seen[i][label] for i in panels[label] if seen and i < len(seen) and label in seen[i]}
    if not same:
      texts.append(label)
    elif len(same) == len(panels[label]) and len(set(same.values())) == 1:
      texts.append(f"{label} (= {next(iter(same.values()))})")
    else:
      where = ", ".join(f"{other} in {axes[i].get_title() or f'panel {i + 1}'}"
                        for i, other in same.items())
      texts.append(f"{label} (= {where})")
  fig.legend(list(entries.values()), texts, loc="center left", bbox_to_anchor=(1.0, 0.5),
             fontsize=8, frameon=False)


def curves(report: Report, x: str) -> Figure:
  """The test metric against `x` ("time" or "epoch"), one panel per worker count."""
  plt = _pyplot()
  cells = [c for c in report.train if c.network == report.main]
  workers = sorted({c.workers for c in cells if c.variant != report.baseline_variant}) or [1]
  styles = _linestyles(report)
  fig, axes = plt.subplots(1, len(workers), figsize=(4.5 * len(workers), 4), squeeze=False,
                           sharey=True)
  base = report.baseline_variant
  seen: list[dict] = []
  interpolated: list[str] = []
  for ax, m in zip(axes[0], workers):
    seen.append({})
    shown = [(v, m) for v in dict.fromkeys(c.variant for c in cells
                                           if c.workers == m and c.variant != base)]
    for v, w in shown + [(base, 1)]:
      runs = report.runs(v, w, report.main)
      label = f"{v} (1 worker)" if v == base else v
      mean = report.mean_curve(runs, x)
      if mean:
        _line(ax, seen[-1], mean.x, mean.scores, label, band=True, marker=marker(v),
              markersize=4, color=color(v), linestyle=styles[w])
        if mean.interpolated and label not in interpolated:
          interpolated.append(label)
      for c in (c for c in runs if c.diverged and c.last):
        _mark_diverged(ax, c.last[x], c, f"{label} (diverged)")
    ax.set_title(f"{m} workers")
    ax.set_xlabel(f"time ({_clock(cells)} seconds)" if x == "time" else "epochs")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel(report.label)
  _legend(fig, axes[0], seen)
  _seeds_title(fig, report, cells, interpolated, "shaded")
  return fig


def _per_workers(report: Report, cells, value: Callable) -> tuple[list[int], list]:
  """The worker counts of `cells` (one variant's, on one network) at which
  `value` of a run has a figure, and each one's interval over its seeds."""
  points = [(m, report.interval(value(c) for c in cells if c.workers == m))
            for m in sorted({c.workers for c in cells})]
  return [m for m, i in points if i], [i for _, i in points if i]


def accuracy_against_workers(report: Report) -> Figure:
  """The final test metric against the worker count, one line per variant."""
  plt = _pyplot()
  cells = [c for c in report.train if c.network == report.main]
  variants = list(dict.fromkeys(c.variant for c in cells if c.variant != report.baseline_variant))
  fig, ax = plt.subplots(figsize=(6, 4))
  seen: dict = {}
  for v in variants:
    workers, scores = _per_workers(report, [c for c in cells if c.variant == v],
                                   lambda c: c.score)
    if workers:
      _line(ax, seen, workers, scores, v, **variant_style(v))
    for c in (c for c in cells if c.variant == v and c.diverged):
      _mark_diverged(ax, c.workers, c, f"{v} (diverged)")
  base_variant = report.baseline_variant
  base = report.interval(c.score for c in report.runs(base_variant, 1, report.main))
  if base:
    ax.axhline(base.mean, color=color(base_variant), linestyle="--",
               label=f"{base_variant} (1 worker)")
    if base.n > 1:
      ax.axhspan(base.low, base.high, color=color(base_variant), alpha=0.15, linewidth=0)
  ax.set_xlabel("workers")
  ax.set_ylabel(report.label)
  ax.grid(alpha=0.3)
  _legend(fig, [ax], [seen])
  _seeds_title(fig, report, cells, [], "error bars")
  return fig


def speedup_against_workers(report: Report) -> Figure:
  """Throughput speedup over one-worker SGD, one panel per bandwidth."""
  plt = _pyplot()
  panels = [(n, report.train) for n in report.networks]
  panels += [(n, report.timing) for n in dict.fromkeys(c.network for c in report.timing)
             if n not in report.networks]
  fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5 * max(1, len(panels)), 4),
                           squeeze=False, sharey=True)
  seen: list[dict] = []
  for ax, (net, pool) in zip(axes[0], panels):
    bases = [c for c in pool if c.variant == report.baseline_variant and c.network == net]
    cells = [c for c in pool if c.network == net and c.variant != report.baseline_variant]
    seen.append({})

    def speedup(c) -> float | None:  # over the baseline's run of the same seed
      base = report.same_seed(c, bases)
      return None if c.diverged else ratio(c.throughput, base and base.throughput)

    for v in dict.fromkeys(c.variant for c in cells):
      workers, speedups = _per_workers(report, [c for c in cells if c.variant == v], speedup)
      if workers:
        _line(ax, seen[-1], workers, speedups, v, **variant_style(v))
      for c in (c for c in cells if c.variant == v and c.diverged):
        _mark_diverged(ax, c.workers, c, f"{v} (diverged)")
    workers = sorted({c.workers for c in cells})
    if workers:
      ax.plot(workers, workers, color="k", linestyle=":", label="linear")
    ax.set_title(f"network {net}")
    ax.set_xlabel("workers")
    ax.grid(alpha=0.3)
  clock = _clock(report.train + report.timing)
  axes[0][0].set_ylabel(f"speedup over 1-worker SGD\n(samples per {clock} second)")
  _legend(fig, axes[0], seen)
  _seeds_title(fig, report, report.train + report.timing, [], "error bars")
  return fig


def batch_times(report: Report) -> Figure:
  """Each worker's batch-time histogram, one panel per cell that recorded
  them (the Choi seed's per-worker distributions)."""
  plt = _pyplot()
  timed = report.heterogeneous(report.main)
  cells = list(dict.fromkeys((c.variant, c.workers) for c in timed))
  fig, axes = plt.subplots(len(cells), 1, figsize=(6, 2.2 * len(cells)), squeeze=False)
  for ax, (variant, workers) in zip(axes[:, 0], cells):
    runs = [c for c in timed if (c.variant, c.workers) == (variant, workers)]
    for c in runs:  # each seed's, a worker's in the same colour
      histogram = c.summary["batch_seconds_histogram"]
      for m, counts in enumerate(histogram["counts"]):
        ax.stairs(counts, histogram["edges"], label=f"worker {m}", fill=False, linewidth=1.5,
                  color=f"C{m % 10}")
    idle = report.interval(100 * c.summary["idle_fraction"] for c in runs)
    seeds = f", each of {len(runs)} seeds' histograms" if len(runs) > 1 else ""
    ax.set_title(f"{variant} ×{workers}: idle {idle:.1f}% of worker time{seeds}", fontsize=9)
    ax.set_ylabel("batches")
    ax.grid(alpha=0.3)
  axes[-1, 0].set_xlabel("seconds per batch")
  _legend(fig, [axes[0, 0]])
  return fig


def _bytes_cells(report: Report, network: str) -> list:
  return [c for c in report.train if c.network == network and c.score is not None
          and c.summary.get("bytes_total")]


def accuracy_against_bytes(report: Report) -> Figure:
  """The final test metric against the bytes the workers sent (log scale),
  one panel per network, a line per variant through its worker counts:
  what communicating less buys or costs."""
  import matplotlib.ticker  # noqa: F401  (NullFormatter)
  plt = _pyplot()
  networks = [n for n in report.networks if _bytes_cells(report, n)]
  fig, axes = plt.subplots(1, len(networks), figsize=(5 * len(networks), 4), squeeze=False,
                           sharey=True)
  seen: list[dict] = []
  for ax, net in zip(axes[0], networks):
    cells = _bytes_cells(report, net)
    seen.append({})
    for v in dict.fromkeys(c.variant for c in cells):
      runs = [c for c in cells if c.variant == v]
      workers, scores = _per_workers(report, runs, lambda c: c.score)
      sent = _per_workers(report, runs, lambda c: c.summary["bytes_total"] / 1e6)[1]
      _line(ax, seen[-1], [b.mean for b in sent], scores, v, **variant_style(v))
      for m, x, y in zip(workers, sent, scores):
        ax.annotate(f"×{m}", (x.mean, y.mean), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(f"network {net}")
    ax.set_xlabel("bytes sent by the workers (MB)")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel(report.label)
  _legend(fig, axes[0], seen)
  _seeds_title(fig, report, report.train, [], "error bars")
  return fig


def strategies(report: Report) -> Figure:
  """The parallelisms' samples/s, memory per device and time to the target,
  a bar a cell (the ASU seed's figures)."""
  plt = _pyplot()
  runs = report.strategies(report.main)
  names = list(dict.fromkeys(c.variant for c in runs))

  def per_cell(value: Callable) -> list:
    return [report.interval(value(c) for c in runs if c.variant == n) for n in names]

  def memory(c) -> float:
    return (c.summary["memory_per_device_bytes"]["arguments"]
            + c.summary["memory_per_device_bytes"]["temporaries"]) / 1e6

  panels = (("samples/s", per_cell(lambda c: c.throughput)),
            ("memory per device (MB)", per_cell(memory)),
            (f"time to {report.target:.2f} (s)", per_cell(lambda c: c.time_to(report.target))))
  several = len(runs) > len(names)
  fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3))
  for ax, (label, values) in zip(axes, panels):
    bars = dict(yerr=[[v.mean - v.low if v else 0 for v in values],
                      [v.high - v.mean if v else 0 for v in values]], capsize=3) \
        if several else {}
    ax.bar(names, [v.mean if v is not None else 0 for v in values],
           color=[color(n) for n in names], **bars)
    for i, v in enumerate(values):
      if v is None:
        ax.text(i, 0, "—", ha="center", va="bottom")
    ax.set_title(label, fontsize=9)
    ax.tick_params(axis="x", labelrotation=45)
    ax.grid(axis="y", alpha=0.3)
  _seeds_title(fig, report, runs, [], "error bars")
  return fig


def _save(fig, path: Path) -> Path:
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")  # "tight": the legend outside included
  _pyplot().close(fig)
  return path


FIGURES: dict[str, Callable[[Report], Figure]] = dict(zip(PLOTS, (
    lambda r: curves(r, "time"), lambda r: curves(r, "epoch"), accuracy_against_workers,
    speedup_against_workers)))


def write_all(report: Report, directory: Path) -> list[Path]:
  """Draws every figure of PLOTS into `directory` (and the batch-time
  histograms, where cells recorded them, the parallelisms' bars, for a
  comparison of them, and the metric against the bytes sent, where cells
  counted them); returns their paths."""
  written = [_save(draw(report), directory / name) for name, draw in FIGURES.items()]
  if report.main is not None and report.heterogeneous(report.main):
    written.append(_save(batch_times(report), directory / BATCH_TIMES))
  if report.main is not None and report.strategies(report.main):
    written.append(_save(strategies(report), directory / STRATEGIES))
  if any(_bytes_cells(report, n) for n in report.networks):
    written.append(_save(accuracy_against_bytes(report), directory / ACCURACY_BYTES))
  return written
