"""The worker axis of per-worker programs: collectives through the host.

On a mesh every worker runs one SPMD program, so every worker's batch has one
padded shape, and a smaller share of the global batch saves no compute. Here
each worker runs its own compiled step, on its own device and with its own
batch shape, and the algorithm's collectives (`WorkerAxis.psum`,
`all_gather`, `psum_scatter`) leave the program as host callbacks that meet
the other workers' at an `Exchange`. The algorithm's `step` is unchanged:
the same function, over another axis.

A collective is matched across workers by a key: the global step (a traced
argument of the callback) and the collective's place in the step (counted
as the step is traced, the same in every worker's trace). A psum inside the
gradient (synchronized batch norm) differentiates as lax.psum does: its
cotangents are summed the same way.

Two reductions, equal in result: "host" sums the workers' arrays in host
memory (numpy, in worker order); "device" puts them on a device (the
accelerator where one exists) and sums there, then copies the sum back.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from jaxdl.engines.base import process_identity

REDUCTIONS = ("host", "device")


def summed(parts: Sequence[Sequence[np.ndarray]], reduce: str, device=None) -> list[np.ndarray]:
  """Leaf-wise sums of the workers' leaves, in worker order."""
  if reduce == "host":
    out = []
    for leaves in zip(*parts):
      total = np.array(leaves[0], copy=True)
      for x in leaves[1:]:
        total += x
      out.append(total)
    return out
  on = [jax.device_put(list(leaves), device) for leaves in parts]
  sums = jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *on)
  return [np.asarray(x) for x in jax.device_get(sums)]


class Exchange:
  """Where the workers' collectives meet, in one process (the workers are
  threads, each running its own program): a worker's call blocks until all
  `size` workers have brought their part of the same collective. Counts each
  worker's seconds inside collectives (waiting included) per step, and the
  seconds spent summing."""

  def __init__(self, size: int, reduce: str = "host", device=None):
    if reduce not in REDUCTIONS:
      raise ValueError(f"reduce {reduce!r}: one of {', '.join(REDUCTIONS)}")
    self.size, self.reduce, self.device = size, reduce, device
    self.changed = threading.Condition()
    self.parts: dict[tuple, dict[int, list[np.ndarray]]] = {}
    self.results: dict[tuple, tuple[list, int]] = {}  # key -> (result, readers left)
    self.inside = [{} for _ in range(size)]  # per worker: step -> seconds in collectives
    self.reduced = 0.0  # seconds spent summing (--reduce), copies to and from a device included
    self.failed = False  # a worker failed: the others' collectives would wait forever

  def identity(self) -> dict[str, Any]:
    """Its role, process and host (a Ray actor's, in cluster.json)."""
    return process_identity("exchange")

  def abort(self) -> None:
    """A worker failed: every worker waiting in a collective raises."""
    with self.changed:
      self.failed = True
      self.changed.notify_all()

  def reduce_seconds(self) -> float:
    """Seconds spent summing the workers' parts so far."""
    return self.reduced

  def collective(self, op: str, key: tuple, worker: int, leaves: list[np.ndarray]):
    """Worker `worker`'s part of collective `key` (op: psum, all_gather,
    psum_scatter); its result, once every worker's part is in."""
    start = time.perf_counter()
    with self.changed:
      self.parts.setdefault(key, {})[worker] = [np.asarray(x) for x in leaves]
      if len(self.parts[key]) == self.size:
        parts = self.parts.pop(key)
        ordered = [parts[w] for w in range(self.size)]
        begin = time.perf_counter()
        result = (ordered if op == "all_gather" else summed(ordered, self.reduce, self.device))
        self.reduced += time.perf_counter() - begin
        self.results[key] = (result, self.size)
        self.changed.notify_all()
      else:
        self.changed.wait_for(lambda: key in self.results or self.failed)
        if self.failed:
          raise RuntimeError(f"worker {worker} left collective {key}: another worker failed")
      result, left = self.results[key]
      if left == 1:
        del self.results[key]
      else:
        self.results[key] = (result, left - 1)
    step = key[0]
    self.inside[worker][step] = self.inside[worker].get(step, 0.0) + time.perf_counter() - start
    return share(op, result, worker, self.size)


def share(op: str, result: list, worker: int, size: int) -> list[np.ndarray]:
  """Worker `worker`'s part of a collective's `result` (all_gather: every
  worker's leaves, in worker order; psum, psum_scatter: their sums)."""
  if op == "all_gather":
    return [np.stack([r[i] for r in result]) for i in range(len(result[0]))]
  if op == "psum_scatter":
    return [np.split(x, size)[worker] for x in result]
  return result


def unmet(op: str, worker: int, size: int, leaves: Sequence[np.ndarray]) -> list[np.ndarray]:
  """What a collective gives `worker` as if all `size` workers had brought
  its `leaves`: the answer of a step run by one worker alone (its untimed
  first run, whose result is dropped), shaped as the exchange's."""
  parts = [[np.asarray(x) for x in leaves]] * size
  return share(op, parts if op == "all_gather" else summed(parts, "host"), worker, size)


@dataclasses.dataclass
class HostAxis:
  """The WorkerAxis of worker `worker` of `size`, whose collectives are
  callbacks to `exchange` (an `Exchange`, or any object with its
  `collective` method). `reset()` before each trace of the step."""
  size: int
  worker: int
  exchange: Any
  places: Any = dataclasses.field(default_factory=itertools.count)
  step: Any = None  # the traced global step, set by `bind`

  def bind(self, step) -> HostAxis:
    """The axis for the trace of step `step` (a traced int32): collectives counted from 0."""
    return dataclasses.replace(self, places=itertools.count(), step=step)

  def _call(self, op: str, leaves: list, shapes: list, tag: tuple):
    worker, exchange = self.worker, self.exchange
    callback = lambda step, *xs: exchange.collective(op, (int(step), *tag), worker, list(xs))
    return io_callback(callback, shapes, self.step, *leaves, ordered=True)

  def psum(self, tree):
    """Sum over all workers (every worker gets the sum); differentiable."""
    leaves, treedef = jax.tree.flatten(tree)
    shapes = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves]
    place = next(self.places)
    call = lambda xs, kind: self._call("psum", list(xs), shapes, (place, kind))

    @jax.custom_vjp
    def psum(*xs):
      return tuple(call(xs, "forward"))

    def forward(*xs):
      return tuple(call(xs, "forward")), None

    def backward(_, cotangents):  # the transpose of a sum over workers is the same sum
      return tuple(call(cotangents, "backward"))

    psum.defvjp(forward, backward)
    return treedef.unflatten(list(psum(*leaves)))

  def all_gather(self, x: jax.Array) -> jax.Array:
    """Every worker's `x`, stacked in worker order: (M, *x.shape)."""
    shape = jax.ShapeDtypeStruct((self.size, *jnp.shape(x)), jnp.result_type(x))
    return self._call("all_gather", [x], [shape], (next(self.places), "forward"))[0]

  def psum_scatter(self, x: jax.Array, dimension: int = 0) -> jax.Array:
    """Sums x (its `dimension` divisible by M) over workers; worker i keeps
    block i along it."""
    x = jnp.moveaxis(x, dimension, 0)
    shape = jax.ShapeDtypeStruct((x.shape[0] // self.size, *x.shape[1:]), x.dtype)
    block = self._call("psum_scatter", [x], [shape], (next(self.places), "forward"))[0]
    return jnp.moveaxis(block, 0, dimension)
