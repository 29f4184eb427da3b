"""The ASU seed's comparison: one device, data parallel, GPipe, model
parallel (the layers cut over devices without micro-batches) and tensor
parallel, each on the mesh engine with the same batch a device (at mini
scale, `jaxdl compare --grid strategies`).

  python experiments/strategies.py                   # miniature, on 2 forced CPU devices
  python experiments/strategies.py --scale paper --data-dir DIR   # the ViT on CIFAR-10

Scales (``--scale``, or ``JAXDL_SCALE`` for `jaxdl compare --experiment`):

  mini   the ViT on digits, batch 32 a worker, 5 epochs.
  paper  the ViT on CIFAR-10 (``tfds:cifar10`` in ``--data-dir``), batch 128
         a worker (the seed's), 20 epochs.

Cells (``sgd``, ``data``, ``gpipe``, ``model``, ``tensor``): sgd on one
device; ar_sgd with 2 workers (the global batch twice one device's, as the
seed's data parallel run); sgd with the ViT in 2 stages and 4 micro-batches
(GPipe) or 1 (the stages one after the other); sgd with the weights split
over 2 devices. Each cell's summary.json gives samples/s, memory per
device (`memory_per_device_bytes`), seconds per epoch, and with
``--target-accuracy`` and ``--price-per-device-hour`` the time and cost to
it. The cells measure wall time: they run one at a time. On a CPU the
devices are forced (XLA_FLAGS, set here) and share its cores: the timings
say more on a machine with a device per worker. Every other argument is a
`jaxdl compare` flag; the default ``--out`` is ``runs/strategies-<scale>``.
(The seed's ResNet: `--model resnet18`, its pipeline's batch norm by
micro-batch, its tensor split's by channels.)
"""
from __future__ import annotations

import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=2").strip()

# pylint: disable=wrong-import-position
from jaxdl.cli import experiment_main  # noqa: E402
from jaxdl.compare import STRATEGIES_GRID, Grid  # noqa: E402

MINI_RUN = STRATEGIES_GRID.run  # `jaxdl compare --grid strategies`
PAPER_RUN = tuple({**dict(MINI_RUN), "dataset": "tfds:cifar10", "batch_size": 128,
                   "momentum": 0.9, "epochs": 20.0}.items())


def grid(scale: str) -> Grid:
  """The grid at `scale` ("mini" or "paper")."""
  run = {"mini": MINI_RUN, "paper": PAPER_RUN}.get(scale)
  if run is None:
    raise ValueError(f"--scale {scale!r}: mini or paper")
  return STRATEGIES_GRID.replace(run=run)


GRID = grid(os.environ.get("JAXDL_SCALE", "mini"))


if __name__ == "__main__":
  sys.exit(experiment_main(__file__, __doc__, sys.argv[1:]))
