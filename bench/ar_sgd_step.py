"""jaxdl's AR-SGD step on a device mesh against a hand-written data-parallel step.

1. jaxdl's `ar_sgd` step (MeshEngine.jitted_step, one worker per device) against
   the data-parallel step a JAX user writes by hand: `jax.jit(jax.shard_map(...))`,
   each device's loss on its shard of the batch, `lax.pmean` of the gradients,
   `optax.sgd(momentum=0.9)`, parameters and optimizer state replicated. Same
   model, same device-resident global batch, same process; the arms alternate.
   Checks once that both arms' losses agree after a few identical steps, and
   prints the ratio jaxdl / hand-written (goal <= 1.02).
2. The same jaxdl step on 1, 2, 4, 8 devices (one worker each, the global batch
   fixed): ms per step, samples/s, speedup over 1 device.

Runs on 8 CPU devices (--xla_force_host_platform_device_count=8, set here
before jax is imported unless XLA_FLAGS already sets a device count).

  python -m bench.ar_sgd_step                 # cnn 28x28 and mlp 8x8, global batch 256
  python -m bench.ar_sgd_step --cases cnn:28:256 --devices 8 --rounds 9
"""
from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()

# pylint: disable=wrong-import-position
import collections  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402

import flax  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import tyro  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from bench.single_step import hand_written_loss  # noqa: E402
from bench.timing import interleaved, machine, report  # noqa: E402
from jaxdl import algorithms  # noqa: E402
from jaxdl.algorithms import ALGORITHMS, Batch, Problem  # noqa: E402
from jaxdl.config import RunConfig  # noqa: E402
from jaxdl.data import ImageFields, WorkerStreams  # noqa: E402
from jaxdl.data.sources import load_synthetic  # noqa: E402
from jaxdl.engines import MeshEngine  # noqa: E402
from jaxdl.engines.base import slice_of  # noqa: E402
from jaxdl.models import MODELS, build_model, resolve_stem  # noqa: E402
from jaxdl.optim import make_optimizer  # noqa: E402
from jaxdl.task import classification

LR, NUM_CLASSES, SEED = 0.01, 10, 0


@dataclasses.dataclass(frozen=True)
class Args:
  cases: tuple[str, ...] = ("cnn:28:256", "mlp:8:256")
  """model:image_side:global_batch, one per case (1 channel below 32 px, 3 from 32 up)."""
  devices: tuple[int, ...] = (1, 2, 4, 8)
  """Device counts of the scaling table (one worker per device); the largest is
  the one jaxdl runs on against the hand-written step."""
  steps: int | None = None
  """Steps per arm per round; unset: as many as take about --round-seconds."""
  round_seconds: float = 0.5
  """Target length of one arm's round when --steps is unset."""
  rounds: int = 25
  """Rounds; each arm's figure is its median over rounds."""
  in_flight: int = MeshEngine.MAX_IN_FLIGHT
  """Steps left running while the host dispatches the next, in both arms (as
  MeshEngine.step; 0: wait on every step). Bounded: many collectives in flight
  deadlock forced CPU devices."""
  check_steps: int = 5
  """Identical steps both arms take before their losses are compared."""
  check_tol: float = 1e-5
  """Largest |loss difference| the check accepts."""


def bounded(step: Callable[[], jax.Array], in_flight: int) -> Callable[[int], None]:
  """`run(n)`: n calls of `step`, waiting on the oldest output past `in_flight`."""
  def run(n: int) -> None:
    pending: collections.deque = collections.deque()
    for _ in range(n):
      pending.append(step())
      if len(pending) > in_flight:
        jax.block_until_ready(pending.popleft())
    jax.block_until_ready(list(pending))
  return run


class JaxdlArm:
  """jaxdl's ar_sgd step, `devices` workers on as many devices, fixed batch."""

  def __init__(self, name: str, image_shape, images: np.ndarray, labels: np.ndarray,
               devices: int):
    batch = len(labels)
    config = RunConfig.make(model=name, lr=LR, momentum=0.9, schedule="constant",
                            algorithm="ar_sgd", workers=devices,
                            batch_size=batch // devices)
    problem = Problem(classification(build_model(name, NUM_CLASSES, image_shape)),
                      make_optimizer(config.optim, 10**6, 100))
    synthetic = load_synthetic(image_shape, NUM_CLASSES, train_size=batch, test_size=1)
    streams = WorkerStreams(ImageFields(synthetic.train),
                            (batch // devices,) * devices, seed=SEED)
    ar_sgd = algorithms.build(ALGORITHMS.get("ar_sgd"), config.settings(), problem, devices)
    self.engine = engine = MeshEngine(ar_sgd, problem, streams,
                                      slice_of(config, MeshEngine.fields))
    assert engine.mesh.devices.size == devices, engine.figures()
    self.state = engine.init(jax.random.key(SEED))
    put = lambda x: jax.device_put(x, engine.sharded)
    self.batch = Batch({"image": put(images), "label": put(labels)},
                put(np.full(batch, 1 / batch, np.float32)), put(np.zeros(2 * devices, np.int32)))

  def step(self) -> jax.Array:
    self.state, metrics = self.engine.jitted_step(self.state, self.batch)
    return metrics["loss"]

  def params(self):
    """Worker 0's parameters, as host arrays."""
    return jax.tree.map(lambda x: x[0], self.engine.worker_states(self.state).params)


class HandArm:
  """The data-parallel step written by hand: shard_map over the mesh, per-device
  loss on the device's rows of the batch, pmean of the gradients, replicated
  parameters and optimizer state (so every device applies the same update).
  """

  def __init__(self, name: str, image_shape, images: np.ndarray, labels: np.ndarray,
               mesh: jax.sharding.Mesh, start_params=None):
    (axis,) = mesh.axis_names
    module = MODELS.get(name)(image_shape, NUM_CLASSES, resolve_stem("auto", image_shape),
                              rngs=nnx.Rngs(params=jax.random.key(SEED)))
    graphdef, params, stats = nnx.split(module, nnx.Param, nnx.BatchStat)
    params, stats = nnx.to_pure_dict(params), nnx.to_pure_dict(stats)
    # Jaxdl's jitted init draws the same random numbers, but op by op they come
    # out different in the last bit: start from jaxdl's so the check is exact.
    # Host copies either way, so donation never deletes the module's arrays.
    params = jax.tree.map(np.asarray, params if start_params is None else start_params)
    tx = optax.sgd(LR, momentum=0.9)

    def device_step(params, stats, opt_state, images, labels):
      def loss_fn(params):
        loss, new_stats = hand_written_loss(module, graphdef, params, stats, images, labels)
        return loss, (loss, new_stats)
      # Differentiate varying copies: the gradient of the replicated (invariant)
      # parameters would come back already summed over the axis.
      local = jax.lax.pcast(params, axis, to="varying")
      (_, (out, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(local)
      grads = jax.lax.pmean(grads, axis)
      stats = jax.lax.pmean(stats, axis)  # none in cnn and mlp
      updates, opt_state = tx.update(grads, opt_state, params)
      out = jax.lax.pmean(out, axis)
      return optax.apply_updates(params, updates), stats, opt_state, out

    self._step = jax.jit(jax.shard_map(
        device_step, mesh=mesh, in_specs=(P(), P(), P(), P(axis), P(axis)),
        out_specs=P(), check_vma=True), donate_argnums=(0, 1, 2))
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P(axis))
    self.state = jax.device_put([params, stats, tx.init(params)], replicated)
    self.batch = jax.device_put((images, labels), rows)

  def step(self) -> jax.Array:
    *self.state, loss = self._step(*self.state, *self.batch)
    return loss

  def params(self):
    return jax.device_get(self.state[0])


def check(jaxdl: JaxdlArm, hands: dict[str, HandArm], args: Args) -> bool:
  """All arms take the same steps from the same start; their losses must agree."""
  def param_diff(hand):
    return max(float(np.max(np.abs(a - b))) for a, b in
               zip(jax.tree.leaves(jaxdl.params()), jax.tree.leaves(hand.params())))
  start = {name: param_diff(hand) for name, hand in hands.items()}
  losses = [(float(jaxdl.step()), {name: float(hand.step()) for name, hand in hands.items()})
            for _ in range(args.check_steps)]
  ok = True
  for name, hand in hands.items():
    diff = max(abs(ours - theirs[name]) for ours, theirs in losses)
    passed = start[name] == 0 and diff <= args.check_tol
    ok &= passed
    print(f"check: jaxdl and {name}, {args.check_steps} identical steps from identical "
          f"parameters: last losses {losses[-1][0]:.6f} and {losses[-1][1][name]:.6f}, "
          f"max |loss diff| {diff:.1e} (tol {args.check_tol:.0e}), max |param diff| "
          f"after {param_diff(hand):.1e}: {'OK' if passed else 'FAILED'}")
  return ok


def steps_for(runs, args: Args) -> int:
  """--steps, or as many as the slowest arm takes in about --round-seconds."""
  if args.steps:
    return args.steps
  slowest = 0.0
  for run in runs:
    run(1)
    start = time.perf_counter()
    run(2)
    slowest = max(slowest, (time.perf_counter() - start) / 2)
  return int(min(500, max(2, round(args.round_seconds / slowest))))


def bench_case(case: str, args: Args) -> tuple[float, bool]:
  name, side, batch = case.split(":")
  side, batch = int(side), int(batch)
  image_shape = (side, side, 3 if side >= 32 else 1)
  rng = np.random.default_rng(SEED)
  images = rng.normal(size=(batch, *image_shape)).astype(np.float32)
  labels = rng.integers(0, NUM_CLASSES, batch).astype(np.int32)
  title = f"{name}, {side}x{side}x{image_shape[2]}, global batch {batch}"

  counts = sorted(args.devices)
  jaxdl = {d: JaxdlArm(name, image_shape, images, labels, d) for d in counts}
  top = counts[-1]
  hand, jaxdl_arm = "hand-written shard_map step", "jaxdl ar_sgd step"
  hands = {hand: HandArm(name, image_shape, images, labels, jaxdl[top].engine.mesh,
                         start_params=jaxdl[top].params())}
  ok = check(jaxdl[top], hands, args)

  runs = {hand: bounded(hands[hand].step, args.in_flight),
          jaxdl_arm: bounded(jaxdl[top].step, args.in_flight)}
  steps = steps_for(runs.values(), args)
  times = interleaved(runs, steps, args.rounds)
  ratio = report(f"{title}, {top} workers on {top} devices ({batch // top} per worker), "
                 f"{steps} steps x {args.rounds} rounds", times, baseline=hand)

  runs = {d: bounded(jaxdl[d].step, args.in_flight) for d in counts}
  steps = steps_for(runs.values(), args)
  times = interleaved(runs, steps, args.rounds)
  base = statistics.median(times[counts[0]])
  print(f"\njaxdl ar_sgd step by device count: {title}, one worker per device, "
        f"{steps} steps x {args.rounds} rounds")
  print(f"{'devices':>8}{'per worker':>12}{'min ms':>10}{'median ms':>12}"
        f"{'samples/s':>12}{'speedup':>9}")
  for d in counts:
    median = statistics.median(times[d])
    print(f"{d:>8}{batch // d:>12}{min(times[d]) * 1e3:>10.3f}{median * 1e3:>12.3f}"
          f"{batch / median:>12.0f}{base / median:>9.2f}")
  return ratio, ok


def main(args: Args) -> int:
  cores = os.cpu_count()
  print(f"machine: {machine()}, {cores} cores, flax {flax.__version__}, "
        f"optax {optax.__version__}")
  if jax.default_backend() == "cpu":
    print(f"note: the {len(jax.devices())} CPU devices share {cores} cores, so more "
          "devices add no compute: the device table shows the overhead of the SPMD "
          "program (partitioning, collectives, per-device dispatch), not scaling.")
  if max(args.devices) > len(jax.devices()):
    print(f"--devices {args.devices}: only {len(jax.devices())} devices")
    return 2
  results = {case: bench_case(case, args) for case in args.cases}
  print("\nratio jaxdl / hand-written (goal <= 1.02): " +
        ", ".join(f"{c}: {r:.3f}" for c, (r, _) in results.items()))
  return 0 if all(ok for _, ok in results.values()) else 1


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
