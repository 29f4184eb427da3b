"""Choi (UIUC 2019): one slow and two fast workers in one synchronous step,
the global batch split statically, once from measured speeds, or anew as the
measured batch times move (`--partition static|proportional|adaptive`).

  python experiments/partitions.py                       # miniature, ~25 s on a CPU
  python experiments/partitions.py --seed 1              # another seed
  python experiments/partitions.py --engine ray          # measured: 3 worker processes
                                                         # slowed for real, ~9 min
  python experiments/partitions.py --scale paper --data-dir DIR   # ResNet-18 / CIFAR-10

Scales (``--scale``, or ``JAXDL_SCALE`` for `jaxdl compare --experiment`):

  mini   ar_sgd on the mlp and digits, 3 workers of speeds 1:3:3 starting
         from equal batches of 32 (B = 96), a batch of 32 taking 1.9 s at
         speed 1 with lognormal jitter 0.15 (the seed's 1.4-2.5 s around
         1.9 s), 10 epochs, simulated at 10 Gb/s.
  paper  ResNet-18 on CIFAR-10 (``tfds:cifar10`` in ``--data-dir``), the
         seed's global batch of 128 starting from its split (32 for the slow
         worker, 48 for each fast one), the same speeds and jitter, 30 epochs.

The report (report.md in --out) has the table "Partitions of the global
batch": time per epoch, the workers' idle share and each worker's batch
seconds; batch_times.png draws each worker's batch-time histogram. Every
other argument is a `jaxdl compare` flag; the default ``--out`` is
``runs/partitions-<scale>``.
"""
from __future__ import annotations

import os
import sys

from jaxdl.cli import experiment_main
from jaxdl.compare import Grid, Variant

VARIANTS = tuple(Variant("ar_sgd", (("partition", p),))
                 for p in ("static", "proportional", "adaptive"))

HETEROGENEOUS = (("engine", "sim"), ("worker_speeds", (1.0, 3.0, 3.0)),
                 ("compute_time", 1.9), ("jitter", 0.15), ("seed", 0))
MINI_RUN = (("dataset", "digits"), ("model", "mlp"), ("batch_sizes", (32, 32, 32)),
            ("epochs", 10.0), *HETEROGENEOUS)
PAPER_RUN = (("dataset", "tfds:cifar10"), ("model", "resnet18"), ("batch_sizes", (32, 48, 48)),
             ("lr", 0.1), ("momentum", 0.9), ("weight_decay", 5e-4), ("epochs", 30.0),
             *HETEROGENEOUS)


def grid(scale: str) -> Grid:
  """The grid at `scale` ("mini" or "paper")."""
  run = {"mini": MINI_RUN, "paper": PAPER_RUN}.get(scale)
  if run is None:
    raise ValueError(f"--scale {scale!r}: mini or paper")
  return Grid(variants=VARIANTS, workers=(3,), timing_networks=(), run=run)


GRID = grid(os.environ.get("JAXDL_SCALE", "mini"))


if __name__ == "__main__":
  sys.exit(experiment_main(__file__, __doc__, sys.argv[1:]))
