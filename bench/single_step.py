"""jaxdl's single-worker and bsp training steps against a hand-written jax.jit flax+optax step.

Same model, same batch, same optimizer, same process; the arms alternate.
Prints ms per step and samples/s of each arm and the ratio jaxdl /
hand-written (goal <= 1.02), in float32 and, with --dtypes, in bfloat16
(--compute-dtype bfloat16: parameters cast to it in the step, kept float32;
the hand-written step casts the same way). Runs on the default device, a GPU
where jax has one.

  python -m bench.single_step                  # cnn 28x28 b128 and mlp 8x8 b32
  python -m bench.single_step --cases resnet18:32:256 --dtypes float32 bfloat16 \
      --algorithms sgd bsp                     # the GPU case
"""
from __future__ import annotations

import dataclasses
import functools
import statistics
import sys

import jax
import jax.numpy as jnp
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
from jaxdl.engines.base import slice_of
from jaxdl.models import MODELS, build_model, resolve_stem
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
  dtypes: tuple[str, ...] = ("float32",)
  """Compute dtypes (--compute-dtype), each case timed in each."""
  algorithms: tuple[str, ...] = ("sgd",)
  """jaxdl's arms: sgd (one worker) and bsp (one worker: the push and the
  server's aggregation around the same gradient)."""


def hand_written_loss(module, graphdef, params, stats, images, labels, dtype=jnp.float32):
  """Mean cross-entropy of an NNX module from plain-dict states, merged inside
  the trace, computing in ``dtype`` (float32 parameters cast to it, logits
  back to float32) -> (loss, new batch-norm statistics)."""
  params, images = jax.tree.map(lambda x: x.astype(dtype), (params, images))
  _, param_state, stat_state = nnx.split(module, nnx.Param, nnx.BatchStat)
  nnx.replace_by_pure_dict(param_state, params)
  nnx.replace_by_pure_dict(stat_state, stats)
  model = nnx.merge(graphdef, param_state, stat_state, copy=True)
  logits = model(images, train=True).astype(jnp.float32)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  return loss, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat))


def hand_written_step(name: str, image_shape, num_classes: int, lr: float,
                      dtype=jnp.float32):
  """The step a JAX user writes by hand for speed: nnx.split once, plain-dict
  states through jit (cheaper to flatten than nnx.State), merge inside."""
  module = MODELS.get(name)(image_shape, num_classes, resolve_stem("auto", image_shape),
                           rngs=nnx.Rngs(0))
  graphdef, params, stats = nnx.split(module, nnx.Param, nnx.BatchStat)
  params, stats = nnx.to_pure_dict(params), nnx.to_pure_dict(stats)
  tx = optax.sgd(lr, momentum=0.9)

  @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
  def step(params, stats, opt_state, images, labels):
    def loss_fn(params):
      return hand_written_loss(module, graphdef, params, stats, images, labels, dtype)
    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), stats, opt_state, loss

  return step, [params, stats, tx.init(params)]


def jaxdl_step(algorithm: str, name: str, image_shape, batch: int, dtype: str,
               images: jax.Array, labels: jax.Array):
  """``run(n)``: n of jaxdl's `algorithm` steps (the mesh engine's jitted step,
  one worker, state donated) on the given device-resident batch."""
  config = RunConfig.make(algorithm=algorithm, model=name, lr=0.01, schedule="constant",
                          batch_size=batch, compute_dtype=dtype)
  problem = Problem(classification(build_model(name, 10, image_shape, compute_dtype=dtype)),
                    make_optimizer(config.optim, 10**6, 100))
  synthetic = load_synthetic(image_shape, 10, train_size=batch, test_size=1)
  streams = WorkerStreams(ImageFields(synthetic.train), (batch,), seed=0)
  engine = MeshEngine(algorithms.build(ALGORITHMS.get(algorithm), config.settings(), problem,
                                       1), problem, streams, slice_of(config, MeshEngine.fields))
  state = [engine.init(jax.random.key(0))]
  put = lambda x: jax.device_put(x, engine.sharded)
  jaxdl_batch = Batch({"image": put(images), "label": put(labels)},
                      put(np.full(batch, 1 / batch, np.float32)), put(np.zeros(2, np.int32)))

  def run(n):
    for _ in range(n):
      state[0], metrics = engine.jitted_step(state[0], jaxdl_batch)
    jax.block_until_ready(metrics)
  return run


def bench_case(case: str, dtype: str, args: Args) -> dict[str, float]:
  """Times one case in one dtype; returns each jaxdl arm's ratio to the hand-written step."""
  name, side, batch = case.split(":")
  side, batch = int(side), int(batch)
  image_shape = (side, side, 3 if side >= 32 else 1)
  rng = np.random.default_rng(0)
  images = jax.device_put(rng.normal(size=(batch, *image_shape)).astype(np.float32))
  labels = jax.device_put(rng.integers(0, 10, batch).astype(np.int32))

  step, hand_state = hand_written_step(name, image_shape, 10, 0.01, jnp.dtype(dtype))

  def run_hand(n):
    for _ in range(n):
      *hand_state[:], loss = step(*hand_state, images, labels)
    jax.block_until_ready(loss)

  hand = "hand-written jit step"
  arms = {hand: run_hand}
  for algorithm in args.algorithms:
    arms[f"jaxdl {algorithm} step"] = jaxdl_step(algorithm, name, image_shape, batch, dtype,
                                                 images, labels)
  times = interleaved(arms, args.steps, args.rounds)
  report(f"{name}, {side}x{side}x{image_shape[2]}, batch {batch}, {dtype}", times,
         baseline=hand)
  for arm, ts in times.items():
    print(f"  {arm:<26}{batch / statistics.median(ts):>12,.0f} samples/s")
  base = statistics.median(times[hand])
  return {arm: statistics.median(ts) / base for arm, ts in times.items() if arm != hand}


def main(args: Args) -> int:
  print(f"machine: {machine()}")
  ratios = {(case, dtype): bench_case(case, dtype, args)
            for case in args.cases for dtype in args.dtypes}
  print("\nratio jaxdl / hand-written (goal <= 1.02):")
  for (case, dtype), arms in ratios.items():
    print(f"  {case} {dtype}: " + ", ".join(f"{arm} {r:.3f}" for arm, r in arms.items()))
  return 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
