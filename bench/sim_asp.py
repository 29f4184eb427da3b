"""Simulating M asynchronous workers against one worker's plain jitted step,
and against the floor.

The sim engine batches the workers' gradients (vmap over their stacked pulled
parameter versions), so simulating `asp` with M workers should cost about M
single steps. Prints samples/s of the arms and two ratios: sim / single
(goal >= 0.9), and the sim step's time over the floor's, the same M workers'
gradients and optimizer applies vmapped in one program of their own on
resident batches (what any simulator of M workers computes; goal <= 1.3).
The steady state of a long run: each common signature of step one program
compiled before the clock starts (a run fuses a signature of at least
jaxdl.engines.sim.runner.FUSED_STEPS steps; shorter runs call a step's
segments one by one and spend less on compiling).

  python -m bench.sim_asp                     # cnn 28x28, batch 32, 8 workers
  python -m bench.sim_asp --cases mlp:8:32:8
"""
from __future__ import annotations

import dataclasses
import sys

import jax
import numpy as np
import tyro

from bench.timing import interleaved, machine, report
from jaxdl import algorithms
from jaxdl.algorithms import ALGORITHMS, Batch, Problem
from jaxdl.config import RunConfig
from jaxdl.data import ImageFields, WorkerStreams
from jaxdl.data.sources import ArraySplit
from jaxdl.engines import MeshEngine, SimEngine
from jaxdl.engines.base import slice_of
from jaxdl.models import build_model
from jaxdl.optim import make_optimizer
from jaxdl.task import classification


@dataclasses.dataclass(frozen=True)
class Args:
  cases: tuple[str, ...] = ("cnn:28:32:8", "mlp:8:32:8")
  """model:image_side:batch:workers, one per case."""
  steps: int = 10
  """Sim steps (of M updates each) per arm per round; the single arm takes M times as many."""
  rounds: int = 5
  batchings: tuple[str, ...] = ("auto",)
  """Sim engine batchings to time ("auto", "vmap", "loop", "scan"); the ratio is the first's."""


def parse_case(case: str) -> tuple[str, tuple[int, int, int], int, int, ArraySplit]:
  """"model:side:batch:workers" -> (model, image shape, batch, workers, a split of
  random in-memory images, as digits, mnist and npz are held)."""
  name, side, batch, workers = case.split(":")
  shape = (int(side), int(side), 1)
  rng = np.random.default_rng(0)
  split = ArraySplit(rng.integers(0, 256, (4096, *shape), np.uint8),
                     rng.integers(0, 10, 4096), 1 / 255, np.zeros(1), np.ones(1))
  return name, shape, int(batch), int(workers), split


def bench_case(case: str, args: Args) -> float:
  name, shape, batch, workers, split = parse_case(case)
  side = shape[0]
  config = RunConfig.make(model=name, lr=0.01, momentum=0.0, schedule="constant",
                          batch_size=batch, workers=workers, algorithm="asp", jitter=0.2,
                          compute_time=0.01)
  problem = Problem(classification(build_model(name, 10, shape)),
                    make_optimizer(config.optim, 10**6, 100))
  total = (args.rounds + 2) * args.steps
  streams = WorkerStreams(ImageFields(split), (batch,) * workers, 0)
  asp = algorithms.build(ALGORITHMS.get("asp"), config.settings(), problem, workers)
  arms = {}
  for batching in args.batchings:
    # each common signature of step one program, as in a run of thousands of steps
    # (runner.FUSED_STEPS), compiled before the clock starts (_sim_arm)
    sim = SimEngine(asp, problem, streams, slice_of(config, SimEngine.fields), total,
                    batching=batching, fused_steps=1)
    arms[f"sim asp, {workers} workers, {batching} ({sim.batching})"] = _sim_arm(sim, total)

  one = RunConfig.make(model=name, lr=0.01, momentum=0.0, schedule="constant", batch_size=batch)
  sgd = algorithms.build(ALGORITHMS.get("sgd"), one.settings(), problem, 1)
  single = MeshEngine(sgd, problem, WorkerStreams(ImageFields(split), (batch,), 0),
                      slice_of(one, MeshEngine.fields))
  single_state = [single.init(jax.random.key(0))]
  images, labels = split.gather(np.arange(batch))
  put = lambda x: jax.device_put(x, single.sharded)
  fixed = Batch({"image": put(images), "label": put(labels)},
                put(np.full(batch, 1 / batch, np.float32)), put(np.zeros(2, np.int32)))

  def run_single(n):
    for _ in range(n * workers):  # the same number of updates as n sim steps
      single_state[0], metrics = single.jitted_step(single_state[0], fixed)
    jax.block_until_ready(metrics)

  floor = f"floor: {workers} workers' gradients and applies, vmapped"
  times = interleaved({"one worker, jitted step": run_single, **arms,
                       floor: _floor_arm(problem, workers, split, batch)},
                      args.steps, args.rounds, warmup=1)
  title = f"{name} {side}x{side}, batch {batch}, seconds per {workers} updates"
  first = next(iter(arms))
  # The ratios of the first batching listed.
  over_floor = report(f"{title}, against the floor", {k: times[k] for k in (floor, first)},
                      baseline=floor)
  return 1 / report(title, times, baseline="one worker, jitted step"), over_floor


def _floor_arm(problem: Problem, workers: int, split: ArraySplit, batch: int):
  """n calls of one program: M workers' own gradients on M resident batches,
  each applied by the optimizer to that worker's state, vmapped."""
  states = [jax.vmap(problem.init_state)(jax.random.split(jax.random.key(0), workers))]
  images, labels = split.gather(np.arange(workers * batch))
  batches = Batch({"image": jax.numpy.asarray(images.reshape(workers, batch, *images.shape[1:])),
                   "label": jax.numpy.asarray(labels.reshape(workers, batch))},
                  jax.numpy.full((workers, batch), 1 / batch, np.float32),
                  jax.numpy.zeros((workers, 2), np.int32))

  def one(state, batch):
    grads, model_state, _ = problem.own_gradients(state.params, state.model_state, batch)
    return problem.apply_gradients(state, grads, model_state)
  step = jax.jit(jax.vmap(one), donate_argnums=0)

  def run(n):
    for _ in range(n):
      states[0] = step(states[0], batches)
    jax.block_until_ready(states[0])
  return run


def _sim_arm(sim, total: int):
  """Runs n sim steps from where the last call stopped. The first call runs
  all `total` steps once first, then starts again from step 0: the engine
  compiles a program for each signature of step as it first comes."""
  state = [None, 0]

  def run(n):
    if state[0] is None:
      state[0] = sim.init(jax.random.key(0))
      for step in range(total):
        state[0], _ = sim.step(state[0], step)
      state[0] = sim.init(jax.random.key(0))
    for _ in range(n):
      state[0], _ = sim.step(state[0], state[1])
      state[1] += 1
    jax.block_until_ready(state[0])
  return run


def main(args: Args) -> int:
  print(f"machine: {machine()}")
  ratios = {case: bench_case(case, args) for case in args.cases}
  print("\nsamples/s ratio sim / one worker (goal >= 0.9): " +
        ", ".join(f"{c}: {r:.3f}" for c, (r, _) in ratios.items()))
  print("a sim step's time over the floor's (goal <= 1.3): " +
        ", ".join(f"{c}: {f:.3f}" for c, (_, f) in ratios.items()))
  return 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
