"""The two reductions of heterogeneous workers' collectives (--reduce), timed.

The exchange of `--engine ray`'s per-worker programs (jaxdl.engines.host_axis)
sums the M workers' gradients either in host memory (`host`: numpy, in
worker order) or on a device (`device`: each worker's leaves copied to the
accelerator, summed there, the sum copied back). This bench times the two
on the same gradients (a model's parameter shapes, M workers), arms
alternating in one process, prints ms per reduction and the ratio
device / host, and checks that the two sums are equal bit for bit.

The comparison is the Choi seed's (CPU and GPU workers in one synchronous
step): it needs an accelerator. Without one it says so and exits 0;
`--on-cpu` times the device arm on the CPU device instead (a check of the
bench itself, not the seed's comparison).

  python -m bench.reduce                               # mlp, cnn, resnet18; 3 workers
  python -m bench.reduce --models resnet18 --workers 2 4 8
"""
from __future__ import annotations

import dataclasses
import statistics
import sys

import jax
import numpy as np
import tyro

from bench.timing import interleaved, machine
from jaxdl.engines.host_axis import summed
from jaxdl.models import build_model

IMAGE_SHAPES = {"mlp": (8, 8, 1), "cnn": (28, 28, 1)}
"""The models' image shapes here (others: CIFAR's 32x32x3)."""


@dataclasses.dataclass(frozen=True)
class Args:
  models: tuple[str, ...] = ("mlp", "cnn", "resnet18")
  """Models whose parameter shapes the gradients take."""
  workers: tuple[int, ...] = (3,)
  """Worker counts M (the parts of each sum)."""
  rounds: int = 15
  """Rounds; each arm's figure is its median over rounds."""
  steps: int = 5
  """Reductions per arm per round."""
  on_cpu: bool = False
  """Without an accelerator, time the device arm on the CPU device (a check of the bench)."""


def gradients(model: str, workers: int, seed: int = 0) -> list[list[np.ndarray]]:
  """M workers' leaves in the shapes of `model`'s parameters (random float32)."""
  shapes = [x.shape for x in jax.tree.leaves(jax.eval_shape(
      build_model(model, 10, IMAGE_SHAPES.get(model, (32, 32, 3))).init, jax.random.key(0))[0])]
  rng = np.random.default_rng(seed)
  return [[rng.standard_normal(s, dtype=np.float32) for s in shapes] for _ in range(workers)]


def main(args: Args) -> int:
  accelerators = [d for d in jax.devices() if d.platform != "cpu"]
  if not accelerators and not args.on_cpu:
    print(f"no accelerator on this machine ({machine()}): the host / device reduce "
          "comparison needs one; skipped (--on-cpu times the device arm on the CPU)")
    return 0
  device = (accelerators or jax.devices("cpu"))[0]
  print(f"machine: {machine()}; device arm on {device.device_kind} ({device.platform})")
  print(f"{'model':<10}{'M':>4}{'MB per worker':>15}{'host ms':>10}{'device ms':>11}"
        f"{'device / host':>15}  equal")
  for model in args.models:
    for m in args.workers:
      parts = gradients(model, m)
      arms = {"host": lambda n: [summed(parts, "host") for _ in range(n)],
              "device": lambda n: [summed(parts, "device", device) for _ in range(n)]}
      times = interleaved(arms, args.steps, args.rounds)
      host, dev = (1e3 * statistics.median(times[a]) for a in ("host", "device"))
      equal = all(np.array_equal(a, b) for a, b in zip(summed(parts, "host"),
                                                        summed(parts, "device", device)))
      mb = sum(x.nbytes for x in parts[0]) / 1e6
      print(f"{model:<10}{m:>4}{mb:>15.2f}{host:>10.3f}{dev:>11.3f}{dev / host:>15.2f}  "
            f"{'yes' if equal else 'NO'}")
      if not equal:
        return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
