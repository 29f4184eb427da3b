"""Pipeline parallelism's throughput against its ideal; tensor parallelism's
against data parallelism's.

One worker's model (the ViT by default) cut into p stages on p devices
(--parallelism pipeline), each batch into m micro-batches: its samples/s
against the same model whole on one device, both jaxdl's sgd step on the
mesh engine with the same synthetic batch, arms alternating in one process.
A perfectly balanced pipeline with free communication would run
p m / (m + p - 1) x the one device's samples/s (each stage does 1/p of the
work, and idles (p - 1) of its m + p - 1 ticks): the bench prints the
measured speedup, that ideal, and their ratio, for GPipe and 1F1B.

Runs on 8 forced CPU devices (--xla_force_host_platform_device_count=8,
set here before jax is imported unless XLA_FLAGS already sets a count). On
a machine with fewer cores than stages the devices share the cores, and the
speedup is bounded by the cores, not by the bubble.

Tensor parallelism (--parallelism tensor, one worker's weights over k
devices) against data parallelism on as many devices (ar_sgd, k workers of
batch / k: the same global batch), both against the one device: the bench
prints both speedups and their ratio.

  python -m bench.pipeline                       # vit, 32x32x3, batch 64
  python -m bench.pipeline --stages 2 4 --microbatches 1 4 8 --rounds 9
  python -m bench.pipeline --stages --tensor 2 4 8   # tensor against data only
"""
from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()

# pylint: disable=wrong-import-position
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import tyro  # noqa: E402

from bench.timing import interleaved, machine  # noqa: E402
from jaxdl.runner import setup  # noqa: E402
from jaxdl.config import RunConfig  # noqa: E402
from jaxdl.parallel.pipeline import bubble_fraction  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
  model: str = "vit"
  """A model with stages: mlp, cnn or vit."""
  image_size: int = 32
  """Side of the synthetic square images (3 channels)."""
  batch: int = 64
  """Examples a step (one worker)."""
  stages: tuple[int, ...] = (2, 4)
  """Stage counts p."""
  microbatches: tuple[int, ...] = (1, 4, 8)
  """Micro-batch counts m (each must divide --batch)."""
  schedules: tuple[str, ...] = ("gpipe", "1f1b")
  """Pipeline schedules."""
  tensor: tuple[int, ...] = (2, 4)
  """Tensor-parallel device counts k (each also the data-parallel arm's workers)."""
  steps: int = 3
  """Steps per arm per round."""
  rounds: int = 7
  """Rounds; each arm's figure is its median over rounds."""


def arm(args: Args, **settings) -> tuple:
  """A `run(n)` of n training steps on the mesh engine (one worker's sgd
  unless `settings` say otherwise), and the engine."""
  settings = {"algorithm": "sgd", "batch_size": args.batch, **settings}
  config = RunConfig.make(model=args.model, dataset="synthetic", image_size=args.image_size,
                          schedule="constant", steps=10**6, progress=False, **settings)
  engine = setup(config).engine
  state = [engine.init(jax.random.key(0))]
  batch = engine.batch(0)

  def run(n: int) -> None:
    for _ in range(n):
      state[0], metrics = engine.jitted_step(state[0], batch)
    jax.block_until_ready(metrics)
  return run, engine


def main(args: Args) -> int:
  print(f"machine: {machine()}; {args.model} {args.image_size}x{args.image_size}x3, "
        f"batch {args.batch}, {os.cpu_count()} cores")
  whole, _ = arm(args)
  print(f"{'schedule':<8}{'p':>3}{'m':>4}{'ms/step':>10}{'speedup':>9}{'ideal':>7}"
        f"{'ratio':>7}{'bubble':>8}")
  for schedule in args.schedules:
    for p in args.stages:
      for m in args.microbatches:
        piped, engine = arm(args, parallelism="pipeline", stages=p, microbatches=m,
                            pipeline_schedule=schedule)
        times = interleaved({"whole": whole, "pipeline": piped}, args.steps, args.rounds)
        one, many = (statistics.median(times[k]) for k in ("whole", "pipeline"))
        ideal = p * m / (m + p - 1)
        print(f"{schedule:<8}{p:>3}{m:>4}{1e3 * many:>10.2f}{one / many:>9.2f}{ideal:>7.2f}"
              f"{one / many / ideal:>7.2f}{bubble_fraction(p, m):>8.2f}")
        del engine
  if args.tensor:
    print(f"\n{'k':>3}{'tensor ms/step':>16}{'speedup':>9}{'data ms/step':>14}{'speedup':>9}"
          f"{'tensor/data':>13}")
  for k in args.tensor:
    split, _ = arm(args, parallelism="tensor", tensor_parallel=k)
    data, _ = arm(args, algorithm="ar_sgd", workers=k, batch_size=args.batch // k)
    times = interleaved({"whole": whole, "tensor": split, "data": data}, args.steps,
                        args.rounds)
    one, t, d = (statistics.median(times[a]) for a in ("whole", "tensor", "data"))
    print(f"{k:>3}{1e3 * t:>16.2f}{one / t:>9.2f}{1e3 * d:>14.2f}{one / d:>9.2f}{d / t:>13.2f}")
  return 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
