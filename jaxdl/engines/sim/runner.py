"""Runs a step's ops on the device, in one of three ways (`choose_batching`):

  "vmap": one jitted call per op; pending gradients in one call, vmapped over
      the workers' stacked pulled versions.
  "loop": one jitted call per op, gradients one worker at a time, with no
      control flow around them. On the CPU, convolutions vmapped over
      parameters (grouped convolutions), or inside a loop or a conditional,
      ran 4x to 5x slower than at the top level of a program (BENCHMARKS.md).
  "scan": a step in one jitted call, a `lax.scan` over its ops with a
      `lax.switch` per op, padded to the longest step; gradients as "vmap".
      On the CPU each iteration copied the stacked worker states, slower
      than a dispatch per op (BENCHMARKS.md).

With "vmap" and "loop", a run of consecutive ops of one cheap kind (a
parameter server's pushes and pulls) is one call, a loop over the run.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdl.algorithms import Batch, Problem, WorkerAxis
from jaxdl.engines.sim.batches import DeviceBatches
from jaxdl.engines.sim.plan import Op

BATCH_KINDS = ("compute", "compute_one", "local", "local_one", "step")


def trace_gradient(problem: Problem, example: dict, batch: int):
  """One worker's gradient on a `batch`-example batch of fields like
  `example`'s, traced on abstract values (nothing allocated, nothing compiled)."""
  params, model_state = jax.eval_shape(problem.init_model, jax.random.key(0))
  fields = {k: jax.ShapeDtypeStruct((batch, *np.shape(v)[1:]), np.asarray(v).dtype)
            for k, v in example.items()}
  x = Batch(fields, jax.ShapeDtypeStruct((batch,), jnp.float32),
            jax.ShapeDtypeStruct((2,), jnp.int32))
  grad = lambda p, s, b: problem.gradients(p, s, b, WorkerAxis(1))
  return jax.jit(grad).trace(params, model_state, x)


def metric_names(problem: Problem, example: dict) -> tuple[str, ...]:
  """The names of the metrics a worker's gradient reports (the loss and the task's)."""
  return tuple(sorted(trace_gradient(problem, example, 1).out_info[2]))


def choose_batching(problem: Problem, example: dict, batch: int) -> str:
  """"loop" on the CPU for models with convolutions, else "vmap" (see above).

  A rule on the program's structure rather than a timing at setup: the two
  ways round differently, and a run, its resume and its replay must give
  the same bits.
  """
  if jax.default_backend() != "cpu":
    return "vmap"
  jaxpr = trace_gradient(problem, example, batch).jaxpr
  return "loop" if _has_primitive(jaxpr.jaxpr, "conv_general_dilated") else "vmap"


def _has_primitive(jaxpr, name: str) -> bool:
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == name:
      return True
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      if _has_primitive(sub, name):
        return True
  return False


class OpArrays(NamedTuple):
  """Ops as device arrays, stacked over ops (L) for a scan."""
  kind: Any        # (L,) int32: index into the handler list
  worker: Any      # (L,) int32
  peer: Any        # (L,) int32
  iteration: Any   # (L,) int32
  durations: Any   # (L, 2) float32
  mask: Any        # (L, M) bool
  index: Any       # (L, M, b_max) int32: rows of the data table
  ids: Any         # (L, M, 2) int32: each batch's (worker, step)
  slot: Any        # (L,) int32: an in-flight message's slot


class OpRunner:
  """Runs a step's ops: one scanned call ("scan"), or one call per op."""

  def __init__(self, fns: dict[str, Callable], batching: str, length: int,
               batches: DeviceBatches, metrics: tuple[str, ...] = ("loss",)):
    self.names, self.batching, self.length, self.batches = list(fns), batching, length, batches
    self.metrics = metrics
    if batching == "scan":
      branches = [fns[n] for n in self.names]

      def run(server, workers, ops, data):
        def body(carry, op):
          return lax.switch(op.kind, branches, *carry, op, data), None
        (server, workers, sums), _ = lax.scan(body, (server, workers, _zero_sums(metrics)),
                                              ops)
        return server, workers, sums
      self.jitted = {"scan": jax.jit(run, donate_argnums=(0, 1))}
    else:
      self.jitted = {n: jax.jit(fn, donate_argnums=(0, 1)) for n, fn in fns.items()
                     if n != "noop"}
      # A run of consecutive ops of one cheap kind (e.g. a parameter server's
      # pushes and pulls) in one call: a loop over the run's ops, padded to
      # the longest step so that each kind compiles once.
      self.runs = {n: jax.jit(_repeat(fn), donate_argnums=(0, 1)) for n, fn in fns.items()
                   if n not in BATCH_KINDS and n != "noop"}
      self.jitted.update({f"{n} run": f for n, f in self.runs.items()})

  def encode(self, ops: list[Op], length: int) -> OpArrays:
    m, b = self.batches.num_workers, self.batches.b_max
    kind = np.zeros(length, np.int32)
    worker, peer, iteration, slot = (np.zeros(length, np.int32) for _ in range(4))
    durations = np.zeros((length, 2), np.float32)
    mask = np.zeros((length, m), bool)
    index = np.zeros((length, m, b), np.int32)
    ids = np.zeros((length, m, 2), np.int32)
    for i, op in enumerate(ops):
      kind[i] = self.names.index(op.kind)
      worker[i], peer[i], iteration[i], slot[i] = op.worker, op.peer, op.iteration, op.slot
      durations[i] = op.durations
      if op.mask is not None:
        mask[i] = op.mask
      if op.pairs is not None:
        index[i] = self.batches.indices(op.pairs)
        ids[i] = [pair or (0, 0) for pair in op.pairs]
    return OpArrays(kind, worker, peer, iteration, durations, mask, index, ids, slot)

  def __call__(self, server, workers, ops: list[Op]):
    self.batches.start()
    if self.batching == "scan":
      arrays = self.encode(ops, self.length)
      return self.jitted["scan"](server, workers, arrays, self.batches.step_data())
    arrays = self.encode(ops, len(ops))
    data, sums = self.batches.step_data(), _zero_sums(self.metrics)
    start = 0
    while start < len(ops):
      kind, end = ops[start].kind, start + 1
      while end < len(ops) and ops[end].kind == kind:
        end += 1
      if end - start > 1 and kind in self.runs:
        # (to the longest step's length: one shape, one compile, whatever the run's)
        pad = lambda x: np.concatenate(
            [x[start:end], np.zeros((self.length - end + start, *x.shape[1:]), x.dtype)])
        server, workers, sums = self.runs[kind](
            server, workers, sums, jax.tree.map(pad, arrays), np.int32(end - start), data)
      else:
        for i in range(start, end):
          server, workers, sums = self.jitted[kind](
              server, workers, sums, jax.tree.map(lambda x: x[i], arrays), data)
      start = end
    return server, workers, sums


def _repeat(fn):
  """`fn` over the first `count` of stacked ops, in order, in one call."""
  def run(server, workers, sums, ops, count, data):
    body = lambda i, carry: fn(*carry, jax.tree.map(lambda x: x[i], ops), data)
    return lax.fori_loop(0, count, body, (server, workers, sums))
  return run


def _zero_sums(metrics: tuple[str, ...]):
  zero = lambda: jnp.zeros((), jnp.float32)
  return ({k: zero() for k in metrics}, zero())
