"""IPDPS'21 scalability: throughput speedup over one worker of BSP, AR-SGD, ASP,
SSP, EASGD, GoSGD and AD-PSGD for ResNet-50 and VGG-16 (ImageNet, 224 px,
1000 classes, batch 32 per worker) on up to 24 Titan V at 10 and 56 Gb/s.

  python experiments/scalability.py                  # --scale paper: 1-24 workers, ~1 min on a CPU
  python experiments/scalability.py --scale mini     # 4, 8, 16, 24 workers, ResNet-50 only
  python experiments/scalability.py --out runs/scalability --steps 200

Timing only, like ``jaxdl run --dry-run``, but through the Python API: each
model's per-batch compute time is XLA's FLOP count of one worker's gradient
over the Titan V profile's achieved FLOP/s (computed once per model, as the
sim engine does), and each (algorithm, workers, network) is the simulated
schedule of `--steps` steps (`jaxdl.engines.sim.make_schedule`), without
building the model again; this is the same schedule a dry run of that cell
makes. Speedup = samples per simulated second / one-worker SGD's. SSP uses
s = 3, EASGD tau = 4, GoSGD p = 1 (the most communication of the paper's
settings), with the defaults of `jaxdl run` for the rest (latency 50 us, one
server shard, no jitter). With equal workers and no jitter the seed enters
only through the algorithms' own draws (GoSGD's and AD-PSGD's peers):
``--seeds 0 1 2`` gives each cell's mean speedup and, where the seeds
differ, its 95% interval. Writes ``speedup.md``, ``speedup.json`` and
``speedup.png`` into --out.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import sys
import types
from pathlib import Path
from typing import Literal

import numpy as np
import optax

from jaxdl import RunConfig, algorithms, cluster
from jaxdl.algorithms import Problem
from jaxdl.cli import script_args
from jaxdl.validation import validate
from jaxdl.engines.sim import flops_per_batch, make_schedule
from jaxdl.models import build_model
from jaxdl.report.intervals import Interval
from jaxdl.trace import step_ends
from jaxdl.task import classification

# (label, algorithm, settings)
ALGORITHMS = (("bsp", "bsp", {}), ("ar_sgd", "ar_sgd", {}), ("asp", "asp", {}),
              ("ssp_s3", "ssp", {"staleness_bound": 3}),
              ("easgd_tau4", "easgd", {"communication_period": 4}),
              ("gosgd_p1", "gosgd", {"gossip_probability": 1.0}), ("ad_psgd", "ad_psgd", {}))


@dataclasses.dataclass(frozen=True)
class Args:
  scale: Literal["paper", "mini"] = "paper"
  """paper: ResNet-50 and VGG-16 at 1, 2, 4, 8, 12, 16, 20, 24 workers; mini: ResNet-50 at 4, 8, 16, 24."""
  out: str = "runs/scalability"
  """Directory for speedup.md, speedup.json and speedup.png."""
  steps: int = 100
  """Simulated steps per cell (M updates each)."""
  batch_size: int = 32
  """Batch per worker."""
  cluster: str = "titan-v"
  """Device profile of the workers."""
  classes: int = 1000
  """Classes of the output layer (ImageNet-1K; `jaxdl run --dataset synthetic` has 10)."""
  networks: tuple[str, ...] = ("10gbps", "56gbps")
  seeds: tuple[int, ...] = (0,)
  """Seeds of each cell (its --seed): the mean speedup, and its 95% interval where they differ."""


def model_costs(name: str, batch: int, profile: str, classes: int) -> tuple[float, int]:
  """(seconds of one worker's gradient on `batch` images, bytes of the model)."""
  model = build_model(name, classes, (224, 224, 3), "auto")
  problem = Problem(classification(model), optax.sgd(0.1))
  streams = types.SimpleNamespace(  # all that flops_per_batch reads
      batch_sizes=(batch,), example={"image": np.zeros((1, 224, 224, 3), np.float32),
                                     "label": np.zeros(1, np.int32)})
  flops = flops_per_batch(problem, streams)
  return flops / cluster.achieved_flops(profile), problem.model_bytes()


@functools.cache
def _stand_in() -> Problem:
  """A small model to build algorithms' family records with (see `throughput`)."""
  return Problem(classification(build_model("mlp", 10, (8, 8, 1))), optax.sgd(0.1))


def throughput(algorithm: str, settings: dict, workers: int, network: str, compute_s: float,
               model_bytes: int, args: Args, seed: int = 0) -> float:
  """Samples per simulated second of `steps` steps of this schedule."""
  config = RunConfig.make(algorithm=algorithm, workers=workers, network=network, engine="sim",
                          batch_size=args.batch_size, steps=args.steps, dry_run=True,
                          seed=seed, **settings)
  spec = validate(config).spec
  # The schedule reads the family's declared policy (sync mode, period,
  # staleness bound, probability), which the settings alone decide; the
  # model's size enters through the cost model. So the algorithm is built for a
  # small stand-in model: building it for ResNet-50 costs seconds a cell.
  alg = algorithms.build(spec, config.settings(), _stand_in(), workers)
  c = config.cluster
  cost = cluster.CostModel.build(workers, model_bytes, compute_s=compute_s, network=network,
                             latency=c.latency, servers=c.servers, speeds=(1.0,) * workers,
                             jitter=c.jitter, straggler_prob=c.straggler_prob,
                             straggler_slowdown=c.straggler_slowdown, seed=seed)
  events = list(make_schedule(alg, cost, args.steps, (args.batch_size,) * workers))
  end = events[step_ends(events, workers)[args.steps - 1]].time
  return args.steps * workers * args.batch_size / end


def main(args: Args) -> int:
  paper = args.scale == "paper"
  models = ("resnet50", "vgg16") if paper else ("resnet50",)
  workers = (1, 2, 4, 8, 12, 16, 20, 24) if paper else (4, 8, 16, 24)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  results, text = {}, {}  # mean speedups; their table entries (interval where seeds differ)
  for model in models:
    compute_s, nbytes = model_costs(model, args.batch_size, args.cluster, args.classes)
    print(f"{model}: {compute_s * 1e3:.1f} ms per batch of {args.batch_size} on "
          f"{args.cluster}, {nbytes / 1e6:.1f} MB", flush=True)
    for net in args.networks:
      base = throughput("sgd", {}, 1, net, compute_s, nbytes, args)
      for name, algorithm, settings in ALGORITHMS:
        for m in workers:
          speedups = [throughput(algorithm, settings, m, net, compute_s, nbytes, args, seed)
                      / base for seed in args.seeds]
          results.setdefault(model, {}).setdefault(net, {}).setdefault(name, {})[m] = \
              float(np.mean(speedups))
          text[model, net, name, m] = (f"{speedups[0]:.2f}" if len(set(speedups)) == 1
                                       else f"{Interval.of(speedups):.2f}")
    results[model]["compute_s"], results[model]["model_mb"] = compute_s, nbytes / 1e6
  (out / "speedup.json").write_text(json.dumps(results, indent=1))
  seeds = ("" if len(args.seeds) == 1 else f"; mean over seeds {', '.join(map(str, args.seeds))},"
           " ± its 95% interval where they differ")
  lines = [f"# Speedup over one worker (timing-only simulation, batch {args.batch_size} "
           f"per worker, {args.cluster}, {args.steps} steps{seeds})\n"]
  for model in models:
    r = results[model]
    for net in args.networks:
      lines += [f"\n### {model} ({r['compute_s'] * 1e3:.1f} ms/batch, {r['model_mb']:.1f} MB), "
                f"{net}\n", "| workers | " + " | ".join(a[0] for a in ALGORITHMS) + " |",
                "|---|" + "---|" * len(ALGORITHMS)]
      lines += [f"| {m} | " + " | ".join(text[model, net, a[0], m] for a in ALGORITHMS) + " |"
                for m in workers]
  (out / "speedup.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  _plot(results, models, args.networks, workers, out / "speedup.png")
  print(f"wrote {out / 'speedup.md'}, speedup.json, speedup.png")
  return 0


def _plot(results, models, networks, workers, path: Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(len(models), len(networks), squeeze=False, sharey=True,
                           figsize=(5 * len(networks), 4 * len(models)))
  for i, model in enumerate(models):
    for j, net in enumerate(networks):
      ax = axes[i][j]
      for name, *_ in ALGORITHMS:
        ax.plot(workers, [results[model][net][name][m] for m in workers], marker="o", label=name)
      ax.plot(workers, workers, "k:", label="linear")
      ax.set_title(f"{model}, {net}")
      ax.set_xlabel("workers")
      ax.grid(alpha=0.3)
    axes[i][0].set_ylabel("speedup over 1 worker")
  axes[0][-1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)


if __name__ == "__main__":
  sys.exit(main(script_args(Args)))
