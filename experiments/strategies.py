"""The ASU seed's comparison: one device, data parallel, GPipe, model
parallel (the layers cut over devices without micro-batches) and tensor
parallel, each on the mesh engine with the same batch a device.

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
(The seed's ResNet has batch norm, which the pipeline does not cut yet.)
"""
from __future__ import annotations

import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=2").strip()

# pylint: disable=wrong-import-position
from jaxdl.cli import experiment_main  # noqa: E402
from jaxdl.compare import Grid, Variant  # noqa: E402

PIPELINE = (("parallelism", "pipeline"), ("stages", 2))
VARIANTS = (
    Variant("sgd"),  # one device: every table's baseline
    Variant("ar_sgd", name="data"),
    Variant("sgd", (*PIPELINE, ("microbatches", 4)), name="gpipe"),
    Variant("sgd", (*PIPELINE, ("microbatches", 1)), name="model"),
    Variant("sgd", (("parallelism", "tensor"), ("tensor_parallel", 2)), name="tensor"),
)

MESH = (("engine", "mesh"), ("model", "vit"), ("schedule", "constant"), ("seed", 0))
MINI_RUN = (("dataset", "digits"), ("batch_size", 32), ("lr", 0.05), ("epochs", 5.0), *MESH)
PAPER_RUN = (("dataset", "tfds:cifar10"), ("batch_size", 128), ("lr", 0.05),
             ("momentum", 0.9), ("epochs", 20.0), *MESH)


def grid(scale: str) -> Grid:
  """The grid at `scale` ("mini" or "paper")."""
  run = {"mini": MINI_RUN, "paper": PAPER_RUN}.get(scale)
  if run is None:
    raise ValueError(f"--scale {scale!r}: mini or paper")
  return Grid(variants=VARIANTS, workers=(2,), networks=("10gbps",), timing_networks=(),
              run=run)


GRID = grid(os.environ.get("JAXDL_SCALE", "mini"))


if __name__ == "__main__":
  sys.exit(experiment_main(__file__, __doc__, sys.argv[1:]))
