"""jaxdl's single-worker training step against a hand-written jax.jit flax+optax step.

Same model, same batch, same optimizer, same process; the arms alternate.
Prints seconds per step and the ratio jaxdl / hand-written (goal <= 1.02).

  python bench/single_step.py                  # cnn 28x28 b128 and mlp 8x8 b32
  python bench/single_step.py --cases resnet18:32:32
"""
from __future__ import annotations

import dataclasses
import functools
import sys

import jax
import numpy as np
import optax
import tyro
from flax import nnx

from bench.timing import interleaved, machine, report
from jaxdl import algorithms
from jaxdl.algorithms import ALGORITHMS, Batch, Problem
from jaxdl.config import RunConfig
from jaxdl.data import ImageFields, WorkerStreams
from jaxdl.data.sources import load_synthetic
from jaxdl.engines import MeshEngine
from jaxdl.models import MODELS, build_model
from jaxdl.optim import make_optimizer
from jaxdl.task import classification


@dataclasses.dataclass(frozen=True)
class Args:
  cases: tuple[str, ...] = ("cnn:28:128", "mlp:8:32")
  """model:image_side:batch, one per case (1 channel below 32 px, 3 from 32 up)."""
  steps: int = 50
  """Steps per arm per round."""
  rounds: int = 7
  """Rounds; each arm's figure is its median over rounds."""


def hand_written_loss(module, graphdef, params, stats, images, labels):
  """Mean cross-entropy of an NNX module from plain-dict states, merged inside
  the trace -> (loss, new batch-norm statistics)."""
  _, param_state, stat_state = nnx.split(module, nnx.Param, nnx.BatchStat)
  nnx.replace_by_pure_dict(param_state, params)
  nnx.replace_by_pure_dict(stat_state, stats)
  model = nnx.merge(graphdef, param_state, stat_state, copy=True)
  logits = model(images, train=True)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  return loss, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat))


def hand_written_step(name: str, image_shape, num_classes: int, lr: float):
  """The step a JAX user writes by hand for speed: nnx.split once, plain-dict
  states through jit (cheaper to flatten than nnx.State), merge inside."""
  module = MODELS.get(name)(image_shape, num_classes, "auto", rngs=nnx.Rngs(0))
  graphdef, params, stats = nnx.split(module, nnx.Param, nnx.BatchStat)
  params, stats = nnx.to_pure_dict(params), nnx.to_pure_dict(stats)
  tx = optax.sgd(lr, momentum=0.9)

  @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
  def step(params, stats, opt_state, images, labels):
    def loss_fn(params):
      return hand_written_loss(module, graphdef, params, stats, images, labels)
    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), stats, opt_state, loss

  return step, [params, stats, tx.init(params)]


def bench_case(case: str, args: Args) -> float:
  name, side, batch = case.split(":")
  side, batch = int(side), int(batch)
  image_shape = (side, side, 3 if side >= 32 else 1)
  rng = np.random.default_rng(0)
  images = jax.device_put(rng.normal(size=(batch, *image_shape)).astype(np.float32))
  labels = jax.device_put(rng.integers(0, 10, batch).astype(np.int32))

  config = RunConfig.make(model=name, lr=0.01, schedule="constant", batch_size=batch)
  problem = Problem(classification(build_model(name, 10, image_shape)),
                    make_optimizer(config.optim, 10**6, 100))
  synthetic = load_synthetic(image_shape, 10, train_size=batch, test_size=1)
  streams = WorkerStreams(ImageFields(synthetic.train), (batch,), seed=0)
  sgd = ALGORITHMS.get("sgd")
  engine = MeshEngine(algorithms.build(sgd, config.settings(), problem, 1), problem, streams,
                      config)
  jaxdl_state = [engine.init(jax.random.key(0))]
  put = lambda x: jax.device_put(x, engine.sharded)
  jaxdl_batch = Batch({"image": put(images), "label": put(labels)},
                put(np.full(batch, 1 / batch, np.float32)), put(np.zeros(2, np.int32)))

  def run_jaxdl(n):
    for _ in range(n):
      jaxdl_state[0], metrics = engine.jitted_step(jaxdl_state[0], jaxdl_batch)
    jax.block_until_ready(metrics)

  step, hand_state = hand_written_step(name, image_shape, 10, 0.01)

  def run_hand(n):
    for _ in range(n):
      *hand_state[:], loss = step(*hand_state, images, labels)
    jax.block_until_ready(loss)

  times = interleaved({"hand-written jit step": run_hand, "jaxdl sgd step": run_jaxdl},
                      args.steps, args.rounds)
  return report(f"{name}, {side}x{side}x{image_shape[2]}, batch {batch}", times,
                baseline="hand-written jit step")


def main(args: Args) -> int:
  print(f"machine: {machine()}")
  ratios = {case: bench_case(case, args) for case in args.cases}
  print("\nratio jaxdl / hand-written (goal <= 1.02): " +
        ", ".join(f"{c}: {r:.3f}" for c, r in ratios.items()))
  return 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
