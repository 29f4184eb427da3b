"""Runs a step's ops on the device, in one of three ways (`choose_batching`):

  "vmap": pending gradients in one op, vmapped over the workers' stacked
      pulled versions (all M workers, masked, or only the K computing,
      gathered: `handlers.BatchArrays`), 64 rows at a time in a loop when
      there are more (`handlers.CHUNK_ROWS`); from 32 workers an op over
      all of them computes only its computing rows, 4 at a time in a loop
      (`handlers.PENDING_FROM`).
  "loop": gradients one worker at a time, with no control flow around
      them. On the CPU, convolutions vmapped over parameters (grouped
      convolutions), or inside a loop or a conditional, ran 4x to 5x slower
      than at the top level of a program (BENCHMARKS.md).
  "scan": a step in one jitted call, a `lax.scan` over its ops with a
      `lax.switch` per op, padded to the longest step; gradients as "vmap".
      On the CPU each iteration copied the stacked worker states, slower
      than a dispatch per op (BENCHMARKS.md).

With "vmap" and "loop", a step is segments (`plan.segments`): a run of
consecutive ops of one cheap kind (a parameter server's pushes and pulls) is
a loop over the run, a batched op is one segment. A step whose signature (its
segments' kinds and batch sizes) is short and common in the run's schedule
(`fusable`) is one call, a program specialized on that signature, with the ops'
workers, durations and the runs' bounds as data: a parameter server's steps
take a handful of signatures. Other steps (gossip with many workers) call their
segments one by one. Which steps fuse is decided from the whole schedule,
before the run, so a run, its resume and its replay run the same programs.
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
from jaxdl.engines.sim.handlers import BatchArrays
from jaxdl.engines.sim.plan import BATCH_KINDS, Op, segments, signature

FUSED_SEGMENTS = 8  # a step of at most this many segments may run as one call
FUSED_STEPS = 5000  # ... if at least this many of the run's steps have its signature
"""A fused program pays for itself only over many steps: on the CPU an mlp
step's program took 1-1.5 s to compile and saved about 0.2 ms a step against
a call per segment (8 asp workers; BENCHMARKS.md), even after 6,000 steps.
Short runs (tests, the default comparison) fuse nothing: fusing signatures seen
in 4 steps made 5-epoch runs of 8 workers 1.5-3 x slower in CPU time."""


def trace_gradient(problem: Problem, example: dict, batch: int):
  """One worker's gradient on a `batch`-example batch of fields like
  `example`'s, traced on abstract values (nothing allocated, nothing compiled)."""
  params, model_state = problem.task.init_shapes()
  fields = {k: jax.ShapeDtypeStruct((batch, *np.shape(v)[1:]), np.asarray(v).dtype)
            for k, v in example.items()}
  x = Batch(fields, jax.ShapeDtypeStruct((batch,), jnp.float32),
            jax.ShapeDtypeStruct((2,), jnp.int32))
  grad = lambda p, s, b: problem.gradients(p, s, b, WorkerAxis(1))
  return jax.jit(grad).trace(params, model_state, x)


def metric_names(traced) -> tuple[str, ...]:
  """The names of the metrics a worker's gradient reports (the loss and the
  task's), from its trace (`trace_gradient`, of any batch size)."""
  return tuple(sorted(traced.out_info[2]))


def choose_batching(traced) -> str:
  """"loop" on the CPU for models with convolutions, else "vmap" (see above),
  from the gradient's trace (`trace_gradient`, of any batch size).

  A rule on the program's structure rather than a timing at setup: the two
  ways round differently, and a run, its resume and its replay must give
  the same bits.
  """
  if jax.default_backend() != "cpu":
    return "vmap"
  return "loop" if _has_primitive(traced.jaxpr.jaxpr, "conv_general_dilated") else "vmap"


def _has_primitive(jaxpr, name: str) -> bool:
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == name:
      return True
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      if _has_primitive(sub, name):
        return True
  return False


class OpArrays(NamedTuple):
  """A step's cheap ops as device arrays, stacked over ops (L, padded to the
  longest step)."""
  kind: Any        # (L,) int32: index into the handler list
  worker: Any      # (L,) int32
  peer: Any        # (L,) int32
  iteration: Any   # (L,) int32
  durations: Any   # (L, 2) float32
  slot: Any        # (L,) int32: an in-flight message's slot
  batch: Any       # (L,) int32: "scan": the op's row of the batch tables


class OpRunner:
  """Runs a step's ops: one scanned call ("scan"), one fused call, or one
  call per segment."""

  def __init__(self, fns: dict[str, Callable], batching: str, length: int,
               batches: DeviceBatches, metrics: tuple[str, ...] = ("loss",),
               fused: frozenset = frozenset()):
    """`fused`: the signatures of steps to run as one call (`fusable`)."""
    self.names, self.batching, self.length, self.batches = list(fns), batching, length, batches
    self.metrics, self.fns, self.fused = metrics, fns, fused
    self.num_workers = batches.num_workers
    self.jitted: dict[Any, Any] = {}  # every program, as it is first needed
    self._means = jax.jit(_means)
    self._zeros = _zero_sums(metrics)  # never donated: shared by every step
    if batching == "scan":
      branches = [_with_batch(fns[n], n) for n in self.names]

      def run(server, workers, ops, tables, data):
        def body(carry, op):
          table = jax.tree.map(lambda x: x[op.batch], tables)
          return lax.switch(op.kind, branches, *carry, op, table, data), None
        (server, workers, sums), _ = lax.scan(body, (server, workers, _zero_sums(metrics)),
                                              ops)
        return server, workers, _means(sums)
      self.jitted["scan"] = jax.jit(run, donate_argnums=(0, 1))

  def _program(self, key, make):
    if key not in self.jitted:
      self.jitted[key] = jax.jit(make(), donate_argnums=(0, 1))
    return self.jitted[key]

  def encode(self, ops: list[Op], length: int) -> OpArrays:
    pad = lambda values, dtype: np.array(values + [0] * (length - len(values)), dtype)
    durations = np.zeros((length, 2), np.float32)
    durations[:len(ops)] = [op.durations for op in ops]
    return OpArrays(pad([self.names.index(op.kind) for op in ops], np.int32),
                    pad([op.worker for op in ops], np.int32),
                    pad([op.peer for op in ops], np.int32),
                    pad([op.iteration for op in ops], np.int32), durations,
                    pad([op.slot for op in ops], np.int32),
                    pad([i for i in range(len(ops))], np.int32))

  def table(self, op: Op, size: int) -> BatchArrays:
    """A batched op's BatchArrays over `size` rows."""
    m, k = self.num_workers, len(op.workers)
    if size == m:  # every worker, in order (plan.plan)
      rows = op.workers
      mask = np.ones(m, bool) if op.mask is None else op.mask
    else:
      rows = np.concatenate([op.workers, np.full(size - k, m, np.int32)])
      mask = np.arange(size) < k
    # (worker, data step) of each row, or None: padding
    pairs = [(int(w), int(s)) for w, s in zip(op.workers, op.steps)] + [None] * (size - k)
    ids = np.array([pair or (0, 0) for pair in pairs], np.int32)
    return BatchArrays(mask, rows, self.batches.indices(pairs), ids, np.int32(op.iteration))

  def __call__(self, server, workers, ops: list[Op]):
    """(server, workers, the step's mean metrics) after `ops`."""
    self.batches.start()
    if self.batching == "scan":
      return self._scan(server, workers, ops)
    parts = segments(ops, self.num_workers)
    tables = [self.table(ops[p.start], p.size) for p in parts if p.kind in BATCH_KINDS]
    arrays = self.encode(ops, self.length)
    data = self.batches.step_data()
    key = signature(parts)
    if key in self.fused:
      bounds = np.array([(p.start, p.start + p.count) for p in parts],
                        np.int32).reshape(-1, 2)
      return self._program(key, lambda: self._fused(key))(
          server, workers, arrays, bounds, tables, data)
    sums, tables = self._zeros, iter(tables)
    for kind, size, start, count in parts:
      if size == 0:
        program = self._program((kind, 0), lambda: _own(self.fns[kind], kind))
        server, workers, sums = program(server, workers, sums,
                                        jax.tree.map(lambda x: x[start], arrays), data)
      elif size is None:
        run = self._program(f"{kind} run", lambda: _repeat(self.fns[kind], f"{kind}_run"))
        server, workers, sums = run(server, workers, sums, arrays, np.int32(start),
                                    np.int32(start + count), data)
      else:
        # (a function of its own: jit's cache is the function's, whatever the wrapper)
        program = self._program((kind, size), lambda: _own(self.fns[kind], f"{kind}_k{size}"))
        server, workers, sums = program(server, workers, sums, next(tables), data)
    return server, workers, self._means(sums)

  def _fused(self, signature):
    """A step of signature `signature` in one program (see the module's docstring)."""
    fns = self.fns
    metrics = self.metrics

    def run(server, workers, arrays, bounds, tables, data):
      carry, tables = (server, workers, _zero_sums(metrics)), iter(tables)
      for s, (kind, size) in enumerate(signature):
        if size == 0:
          carry = fns[kind](*carry, jax.tree.map(lambda x: x[bounds[s, 0]], arrays), data)
        elif size is None:
          carry = _repeat(fns[kind])(*carry, arrays, bounds[s, 0], bounds[s, 1], data)
        else:
          carry = fns[kind](*carry, next(tables), data)
      server, workers, sums = carry
      return server, workers, _means(sums)
    return _named(run, "fused_step")

  def _scan(self, server, workers, ops: list[Op]):
    m = self.num_workers
    none = BatchArrays(np.zeros(m, bool), np.arange(m, dtype=np.int32),
                       np.full((m, self.batches.b_max), self.batches.pad, np.int32),
                       np.zeros((m, 2), np.int32), np.int32(0))
    tables = [self.table(op, m) if op.kind in BATCH_KINDS else none for op in ops]
    tables += [none] * (self.length - len(ops))
    stacked = jax.tree.map(lambda *x: np.stack(x), *tables)
    return self.jitted["scan"](server, workers, self.encode(ops, self.length), stacked,
                               self.batches.step_data())


def fusable(signatures, fused_segments: int = FUSED_SEGMENTS,
            fused_steps: int = FUSED_STEPS) -> frozenset:
  """The step signatures worth a program of their own: at most `fused_segments`
  segments, and at least `fused_steps` steps of the schedule (`signatures`: a
  Counter, plan.plan_sizes) to repay its compile."""
  return frozenset(s for s, n in signatures.items() if len(s) <= fused_segments and n >= fused_steps)


def _with_batch(fn, name: str):
  """A handler of the scan's one signature: a batched op reads its table."""
  if name in BATCH_KINDS:
    return lambda server, workers, sums, op, table, data: fn(server, workers, sums, table, data)
  return lambda server, workers, sums, op, table, data: fn(server, workers, sums, op, data)


def _own(fn, name: str):
  """`fn` as a function of its own (jit's cache is the function's, whatever
  the wrapper), named for compile logs and profiles: jit(compute_k4)."""
  def own(*args):
    return fn(*args)
  return _named(own, name)


def _repeat(fn, name: str = "run"):
  """`fn` over the ops start, ..., end - 1 of the step's arrays, in order, in one call."""
  def run(server, workers, sums, ops, start, end, data):
    body = lambda i, carry: fn(*carry, jax.tree.map(lambda x: x[i], ops), data)
    return lax.fori_loop(start, end, body, (server, workers, sums))
  return _named(run, name)


def _named(fn, name: str):
  fn.__name__ = fn.__qualname__ = name
  return fn


def _means(sums):
  totals, count = sums
  return {k: v / count for k, v in totals.items()}


def _zero_sums(metrics: tuple[str, ...]):
  zero = lambda: jnp.zeros((), jnp.float32)
  return ({k: zero() for k in metrics}, zero())
