"""SSP where its bound binds: ASP and SSP (s = 1, 3, 10) with one of 4 workers
4 times slower, so that the fast workers drift ahead of the slow one and
SSP's bound holds them back (IPDPS'21's F1: a large s costs accuracy).

  python experiments/ssp_bound.py --seeds 0 1 2 3 4                  # digits: seconds
  python experiments/ssp_bound.py --dataset fashion_mnist --epochs 2 --seeds 0 1 2 3 4 \
      --out runs/ssp_bound-fashion                                    # ~10 min on 2 cores

In the IPDPS'21 miniature (experiments/ipdps21_table3.py) the server's link
keeps every worker within an iteration or two of the slowest, so the bound
never binds and SSP is ASP there. Here compute dominates (0.05 s a batch at
speed 1, against 0.16 ms for a model on the 10 Gb/s link): the fast workers
make 4 iterations while the slow one makes 1, and the bound decides how far
ahead they run.

Scale (``--scale``, or ``JAXDL_SCALE`` for `jaxdl compare --experiment`):

  mini   the mlp on digits, equal batches of 8, plain SGD at lr 0.05
         (the IPDPS'21 miniature's), 3 epochs, on the sim engine; speeds
         1, 1, 1, 0.25 with lognormal jitter 0.1. The same learning rate
         for every variant: the miniature's rule, not a variant's.

Digits (1,437 training images) is learnt by every variant to within a few
test images, which hides differences of a point; Fashion-MNIST (60,000
28x28 images: Debian's dataset-fashion-mnist, or --data-dir) does not.

The report's scaling table gives each cell's waiting (the time the bound
held its workers) and staleness mean / max. Every other argument is a
`jaxdl compare` flag; the default ``--out`` is ``runs/ssp_bound-<scale>``.
"""
from __future__ import annotations

import os
import sys

from jaxdl.cli import experiment_main
from jaxdl.compare import Finding, Grid, Variant
from jaxdl.compare.grids import ONE_SLOW_WORKER_RUN

VARIANTS = tuple(map(Variant.parse, ("asp", "ssp_s1", "ssp_s3", "ssp_s10")))
# IPDPS'21's F1 for SSP: a larger bound s costs accuracy (ASP is s = infinity).
FINDINGS = tuple(Finding("F1 (SSP)", better, worse) for better, worse in (
    ("ssp_s1", "ssp_s3"), ("ssp_s3", "ssp_s10"), ("ssp_s10", "asp")))

MINI_RUN = ONE_SLOW_WORKER_RUN


def grid(scale: str) -> Grid:
  """The grid at `scale` ("mini")."""
  if scale != "mini":
    raise ValueError(f"--scale {scale!r}: mini")
  return Grid(variants=VARIANTS, workers=(4,), timing_networks=(), run=MINI_RUN,
              findings=FINDINGS)


GRID = grid(os.environ.get("JAXDL_SCALE", "mini"))


if __name__ == "__main__":
  sys.exit(experiment_main(__file__, __doc__, sys.argv[1:]))
