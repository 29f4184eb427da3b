"""Stragglers: BSP and the asynchronous algorithms (ASP, SSP s = 3, EASGD
tau = 4, GoSGD p = 0.1, AD-PSGD) with one of 4 workers 4 times slower than
the others, simulated or on real processes slowed for real (`--engine ray`:
each worker sleeps until its batch has taken the modelled time).

  python experiments/stragglers.py                     # simulated, ~1 min on a CPU
  python experiments/stragglers.py --engine ray        # measured: 4 worker processes, ~5 min
  python experiments/stragglers.py --worker-speeds 1 1 1 1 --straggler-prob 0.1 \\
      --straggler-slowdown 4                           # IPDPS'21's: 10% of iterations 4x slower

Scale (``--scale``, or ``JAXDL_SCALE`` for `jaxdl compare --experiment`):

  mini   the mlp on digits, equal batches of 8, plain SGD at lr 0.05, 3
         epochs; 0.05 s a batch at speed 1 (the slow worker's 0.2 s) with
         lognormal jitter 0.1: long against this machine's own compute and
         messages (a few ms), so that on ray the modelled times, not the
         machine, set the pace; at 10 Gb/s on the simulator.

The report (report.md in --out) names the engine; its scaling table gives
each cell's time, waiting and staleness, and each cell's summary.json its
batches per worker and trace.jsonl every padded compute time. Every other
argument is a `jaxdl compare` flag (another worker count needs its own
`--batch-sizes` and `--worker-speeds`); the default ``--out`` is
``runs/stragglers-<scale>``.
"""
from __future__ import annotations

import os
import sys

from jaxdl.cli import experiment_main
from jaxdl.compare import Grid, Variant
from jaxdl.compare.grids import ONE_SLOW_WORKER_RUN

VARIANTS = tuple(map(Variant.parse, ("bsp", "asp", "ssp_s3", "easgd_tau4", "gosgd_p0.1",
                                     "ad_psgd")))

MINI_RUN = ONE_SLOW_WORKER_RUN


def grid(scale: str) -> Grid:
  """The grid at `scale` ("mini")."""
  if scale != "mini":
    raise ValueError(f"--scale {scale!r}: mini")
  return Grid(variants=VARIANTS, workers=(4,), timing_networks=(), run=MINI_RUN,
              emulated=True)


GRID = grid(os.environ.get("JAXDL_SCALE", "mini"))


if __name__ == "__main__":
  sys.exit(experiment_main(__file__, __doc__, sys.argv[1:]))
