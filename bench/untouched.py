"""Coordinates that no worker moved: does the algorithm leave them as they were?

Each run trains the mlp on digits with its first dense layer frozen (the
optimizer's updates of its 16,640 parameters are zeros: optax.multi_transform
with set_to_zero, tests/helpers.frozen_layer_engine), so no worker ever
moves them. Whatever moves them is the algorithm's own arithmetic: a mean of
equal models that is not exactly that model, an outer gradient that is not
exactly 0. Printed per run: how many of the frozen coordinates moved, in the
evaluated model and in any worker's model, and the largest move (for
diloco, also in units of --outer-lr).

  python -m bench.untouched                                # diloco and the averaging algorithms
  python -m bench.untouched --runs diloco:3:adam local_sgd:7
"""
from __future__ import annotations

import dataclasses
import sys

import jax
import numpy as np
import tyro

from bench.timing import machine
from jaxdl.config import RunConfig
from tests.helpers import frozen_layer_engine, frozen_part

RUNS = (*(f"diloco:{m}:{outer}" for m in (3, 5, 6, 7) for outer in ("nesterov", "sgd", "adam")),
        *(f"local_sgd:{m}" for m in (3, 5, 6, 7)), "gosgd:3", "gosgd:5", "ad_psgd:3",
        "easgd:3")


@dataclasses.dataclass(frozen=True)
class Args:
  runs: tuple[str, ...] = RUNS
  """ALGORITHM:WORKERS[:OUTER_OPTIMIZER] (the last for diloco)."""
  steps: int = 40
  """Steps per run, on the sim engine; diloco's --inner-steps and local_sgd's
  --communication-period are 4 (10 averagings)."""


def models(state, num_workers: int) -> np.ndarray:
  """The frozen layer of each worker's model (diloco's inner model), M x 16,640."""
  workers = state.workers
  stacked = jax.device_get(workers.inner.params if hasattr(workers, "inner") else workers.params)
  return np.stack([frozen_part(jax.tree.map(lambda x, m=m: x[m], stacked))
                   for m in range(num_workers)])


def measure(run: str, steps: int) -> str:
  algorithm, workers, *outer = run.split(":")
  settings = {"diloco": dict(inner_steps=4, outer_optimizer=(outer or ["nesterov"])[0]),
              "local_sgd": dict(communication_period=4),
              "gosgd": dict(gossip_probability=0.5)}.get(algorithm, {})
  config = RunConfig.make(algorithm=algorithm, workers=int(workers), model="mlp", steps=steps,
                          engine="sim", compute_time=1e-3, **settings)
  engine = frozen_layer_engine(config)
  state = engine.init(jax.random.key(0))
  before = models(state, int(workers))[0]  # every worker starts from the same model
  for t in range(steps):
    state, _ = engine.step(state, t)
  after = frozen_part(engine.evaluated(state)[0])
  moved, moved_any = after != before, (models(state, int(workers)) != before).any(axis=0)
  largest = float(np.abs(after - before).max())
  line = (f"{run:<20} evaluated: {moved.sum():>6,} of {moved.size:,} moved, largest "
          f"{largest:.3g}; in a worker's model: {moved_any.sum():>6,}")
  if algorithm == "diloco":
    line += f"; largest / outer lr {largest / config.settings().outer_lr:.3g}"
  return line


def main(args: Args) -> int:
  print(f"machine: {machine()}")
  for run in args.runs:
    print(measure(run, args.steps), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
