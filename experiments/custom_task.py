"""Your own model, loss and data: a Linen regressor trained by asp on four
simulated workers and by bsp on the device mesh.

  python experiments/custom_task.py                 # ~30 s on a CPU
  python experiments/custom_task.py --steps 400 --out runs/custom_task

Nothing here is registered with jaxdl: the model is a Flax Linen module of
this file, the loss a mean squared error with dropout, the data a function of
(worker, step, seed) drawing noisy linear targets. `jaxdl.run(config,
task=...)` writes the same run directory as `jaxdl run` (config, metrics,
trace, checkpoints, summary), and `--resume` works the same way. The script
prints the test loss as it falls, and the loss of always predicting the mean
(the variance of the test targets) to read it against.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jaxdl
from jaxdl.cli import script_args

FEATURES = 8
W_TRUE = np.random.default_rng(0).normal(size=FEATURES).astype(np.float32)


class Regressor(nn.Module):
  """Dense 32, ReLU, dropout, dense 1."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.relu(nn.Dense(32)(x))
    x = nn.Dropout(0.1, deterministic=not train)(x)
    return nn.Dense(1)(x)[:, 0]


def examples(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
  """Noisy linear targets of standard normal features."""
  x = rng.normal(size=(n, FEATURES)).astype(np.float32)
  return {"x": x, "y": (x @ W_TRUE + 0.1 * rng.normal(size=n)).astype(np.float32)}


def make_task(batch_size: int) -> jaxdl.Task:
  model = Regressor()
  init, apply = jaxdl.from_linen(model, np.zeros((1, FEATURES), np.float32))

  def loss(params, model_state, batch, key):
    """Mean squared error, with dropout drawn from the worker's key."""
    pred, model_state = apply(params, model_state, batch["x"], train=True,
                              rngs={"dropout": key})
    return jnp.mean((pred - batch["y"]) ** 2), (model_state, {})

  def evaluate(params, model_state, batch):
    pred, _ = apply(params, model_state, batch["x"])
    return {"mse": jnp.mean((pred - batch["y"]) ** 2),
            "mae": jnp.mean(jnp.abs(pred - batch["y"]))}

  def train(worker: int, step: int, seed: int) -> dict[str, np.ndarray]:
    """A worker's batch: a pure function of (seed, worker, step)."""
    return examples(np.random.default_rng([seed, worker, step]), batch_size)

  test = examples(np.random.default_rng(10**6), 2000)
  return jaxdl.Task(init=init, loss=loss, evaluate=evaluate, train=jaxdl.FunctionData(train, 50),
                    test=test, target="mse", name="linear_regression",
                    info={"mse_of_the_mean": float(np.var(test["y"]))})


@dataclasses.dataclass
class Args:
  steps: int = 200
  """Training steps of each run."""
  batch_size: int = 32
  """Batch size per worker."""
  out: str = "runs/custom_task"
  """Directory of the two run directories."""


RUNS = {"asp, 4 simulated workers": dict(algorithm="asp", workers=4, engine="sim",
                                         compute_time=1e-3, jitter=0.3),
        "bsp, 4 workers on the mesh": dict(algorithm="bsp", workers=4, engine="mesh")}


def main(args: Args) -> dict[str, dict]:
  task = make_task(args.batch_size)
  # The model a run starts from (a run's init key is fold_in(key(seed), 0)).
  start = task.init(jax.random.fold_in(jax.random.key(0), 0))
  initial = float(task.evaluation(*start, task.test.arrays)["mse"])
  summaries = {}
  for label, flags in RUNS.items():
    out = Path(args.out) / flags["algorithm"]
    config = jaxdl.RunConfig.make(steps=args.steps, batch_size=args.batch_size, lr=0.05,
                                  momentum=0.0, schedule="constant", eval_every=args.steps // 5,
                                  out=str(out), overwrite=True, progress=False, **flags)
    summaries[label] = summary = jaxdl.run(config, task=task)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    falling = ", ".join([f"0: {initial:.3f}"] + [f"{r['step']}: {r['test_mse']:.3f}"
                                                 for r in records if "test_mse" in r])
    print(f"{label}: test mse by step {falling} "
          f"(predicting the mean: {summary['mse_of_the_mean']:.3f})")
  return summaries


if __name__ == "__main__":
  main(script_args(Args))
