"""The PNG plots of `jaxdl report` (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

# The figures `write_all` draws, in its order.
PLOTS = ("curves_time.png", "curves_epochs.png", "accuracy_workers.png", "speedup_workers.png")
Report = Any  # a jaxdl.report.Report: its cells, networks and baseline


def ratio(a: float | None, b: float | None) -> float | None:
  return a / b if a and b else None


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _colors(report: Report) -> dict[str, object]:
  """One color per variant, the same in every plot."""
  import matplotlib
  cmap = matplotlib.colormaps["tab20"]
  variants = dict.fromkeys(c.variant for c in report.train + report.timing)
  return {v: cmap(i % 20) for i, v in enumerate(variants)}


def curves(report: Report, x: str, path: Path) -> Path:
  """Test accuracy against `x` ("time" or "epoch"), one panel per worker count."""
  BASELINE = report.baseline_variant
  plt = _pyplot()
  cells = [c for c in report.train if c.network == report.main]
  workers = sorted({c.workers for c in cells if c.variant != BASELINE}) or [1]
  colors = _colors(report)
  fig, axes = plt.subplots(1, len(workers), figsize=(4.5 * len(workers), 4), squeeze=False,
                           sharey=True)
  base = report.baseline(report.main)
  for ax, m in zip(axes[0], workers):
    for c in [c for c in cells if c.workers == m] + ([base] if base else []):
      if c.curve:
        ax.plot([p[x] for p in c.curve], [p["test_accuracy"] for p in c.curve],
                marker=".", color=colors[c.variant], label=c.variant,
                linestyle="--" if c is base else "-")
    ax.set_title(f"{m} workers")
    ax.set_xlabel("time (s, simulated or wall)" if x == "time" else "epoch")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("test accuracy")
  axes[0][-1].legend(fontsize=7, loc="lower right")
  return _save(fig, path)


def accuracy_against_workers(report: Report, path: Path) -> Path:
  BASELINE = report.baseline_variant
  plt = _pyplot()
  cells = [c for c in report.train if c.network == report.main]
  variants = list(dict.fromkeys(c.variant for c in cells if c.variant != BASELINE))
  colors = _colors(report)
  fig, ax = plt.subplots(figsize=(6, 4))
  for v in variants:
    points = sorted((c.workers, c.summary["test_accuracy"]) for c in cells if c.variant == v)
    ax.plot(*zip(*points), marker="o", color=colors[v], label=v)
  base = report.baseline(report.main)
  if base:
    ax.axhline(base.summary["test_accuracy"], color="k", linestyle="--",
               label="sgd (1 worker)")
  ax.set_xlabel("workers")
  ax.set_ylabel("test accuracy")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  return _save(fig, path)


def speedup_against_workers(report: Report, path: Path) -> Path:
  """Throughput speedup over one-worker SGD, one panel per bandwidth."""
  BASELINE = report.baseline_variant
  plt = _pyplot()
  panels = [(n, report.train) for n in report.networks]
  panels += [(n, report.timing) for n in dict.fromkeys(c.network for c in report.timing)
             if n not in report.networks]
  fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5 * max(1, len(panels)), 4),
                           squeeze=False, sharey=True)
  for ax, (net, pool) in zip(axes[0], panels):
    base = next((c for c in pool if c.variant == BASELINE and c.network == net), None)
    cells = [c for c in pool if c.network == net and c.variant != BASELINE]
    variants = list(dict.fromkeys(c.variant for c in cells))
    colors = _colors(report)
    for v in variants:
      points = sorted((c.workers, ratio(c.throughput, base and base.throughput))
                      for c in cells if c.variant == v)
      points = [(m, s) for m, s in points if s is not None]
      if points:
        ax.plot(*zip(*points), marker="o", color=colors[v], label=v)
    workers = sorted({c.workers for c in cells})
    if workers:
      ax.plot(workers, workers, color="k", linestyle=":", label="linear")
    ax.set_title(f"network {net}")
    ax.set_xlabel("workers")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("speedup over 1-worker SGD (samples/s)")
  axes[0][-1].legend(fontsize=7)
  return _save(fig, path)


def _save(fig, path: Path) -> Path:
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  _pyplot().close(fig)
  return path


def write_all(report: Report, directory: Path) -> list[Path]:
  time_png, epochs_png, acc_png, speed_png = (directory / name for name in PLOTS)
  return [curves(report, "time", time_png), curves(report, "epoch", epochs_png),
          accuracy_against_workers(report, acc_png),
          speedup_against_workers(report, speed_png)]
