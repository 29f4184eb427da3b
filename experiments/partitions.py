"""Choi (UIUC 2019): one slow and two fast workers in one synchronous step,
the global batch split statically, once from measured speeds, or anew as the
measured batch times move (`--partition static|proportional|adaptive`).

  python experiments/partitions.py                       # miniature, ~25 s on a CPU
  python experiments/partitions.py --seeds 0 1 2 3 4     # mean and 95% interval
  python experiments/partitions.py --seed 1              # another seed
  python experiments/partitions.py --engine ray          # measured: 3 worker processes
                                                         # slowed for real, ~9 min
  python experiments/partitions.py --scale paper --data-dir DIR   # ResNet-18 / CIFAR-10

Scales (``--scale``, or ``JAXDL_SCALE`` for `jaxdl compare --experiment`):

  mini   ar_sgd on the mlp and digits, 3 workers of speeds 1:1.5:1.5 (the
         seed's CPU and two GPUs: its 32/48/48 split of 128 gave equal mean
         batch times, 1.9 s) starting from equal batches of 32 (B = 96), a
         batch of 32 taking 1.9 s at speed 1, 10 epochs, simulated at
         10 Gb/s. Each batch time varies by a lognormal factor of sigma 0.25
         (coefficient of variation 0.25: the seed's three batches give 0.21
         on the CPU, 0.29 on the GPUs), correlated between the workers with
         rho 0.5: the seed gives no correlation one can read (its two GPUs
         are equal in all three batches, the CPU against them -0.38, over
         three batches), so rho is the one that reproduces the seed's mean
         slowest of the three batches, 2.2 s against the 1.9 s mean (1.16 x;
         rho 0.5 at sigma 0.25: 1.15 x).
  paper  ResNet-18 on CIFAR-10 (``tfds:cifar10`` in ``--data-dir``), the
         seed's global batch of 128 starting from its split (32 for the slow
         worker, 48 for each fast one), each taking 1.9 s (2.53 s a batch of
         the mean 42.7 at speed 1), the same speeds and jitter, 30 epochs.

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
from jaxdl.compare import Finding, Grid, Variant

VARIANTS = tuple(Variant("ar_sgd", (("partition", p),))
                 for p in ("static", "proportional", "adaptive"))

# The seed's speeds and batch-time variation; compute_time is per batch of
# the workers' mean size at speed 1, so the seed's 1.9 s for the slow
# worker's 32 is 1.9 s in the miniature (mean 32) and 1.9 x 128 / 96 at
# paper scale (mean 128 / 3).
HETEROGENEOUS = (("engine", "sim"), ("worker_speeds", (1.0, 1.5, 1.5)), ("jitter", 0.25),
                 ("jitter_correlation", 0.5), ("seed", 0))
MINI_RUN = (("dataset", "digits"), ("model", "mlp"), ("batch_sizes", (32, 32, 32)),
            ("compute_time", 1.9), ("epochs", 10.0), *HETEROGENEOUS)
PAPER_RUN = (("dataset", "tfds:cifar10"), ("model", "resnet18"), ("batch_sizes", (32, 48, 48)),
             ("compute_time", 1.9 * 128 / 96), ("lr", 0.1), ("momentum", 0.9),
             ("weight_decay", 5e-4), ("epochs", 30.0), *HETEROGENEOUS)

# The seed: partitioning by speed beats equal batches (a step waits for the
# slowest); adaptive, following the measured times, against proportional.
FINDINGS = tuple(Finding(name, better, worse, figure="samples_per_s") for name, better, worse in (
    ("by speed beats equal batches", "ar_sgd_proportional", "ar_sgd"),
    ("by speed beats equal batches", "ar_sgd_adaptive", "ar_sgd"),
    ("adaptive beats proportional", "ar_sgd_adaptive", "ar_sgd_proportional")))


def grid(scale: str) -> Grid:
  """The grid at `scale` ("mini" or "paper")."""
  run = {"mini": MINI_RUN, "paper": PAPER_RUN}.get(scale)
  if run is None:
    raise ValueError(f"--scale {scale!r}: mini or paper")
  return Grid(variants=VARIANTS, workers=(3,), timing_networks=(), run=run,
              findings=FINDINGS)


GRID = grid(os.environ.get("JAXDL_SCALE", "mini"))


if __name__ == "__main__":
  sys.exit(experiment_main(__file__, __doc__, sys.argv[1:]))
