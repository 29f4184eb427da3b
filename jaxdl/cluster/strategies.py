"""Timing-only predictions of parallel training strategies from XLA's counts.

A zoo model's pieces (its `pieces()`, as jaxdl.parallel.pipeline cuts it)
are costed by XLA's cost analysis of each piece's forward pass and of its
forward and backward pass, traced on abstract shapes (nothing runs): FLOPs
and bytes of memory traffic. From those counts and identical devices joined
by a link, the samples per second of four strategies:

- one device: a batch's forward and backward (`operation_seconds`).
- data parallel: D devices each take their own batch, then a ring all-reduce
  of the gradients (the parameters' count x 4 bytes) over the link
  (`CostModel.ring_allreduce_time`); no overlap of the two.
- pipeline: the pieces cut into p contiguous stages balanced by parameter
  count (`jaxdl.parallel.pipeline.balanced_groups`, the cut jaxdl's pipeline
  makes), a batch into m micro-batches, run by jaxdl's schedule table
  (`jaxdl.parallel.pipeline.schedule`: GPipe or 1F1B, 2 (m + p - 1) slots) in
  lock step, as jaxdl's executor runs it: every stage does its slot's
  operation, then the slot's activations (forward) and cotangents (backward)
  cross their boundaries, each a message of the boundary's activation
  (micro-batch x floats x 4 bytes) over its link; the slowest operation and
  the slowest message set a slot's time. A forward costs the stage's
  forward; a backward recomputes the forward from the kept input, so it
  costs forward + backward (a micro-batch's forward runs twice).
- model parallel: the same stages, one micro-batch.

Two models of an operation's time (`Devices`):

- FLOP rate (`Devices.of`): a device runs every operation at one rate (peak
  x utilization, `jaxdl.cluster.cost.achieved_flops`) whatever its batch: an
  operation's time is linear in its examples.
- roofline per micro-batch (`Devices.roofline`): each piece's operation
  takes the longer of its FLOPs at the device's peak and its memory traffic
  at the device's memory bandwidth (`DEVICE_MEMORY`). The traffic is the
  unfused program's: every operation reads its operands from memory and
  writes its result (a framework that runs one kernel per operation, as an
  eager one does); it is counted at two batch sizes, as a part per
  operation (weights, their gradients, per-channel statistics) and a part
  per example, so a micro-batch pays the first part whatever its size.

Either adds an optional fixed cost per operation (kernel launches; 0 unless
given); FLOPs are linear in the batch (counted per example); links are full
duplex. Not modelled: the optimizer's update (a few FLOPs per parameter),
input loading, host overheads, a device's lower efficiency on small
operations beyond the traffic per operation, memory limits.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdl.cluster.cost import (DEFAULT_UTILIZATION, DEVICE_LINKS, DEVICE_MEMORY,
                                DEVICE_PROFILES, CostModel, achieved_flops)
from jaxdl.errors import ConfigError
from jaxdl.models import MODELS, resolve_stem
from jaxdl.parallel.pipeline import BACKWARD, FORWARD, balanced_groups, schedule

BYTES_PER_FLOAT = 4  # float32 parameters, gradients and activations


PASSES = ("forward", "training")  # a PieceCost's two costed programs


@dataclasses.dataclass(frozen=True)
class PieceCost:
  """One piece of a model: parameters, FLOPs per example, memory traffic, its
  output's size."""
  params: int      # parameter count
  forward: float   # FLOPs per example of its forward pass (training mode)
  training: float  # FLOPs per example of forward + backward: the gradient of its
                   # parameters and, but for the first piece, of its input
  output: int      # floats per example of its output: what crosses a boundary after it
  forward_bytes: tuple[float, float] = (0.0, 0.0)   # unfused memory traffic of its
  training_bytes: tuple[float, float] = (0.0, 0.0)  # forward, of forward + backward:
                                                    # (bytes per operation, per example)

  def traffic(self, passes: str, examples: int) -> float:
    """Bytes `examples` examples' `passes` ("forward" or "training") move."""
    fixed, per_example = getattr(self, passes + "_bytes")
    return fixed + per_example * examples


def _counts(fn, *args) -> tuple[float, float]:
  """FLOPs and bytes accessed of the unfused program `fn(*args)`."""
  analysis = jax.jit(fn).lower(*args).cost_analysis()
  return float(analysis["flops"]), float(analysis["bytes accessed"])


def _cost(module, call, input_shape: tuple[int, ...], first: bool,
          batch: int) -> tuple[PieceCost, tuple[int, ...]]:
  """A module's cost as `call(module, x)` (with batch norm `call(module, x,
  train)`), counted on `batch` and `2 batch` examples of `input_shape` (the
  traffic's parts per operation and per example from the two), and an
  example's output shape."""
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  abstract = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
  params, rest = abstract(params), abstract(rest)

  def forward(params, rest, x):  # (a piece with batch norm takes train, in training)
    module = nnx.merge(graphdef, params, rest, copy=True)
    return call(module, x, True) if jax.tree.leaves(rest) else call(module, x)

  def training(params, rest, x, cotangent):
    _, pull = jax.vjp(lambda p, x: forward(p, rest, x), params, x)
    grads = pull(cotangent)
    return grads[0] if first else grads  # the input of the first piece is data

  def counts(examples):  # {pass: (FLOPs, bytes)} on `examples` examples
    x = jax.ShapeDtypeStruct((examples, *input_shape), jnp.float32)
    y = jax.eval_shape(forward, params, rest, x)
    return {"forward": _counts(forward, params, rest, x),
            "training": _counts(training, params, rest, x, y)}, y

  (one, y), (two, _) = counts(batch), counts(2 * batch)
  per_example = {p: (two[p][1] - one[p][1]) / batch for p in PASSES}
  traffic = {p + "_bytes": (one[p][1] - batch * per_example[p], per_example[p])
             for p in PASSES}
  count = sum(math.prod(a.shape) for a in jax.tree.leaves(params))
  cost = PieceCost(count, one["forward"][0] / batch, one["training"][0] / batch,
                   math.prod(y.shape[1:]), **traffic)
  return cost, tuple(y.shape[1:])


def _module(name: str, image_shape: tuple[int, int, int], num_classes: int, stem: str):
  stem = resolve_stem(stem, image_shape)
  return nnx.eval_shape(lambda: MODELS.get(name)(image_shape, num_classes, stem,
                                                 rngs=nnx.Rngs(0)))


@functools.cache
def piece_costs(name: str, image_shape: tuple[int, int, int], num_classes: int,
                stem: str = "auto", batch: int = 8) -> tuple[PieceCost, ...]:
  """The cost of each of the zoo model `name`'s pieces, in order, counted on
  `batch` and `2 batch` examples (cached per process)."""
  pieces = _module(name, tuple(image_shape), num_classes, stem).pieces()
  costs, shape = [], tuple(image_shape)
  for i, (module, call) in enumerate(pieces):
    cost, shape = _cost(module, call, shape, i == 0, batch)
    costs.append(cost)
  return tuple(costs)


def model_cost(name: str, image_shape: tuple[int, int, int], num_classes: int,
               stem: str = "auto", batch: int = 8) -> PieceCost:
  """The whole model's cost, as one piece (what its pieces' costs add up to)."""
  module = _module(name, tuple(image_shape), num_classes, stem)
  return _cost(module, lambda m, x, train=False: m(x, train=train), tuple(image_shape), True,
               batch)[0]


@dataclasses.dataclass(frozen=True)
class Devices:
  """Identical devices, each pair joined by a full-duplex link."""
  flops: float              # achieved FLOP/s of one device
  bandwidth: float          # bytes/s one way between two devices
  latency: float = 0.0      # seconds per message
  op_overhead: float = 0.0  # fixed seconds per forward or backward operation
  memory: float = math.inf  # bytes/s of a device's memory (inf: FLOPs alone)

  def __post_init__(self):
    if not (self.flops > 0 and self.bandwidth > 0 and self.memory > 0 and self.latency >= 0
            and self.op_overhead >= 0):
      raise ValueError(f"{self}: FLOP/s and bandwidths > 0, seconds >= 0")

  @classmethod
  def of(cls, profile: str, utilization: float = DEFAULT_UTILIZATION,
         op_overhead: float = 0.0) -> Devices:
    """The FLOP-rate model: devices of a profile
    (jaxdl.cluster.cost.DEVICE_PROFILES) at `utilization` of their peak, and
    its link (DEVICE_LINKS)."""
    bandwidth, latency = _link(profile)
    return cls(achieved_flops(profile, utilization), bandwidth, latency, op_overhead)

  @classmethod
  def roofline(cls, profile: str, op_overhead: float = 0.0) -> Devices:
    """The roofline per micro-batch: devices of a profile at their peak FLOP/s
    and their memory's bandwidth (DEVICE_MEMORY), and its link."""
    if profile not in DEVICE_MEMORY:
      raise ConfigError("cluster", profile, "a profile with a known memory bandwidth: "
                        + ", ".join(DEVICE_MEMORY))
    bandwidth, latency = _link(profile)
    return cls(DEVICE_PROFILES[profile], bandwidth, latency, op_overhead,
               DEVICE_MEMORY[profile])

  def message(self, nbytes: float) -> float:
    """Seconds of one message over a link."""
    return self.latency + nbytes / self.bandwidth


def _link(profile: str) -> tuple[float, float]:
  if profile not in DEVICE_LINKS:
    raise ConfigError("cluster", profile, "a profile with a known link: "
                      + ", ".join(DEVICE_LINKS))
  return DEVICE_LINKS[profile]


def operation_seconds(pieces: Sequence[PieceCost], devices: Devices, examples: int,
                      passes: str = "training") -> float:
  """Seconds of one operation of `pieces` on `examples` examples, `passes`
  "forward" or "training" (forward and backward): each piece at the longer
  of its FLOPs' time and its memory traffic's, summed, plus the fixed cost
  per operation."""
  return devices.op_overhead + sum(max(examples * getattr(p, passes) / devices.flops,
                                       p.traffic(passes, examples) / devices.memory)
                                   for p in pieces)


def single_device(pieces: Sequence[PieceCost], devices: Devices, batch: int) -> float:
  """Samples/s of one device training on batches of `batch`."""
  return batch / operation_seconds(pieces, devices, batch)


def data_parallel(pieces: Sequence[PieceCost], devices: Devices, count: int,
                  batch: int) -> float:
  """Samples/s of `count` devices, `batch` examples each, then a ring all-reduce
  of the gradients."""
  compute = operation_seconds(pieces, devices, batch)
  ring = CostModel(num_workers=count, compute_s=compute, latency=devices.latency,
                   model_bytes=BYTES_PER_FLOAT * sum(p.params for p in pieces),
                   bandwidth=devices.bandwidth)
  return count * batch / (compute + ring.ring_allreduce_time())


def stage_groups(pieces: Sequence[PieceCost], stages: int) -> list[range]:
  """The pieces of each stage: jaxdl's pipeline cut, balanced by parameter count."""
  return balanced_groups([p.params for p in pieces], stages)


def pipeline_seconds(pieces: Sequence[PieceCost], devices: Devices, stages: int,
                     microbatches: int, batch: int, kind: str = "gpipe") -> float:
  """Seconds of one batch of `batch` examples through `stages` stages in
  `microbatches` micro-batches by the schedule `kind`, in lock step."""
  if batch % microbatches:
    raise ValueError(f"batch {batch} in {microbatches} micro-batches: a multiple of them")
  micro = batch // microbatches
  groups = [[pieces[i] for i in g] for g in stage_groups(pieces, stages)]
  forward = [operation_seconds(g, devices, micro, "forward") for g in groups]
  # a backward recomputes the forward from the kept input: training, forward + backward
  backward = [operation_seconds(g, devices, micro) for g in groups]
  # the activation after stage s (forward to s + 1) and its cotangent (backward to s)
  boundary = [devices.message(micro * g[-1].output * BYTES_PER_FLOAT) for g in groups]
  total = 0.0
  for row in schedule(kind, stages, microbatches):
    compute, messages = 0.0, 0.0
    for s, (op, _) in enumerate(row):
      if op == FORWARD:
        compute = max(compute, forward[s])
        if s < stages - 1:
          messages = max(messages, boundary[s])
      elif op == BACKWARD:
        compute = max(compute, backward[s])
        if s > 0:
          messages = max(messages, boundary[s - 1])
    total += compute + messages
  return total


def pipeline(pieces: Sequence[PieceCost], devices: Devices, stages: int, microbatches: int,
             batch: int, kind: str = "gpipe") -> float:
  """Samples/s of a pipeline (`pipeline_seconds`)."""
  return batch / pipeline_seconds(pieces, devices, stages, microbatches, batch, kind)


def model_parallel(pieces: Sequence[PieceCost], devices: Devices, stages: int,
                   batch: int) -> float:
  """Samples/s of the pipeline's stages with the whole batch as one micro-batch."""
  return pipeline(pieces, devices, stages, 1, batch)


def stage_shares(pieces: Sequence[PieceCost], stages: int) -> np.ndarray:
  """Each stage's share of the parameters and of the training FLOPs: (stages, 2)."""
  groups = stage_groups(pieces, stages)
  params = np.array([sum(pieces[i].params for i in g) for g in groups], float)
  flops = np.array([sum(pieces[i].training for i in g) for g in groups])
  return np.stack([params / params.sum(), flops / flops.sum()], axis=1)


@dataclasses.dataclass(frozen=True)
class Strategy:
  """One strategy of a comparison: how it runs, and its measured samples/s."""
  name: str
  kind: str                        # "single", "data" or "pipeline"
  devices: int
  batch: int                       # the global batch
  microbatches: int = 1            # a pipeline's (1: model parallel)
  measured: float | None = None    # samples/s, where measured

  def predict(self, pieces: Sequence[PieceCost], devices: Devices) -> float:
    """Predicted samples/s."""
    if self.kind == "single":
      return single_device(pieces, devices, self.batch)
    if self.kind == "data":
      return data_parallel(pieces, devices, self.devices, self.batch // self.devices)
    return pipeline(pieces, devices, self.devices, self.microbatches, self.batch)


# The ASU seed (REFERENCE.md item 11): 2x RTX 3070, measured samples/s; model
# parallel was not run there. Its throughput table names no model or dataset
# (its plan lists VGG and ResNet; its data CIFAR-10/100 and MNIST): the model
# below is an assumption, ResNet-18 on CIFAR-sized images, not the seed's setup.
ASU_PROFILE = "rtx-3070"
ASU_MODEL = ("resnet18", (32, 32, 3), 10, "cifar")  # name, image shape, classes, stem
ASU_STRATEGIES = (
    Strategy("single device", "single", 1, 128, measured=2275.0),
    Strategy("data parallel", "data", 2, 256, measured=2968.0),
    Strategy("GPipe (4 micro-batches)", "pipeline", 2, 256, microbatches=4, measured=1528.0),
    Strategy("model parallel", "pipeline", 2, 256, microbatches=1),
)


@dataclasses.dataclass(frozen=True)
class Prediction:
  """A strategy's predicted samples/s beside its measured ones, each as a ratio
  to the single device's."""
  strategy: Strategy
  predicted: float
  predicted_ratio: float
  measured_ratio: float | None

  @property
  def closeness(self) -> float | None:
    """Predicted ratio / measured ratio: 1 where the model has it exactly."""
    return None if self.measured_ratio is None else self.predicted_ratio / self.measured_ratio


def predictions(strategies: Sequence[Strategy], pieces: Sequence[PieceCost],
                devices: Devices) -> list[Prediction]:
  """Each strategy's prediction; the ratios are to the first strategy's."""
  predicted = [s.predict(pieces, devices) for s in strategies]
  base = strategies[0].measured
  return [Prediction(s, p, p / predicted[0],
                     None if s.measured is None or base is None else s.measured / base)
          for s, p in zip(strategies, predicted)]


def asu_devices(roofline: bool = False, op_overhead: float = 0.0) -> Devices:
  """The ASU seed's devices, rtx-3070 and its PCIe link: at the default
  utilization (the FLOP-rate model), or at their peak and memory bandwidth
  (the roofline per micro-batch)."""
  return (Devices.roofline(ASU_PROFILE, op_overhead) if roofline
          else Devices.of(ASU_PROFILE, op_overhead=op_overhead))


def asu_predictions(roofline: bool = False, op_overhead: float = 0.0) -> list[Prediction]:
  """The ASU seed's strategies predicted on its devices (`asu_devices`) for
  the assumed model (ResNet-18, CIFAR stem, 32x32x3, 10 classes)."""
  return predictions(ASU_STRATEGIES, piece_costs(*ASU_MODEL), asu_devices(roofline, op_overhead))
