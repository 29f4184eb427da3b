"""IPDPS'21 Table III: test accuracy of BSP, ASP, SSP (s = 3, 10), EASGD
(tau = 4, 8), GoSGD (p = 1, 0.1, 0.01) and AD-PSGD at 4, 8, 16 and 24 workers,
against one-worker SGD.

  python experiments/ipdps21_table3.py                      # miniature, a few minutes on a CPU
  python experiments/ipdps21_table3.py --scale paper --data-dir DIR   # ResNet-50 / ImageNet
  JAXDL_SCALE=paper jaxdl compare --experiment experiments/ipdps21_table3.py --data-dir DIR

Scales (``--scale``, or ``JAXDL_SCALE`` for `jaxdl compare --experiment`):

  mini   mlp on digits, batch 8 per worker, plain SGD at lr 0.05, 5 epochs,
         simulated cluster (0.2 ms per batch, lognormal jitter 0.1) at 10 Gb/s,
         speedup also at 56 Gb/s (timing-only cells).
  paper  ResNet-50 on ImageNet-1K (``tfds:imagenet2012`` prepared in
         ``--data-dir``), 224 px, batch 32 per worker, SGD with momentum 0.9,
         lr 0.1, divided by 10 at epochs 30, 60 and 80, weight decay
         1e-4, 90 epochs, Titan V workers at 10 Gb/s (timing also at 56 Gb/s).
         The sim engine runs every worker's math on one device: a GPU machine
         and days of time.

Every other argument is a `jaxdl compare` flag (``--out``, ``--jobs``,
``--workers 4,8``, any `jaxdl run` flag such as ``--seed 1``); the default
``--out`` is ``runs/ipdps21_table3-<scale>``. `jaxdl report DIR` redoes the
tables and plots, and judges the paper's findings (FINDINGS) by the cells'
95% intervals over their seeds (``--seeds 0 1 2 3 4``).
"""
from __future__ import annotations

import os
import sys

from jaxdl.cli import experiment_main
from jaxdl.compare import DEFAULT_RUN, IPDPS21_VARIANTS, Finding, Grid, Variant

VARIANTS = (Variant("sgd"), *IPDPS21_VARIANTS)

# The paper's findings on accuracy, at every worker count of its Table III:
# (F1) intermittent communication costs accuracy: EASGD with a longer period,
# GoSGD with a lower gossip probability, SSP with a larger bound are less
# accurate, and ASP (aggregating every iteration) more than EASGD and GoSGD;
# (F2) centralized ASP beats decentralized AD-PSGD.
FINDINGS = tuple(Finding(name, better, worse) for name, better, worse in (
    ("F1", "easgd_tau4", "easgd_tau8"), ("F1", "gosgd_p1", "gosgd_p0.1"),
    ("F1", "gosgd_p0.1", "gosgd_p0.01"), ("F1", "ssp_s3", "ssp_s10"),
    ("F1", "asp", "easgd_tau4"), ("F1", "asp", "gosgd_p0.1"), ("F2", "asp", "ad_psgd")))

PAPER_RUN = (("dataset", "tfds:imagenet2012"), ("image_size", 224), ("model", "resnet50"),
             ("engine", "sim"), ("cluster", "titan-v"), ("batch_size", 32), ("lr", 0.1),
             ("momentum", 0.9), ("weight_decay", 1e-4), ("schedule", "step"),
             ("lr_milestones", (30.0, 60.0, 80.0)), ("warmup_steps", 0), ("epochs", 90.0),
             ("seed", 0))


def grid(scale: str) -> Grid:
  """The grid at `scale` ("mini" or "paper")."""
  if scale == "mini":
    return Grid(variants=VARIANTS, workers=(4, 8, 16, 24), run=DEFAULT_RUN, findings=FINDINGS)
  if scale == "paper":
    return Grid(variants=VARIANTS, workers=(4, 8, 16, 24), run=PAPER_RUN, findings=FINDINGS)
  raise ValueError(f"--scale {scale!r}: mini or paper")


GRID = grid(os.environ.get("JAXDL_SCALE", "mini"))


if __name__ == "__main__":
  sys.exit(experiment_main(__file__, __doc__, sys.argv[1:]))
