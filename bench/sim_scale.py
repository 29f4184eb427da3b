"""Simulating many workers: samples/s and peak memory against M = 1.

Each case runs in a process of its own (its peak resident memory is its
own): the sim engine's `asp` or `gosgd` with M simulated workers on the mlp
(synthetic 8x8 images, batch 8 a worker), a number of steps after as many
of warm-up (the engine compiles a step's programs as their ops first
come). Prints samples/s (simulated updates' examples per wall second) and
its ratio to M = 1, the process's peak memory, the workers' states' bytes
(what memory should grow with), the seconds of compiling that fell in
the timed steps, and the peak memory before the states exist (the engine
built: data, schedule, plans) and once they are initialized. Then, for each
algorithm, how much the peak grew against how much the states grew (goal:
at most 1.0): from the first M to the last, which counts what a run of
more workers holds once (more programs compiled, say), and between the last
two, the growth per worker at scale.

  python -m bench.sim_scale                          # asp and gosgd, M = 1, 64, 256, 1024, 4096
  python -m bench.sim_scale --algorithms asp --workers 1 64
"""
from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import time

import tyro


@dataclasses.dataclass(frozen=True)
class Args:
  algorithms: tuple[str, ...] = ("asp", "gosgd")
  workers: tuple[int, ...] = (1, 64, 256, 1024, 4096)
  steps: int = 5
  """Sim steps timed (each M updates), after as many of warm-up."""
  case: str | None = None
  """(internal) "ALGORITHM:M": run one case in this process and print its JSON."""


def run_case(algorithm: str, workers: int, steps: int) -> dict:
  import jax
  import numpy as np

  from jaxdl import algorithms
  from jaxdl.algorithms import ALGORITHMS, Problem
  from jaxdl.config import RunConfig
  from jaxdl.data import ImageFields, WorkerStreams
  from jaxdl.data.sources import ArraySplit
  from jaxdl.engines import SimEngine
  from jaxdl.engines.base import slice_of
  from jaxdl.models import build_model
  from jaxdl.optim import make_optimizer
  from jaxdl.task import classification

  batch, shape = 8, (8, 8, 1)
  rng = np.random.default_rng(0)
  size = max(4096, 4 * workers * batch)  # each worker's shard: 4 batches
  split = ArraySplit(rng.integers(0, 256, (size, *shape), np.uint8),
                     rng.integers(0, 10, size), 1 / 255, np.zeros(1), np.ones(1))
  config = RunConfig.make(model="mlp", lr=0.01, momentum=0.0, schedule="constant",
                          batch_size=batch, workers=workers, algorithm=algorithm, jitter=0.2,
                          compute_time=0.01)
  problem = Problem(classification(build_model("mlp", 10, shape)),
                    make_optimizer(config.optim, 10**6, 100))
  spec = ALGORITHMS.get(algorithm)
  built = algorithms.build(spec, config.settings(), problem, workers)
  streams = WorkerStreams(ImageFields(split), (batch,) * workers, 0)
  sim = SimEngine(built, problem, streams, slice_of(config, SimEngine.fields), 2 * steps)
  rss_mb = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  setup_mb = rss_mb()
  state = sim.init(jax.random.key(0))
  jax.block_until_ready(state)
  init_mb = rss_mb()
  for t in range(steps):  # warm-up: the step's programs compile as their ops first come
    state, _ = sim.step(state, t)
  jax.block_until_ready(state)
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, seconds, **kw: compiles.append(seconds)
      if event == "/jax/core/compile/backend_compile_duration" else None)
  start = time.perf_counter()
  for t in range(steps, 2 * steps):
    state, _ = sim.step(state, t)
  jax.block_until_ready(state)
  seconds = time.perf_counter() - start
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state.workers))
  return {"algorithm": algorithm, "workers": workers,
          "samples_per_s": steps * workers * batch / seconds,
          "compile_s": sum(compiles),  # of the timed steps' seconds
          "peak_rss_mb": rss_mb(), "setup_peak_mb": setup_mb, "init_peak_mb": init_mb,
          "worker_state_mb": state_bytes / 1e6}


def main(args: Args) -> int:
  if args.case:
    algorithm, workers = args.case.split(":")
    print(json.dumps(run_case(algorithm, int(workers), args.steps)))
    return 0
  from bench.timing import machine
  print(f"machine: {machine()}")
  print(f"{'algorithm':<10}{'M':>6}{'samples/s':>12}{'vs M=1':>8}{'peak MB':>9}"
        f"{'states MB':>11}{'compile s':>11}{'setup MB':>10}{'init MB':>9}")
  growth = []
  for algorithm in args.algorithms:
    base, runs = None, []
    for m in args.workers:
      out = subprocess.run([sys.executable, "-m", "bench.sim_scale", "--case",
                            f"{algorithm}:{m}", "--steps", str(args.steps)],
                           capture_output=True, text=True, check=False)
      if out.returncode:
        print(f"{algorithm:<10}{m:>6}  failed: {out.stderr.strip().splitlines()[-1:]}")
        continue
      r = json.loads(out.stdout.strip().splitlines()[-1])
      base = base or r["samples_per_s"]
      runs.append(r)
      print(f"{algorithm:<10}{m:>6}{r['samples_per_s']:>12,.0f}"
            f"{r['samples_per_s'] / base:>8.3f}{r['peak_rss_mb']:>9.0f}"
            f"{r['worker_state_mb']:>11.1f}{r['compile_s']:>11.2f}"
            f"{r['setup_peak_mb']:>10.0f}{r['init_peak_mb']:>9.0f}", flush=True)
    spans = [(runs[0], runs[-1]), (runs[-2], runs[-1])][:len(runs) - 1] if len(runs) > 1 else []
    for first, last in spans:
      peak = last["peak_rss_mb"] - first["peak_rss_mb"]
      states = last["worker_state_mb"] - first["worker_state_mb"]
      growth.append(f"{algorithm}: from M = {first['workers']} to {last['workers']}, peak "
                    f"+{peak:.0f} MB for +{states:.0f} MB of states: {peak / states:.2f} x")
  for line in growth:
    print(line)
  return 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
