"""IPDPS'21 hyperparameter sensitivity: test accuracy of BSP, ASP, SSP (s = 3),
EASGD (tau = 4), GoSGD (p = 0.1) and AD-PSGD over a learning rate x batch
size grid at a fixed worker count; one heatmap per algorithm. (AR-SGD is left
out: its update is BSP's.)

  python experiments/hyperparameter_sensitivity.py                  # miniature, a few minutes
  python experiments/hyperparameter_sensitivity.py --scale paper --data-dir DIR
  JAXDL_SCALE=mini jaxdl compare --experiment experiments/hyperparameter_sensitivity.py

Scales (``--scale``, or ``JAXDL_SCALE`` for `jaxdl compare --experiment`):

  mini   mlp on digits, 8 workers, lr 0.01 / 0.05 / 0.2 x batch 4 / 8 / 16 per
         worker, plain SGD, 5 epochs, simulated cluster (0.2 ms per batch,
         jitter 0.1) at 10 Gb/s.
  paper  ResNet-50 on ImageNet-1K (``tfds:imagenet2012`` in ``--data-dir``),
         16 workers, lr 0.025 / 0.05 / 0.1 / 0.2 x batch 16 / 32 / 64 per worker,
         momentum 0.9, step decay at epochs 30 and 60, 90 epochs, Titan V, 10 Gb/s.

A cell is the variant ``<algorithm>_lr<lr>_b<batch>``. The script runs the
grid (other arguments: ``--out``, ``--jobs``; the default ``--out`` is
``runs/hyperparameter_sensitivity-<scale>``) and writes ``sensitivity.md``
(one accuracy table per algorithm, rows batch, columns lr, and the spread
max - min) and ``sensitivity.png`` (the heatmaps) into it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Literal

from jaxdl.cli import script_args
from jaxdl.compare import DEFAULT_RUN, Grid, Variant
from jaxdl.errors import ConfigError

ALGORITHMS = (("bsp", "bsp", ()), ("asp", "asp", ()), ("ssp_s3", "ssp", (("staleness_bound", 3),)),
              ("easgd_tau4", "easgd", (("communication_period", 4),)),
              ("gosgd_p0.1", "gosgd", (("gossip_probability", 0.1),)),
              ("ad_psgd", "ad_psgd", ()))
SCALES = {
    "mini": dict(lrs=(0.01, 0.05, 0.2), batches=(4, 8, 16), workers=8, run=DEFAULT_RUN),
    "paper": dict(lrs=(0.025, 0.05, 0.1, 0.2), batches=(16, 32, 64), workers=16,
                  run=(("dataset", "tfds:imagenet2012"), ("image_size", 224),
                       ("model", "resnet50"), ("engine", "sim"), ("cluster", "titan-v"),
                       ("momentum", 0.9), ("weight_decay", 1e-4), ("schedule", "step"),
                       ("lr_milestones", (30.0, 60.0)), ("epochs", 90.0), ("seed", 0))),
}


def name(label: str, lr: float, batch: int) -> str:
  return f"{label}_lr{lr:g}_b{batch}"


def grid(scale: str) -> Grid:
  """The grid at `scale` ("mini" or "paper")."""
  if scale not in SCALES:
    raise ValueError(f"--scale {scale!r}: mini or paper")
  s = SCALES[scale]
  variants = tuple(Variant(algorithm, settings + (("lr", lr), ("batch_size", b)),
                           name=name(label, lr, b))
                   for label, algorithm, settings in ALGORITHMS
                   for b in s["batches"] for lr in s["lrs"])
  return Grid(variants=variants, workers=(s["workers"],), timing_networks=(), run=s["run"])


GRID = grid(os.environ.get("JAXDL_SCALE", "mini"))


def accuracies(out: Path, scale: str, workers: int) -> dict:
  """{label: {(batch, lr): test accuracy, or None if the run diverged}} of
  the finished cells in `out`."""
  s, acc = SCALES[scale], {}
  for label, *_ in ALGORITHMS:
    for b in s["batches"]:
      for lr in s["lrs"]:
        summary = out / f"{name(label, lr, b)}-m{workers}" / "summary.json"
        if summary.exists():
          result = json.loads(summary.read_text())
          acc.setdefault(label, {})[b, lr] = (None if result.get("status") == "diverged"
                                               else result["test_accuracy"])
  return acc


def write(out: Path, scale: str, workers: int) -> None:
  """sensitivity.md and sensitivity.png of the finished cells."""
  s, acc = SCALES[scale], accuracies(out, scale, workers)
  lines = [f"# Test accuracy over lr x batch per worker, {workers} workers ({scale})\n"]
  cell = lambda v: "diverged" if v is None else f"{v:.4f}"
  for label, table in acc.items():
    values = [v for v in table.values() if v is not None]
    diverged = len(table) - len(values)
    stats = (f"best {max(values):.4f}, worst {min(values):.4f}, spread "
             f"{max(values) - min(values):.4f}, mean {sum(values) / len(values):.4f}"
             if values else "no completed cell")
    if diverged:
      stats += f" (of the {len(values)} completed cells; {diverged} diverged)"
    lines += [f"\n### {label}: {stats}\n",
              "| batch \\ lr | " + " | ".join(f"{lr:g}" for lr in s["lrs"]) + " |",
              "|---|" + "---|" * len(s["lrs"])]
    lines += [f"| {b} | " + " | ".join(cell(table[b, lr]) if (b, lr) in table else "—"
                                       for lr in s["lrs"]) + " |" for b in s["batches"]]
  (out / "sensitivity.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  fig, axes = plt.subplots(1, len(acc), figsize=(3.2 * len(acc), 3.2), squeeze=False)
  for ax, (label, table) in zip(axes[0], acc.items()):
    grid_ = np.array([[np.nan if table.get((b, lr)) is None else table[b, lr]
                       for lr in s["lrs"]] for b in s["batches"]])
    image = ax.imshow(grid_, vmin=0.5, vmax=1.0, cmap="viridis", origin="lower")
    for i in range(len(s["batches"])):
      for j in range(len(s["lrs"])):
        diverged = (s["batches"][i], s["lrs"][j]) in table and np.isnan(grid_[i, j])
        ax.text(j, i, "div." if diverged else f"{grid_[i, j]:.2f}", ha="center",
                va="center", fontsize=8, color="k" if grid_[i, j] > 0.8 else "w")
    ax.set_xticks(range(len(s["lrs"])), [f"{lr:g}" for lr in s["lrs"]])
    ax.set_yticks(range(len(s["batches"])), [str(b) for b in s["batches"]])
    ax.set_xlabel("learning rate")
    ax.set_title(label)
  axes[0][0].set_ylabel("batch per worker")
  fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="test accuracy")
  fig.savefig(out / "sensitivity.png", dpi=100, bbox_inches="tight")
  print(f"wrote {out / 'sensitivity.md'} and sensitivity.png")


@dataclasses.dataclass(frozen=True)
class Args:
  scale: Literal["mini", "paper"] = "mini"
  """The grid's scale (above)."""
  out: str | None = None
  """The comparison directory (default runs/hyperparameter_sensitivity-<scale>)."""
  jobs: int = 0
  """Cells run at once (0: one per CPU core)."""
  data_dir: str | None = None
  """Where tfds:imagenet2012 is (paper)."""


def main(args: Args) -> int:
  from jaxdl.compare import run_grid
  g = grid(args.scale)
  if args.data_dir:
    g = g.with_run(data_dir=args.data_dir)
  out = f"runs/hyperparameter_sensitivity-{args.scale}" if args.out is None else args.out
  try:
    status = run_grid(g, out, jobs=args.jobs)
  except ConfigError as e:
    print(f"hyperparameter_sensitivity.py: error: {e}", file=sys.stderr)
    return 2
  out = Path(out)
  write(out, args.scale, SCALES[args.scale]["workers"])
  failed = [n for n, s in status.items() if s["status"] == "failed"]
  for n in failed:
    print(f"cell {n} failed: {status[n]['error']}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(script_args(Args, description=__doc__.split("\n\n")[0])))
