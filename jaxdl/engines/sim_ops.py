"""The sim engine's event math as ops: planned on the host, run on the device.

The host turns a step's events into ops (a handler, its worker, the indices
of the batches it reads), from the schedule alone: which workers' gradients
are computed together depends on the order of events, never on values. The
ops then run in one of three ways (`choose_batching`):

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

Batches are gathered on the device by index from a resident copy of an
in-memory training split (normalized once on the host: the same floats as a
per-batch gather), or else from a per-step table gathered on the host.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdl.algorithms import Algorithm, Batch, Problem, WorkerAxis
from jaxdl.data import WorkerStreams
from jaxdl.data.sources import ArraySplit

RESIDENT_BYTES = 1 << 30  # training splits up to this size live on the device
BATCH_KINDS = ("compute", "compute_one", "local", "local_one", "step")


class Op(NamedTuple):
  """One handler call, as planned on the host."""
  kind: str
  worker: int = 0
  peer: int = 0
  iteration: int = 0
  durations: tuple[float, float] = (0.0, 0.0)  # the event's (and a fused pull's)
  mask: tuple[bool, ...] | None = None          # which workers a batched op updates
  pairs: tuple | None = None                    # per worker: (worker, data step) or None


class OpArrays(NamedTuple):
  """Ops as device arrays, stacked over ops (L) for a scan."""
  kind: Any        # (L,) int32: index into the handler list
  worker: Any      # (L,) int32
  peer: Any        # (L,) int32
  iteration: Any   # (L,) int32
  durations: Any   # (L, 2) float32
  mask: Any        # (L, M) bool
  index: Any       # (L, M, b_max) int32: rows of the data table


def plan(events: Sequence, start: int, end: int, iteration: np.ndarray,
         computed: np.ndarray, one_at_a_time: bool) -> list[Op]:
  """The ops of events[start:end + 1]; updates the bookkeeping in place."""
  num_workers = len(iteration)
  queued: list[list[int]] = [[] for _ in range(num_workers)]
  ops: list[Op] = []

  def batched(kind, mask, steps):
    if one_at_a_time:
      for w in np.flatnonzero(mask):
        pairs = tuple((w, steps[w]) if v == w else None for v in range(num_workers))
        ops.append(Op(f"{kind}_one", worker=int(w), pairs=pairs))
    else:
      ops.append(Op(kind, mask=tuple(bool(x) for x in mask),
                    pairs=tuple(enumerate(steps))))

  def flush():
    while any(queued):
      batched("local", [bool(q) for q in queued], [q[0] if q else 0 for q in queued])
      for q in queued:
        if q:
          q.pop(0)

  index = start
  while index <= end:
    event = events[index]
    index += 1
    m, kind = event.worker, event.kind
    if kind == "pull":
      ops.append(Op("pull", m, durations=(event.duration, 0.0)))
      iteration[m], computed[m] = event.iteration, False
    elif kind == "apply":
      if not computed[m]:
        pending = (iteration >= 0) & ~computed
        batched("compute", pending, [max(int(c), 0) for c in iteration])
        computed |= pending
      following = events[index] if index <= end else None
      if following is not None and following.kind == "pull" and following.worker == m:
        # A push and the same worker's next pull, as in a parameter server's
        # round trip: one op.
        ops.append(Op("apply_pull", m, durations=(event.duration, following.duration)))
        iteration[m], computed[m] = following.iteration, False
        index += 1
      else:
        ops.append(Op("apply", m, durations=(event.duration, 0.0)))
        computed[m], iteration[m] = False, -1
    elif kind == "local":
      queued[m].append(event.iteration)
    elif kind == "exchange":
      if queued[m]:
        flush()
      ops.append(Op("exchange", m))
    elif kind == "step":
      ops.append(Op("step", iteration=event.iteration,
                    pairs=tuple((w, event.iteration) for w in range(num_workers))))
    elif kind in ("gossip", "average"):
      if queued[m] or queued[event.peer]:
        flush()
      ops.append(Op("pair", m, peer=event.peer))
  flush()
  return ops


def plan_sizes(events: Sequence, step_ends: Sequence[int], num_workers: int,
               one_at_a_time: bool) -> tuple[int, int]:
  """A dry run of every step's plan -> (most ops, most batch ops) in a step,
  so that op arrays have one shape and each step compiles once."""
  iteration, computed = np.full(num_workers, -1), np.zeros(num_workers, bool)
  longest = batch_ops = 1
  for start, end in zip([0] + [e + 1 for e in step_ends], step_ends):
    ops = plan(events, start, end, iteration, computed, one_at_a_time)
    longest = max(longest, len(ops))
    batch_ops = max(batch_ops, sum(op.pairs is not None for op in ops))
  return longest, batch_ops


def trace_gradient(problem: Problem, batch: int):
  """One worker's gradient on a `batch`-example batch, traced on abstract
  values (nothing allocated, nothing compiled)."""
  params, model_state = jax.eval_shape(problem.model.init, jax.random.key(0))
  x = Batch(jax.ShapeDtypeStruct((batch, *problem.model.image_shape), jnp.float32),
            jax.ShapeDtypeStruct((batch,), jnp.int32), jax.ShapeDtypeStruct((batch,), jnp.float32))
  grad = lambda p, s, b: problem.gradients(p, s, b, WorkerAxis(1))
  return jax.jit(grad).trace(params, model_state, x)


def choose_batching(problem: Problem, batch: int) -> str:
  """"loop" on the CPU for models with convolutions, else "vmap" (see above).

  A rule on the program's structure rather than a timing at setup: the two
  ways round differently, and a run, its resume and its replay must give
  the same bits.
  """
  if jax.default_backend() != "cpu":
    return "vmap"
  jaxpr = trace_gradient(problem, batch).jaxpr
  return "loop" if _has_primitive(jaxpr.jaxpr, "conv_general_dilated") else "vmap"


def _has_primitive(jaxpr, name: str) -> bool:
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == name:
      return True
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      if _has_primitive(sub, name):
        return True
  return False


class DeviceBatches:
  """Batches by index: rows of a device-resident split, or of a step's table."""

  def __init__(self, streams: WorkerStreams, capacity: int):
    self.streams, self.b_max = streams, max(streams.batch_sizes)
    self.num_workers = streams.num_workers
    split, n = streams.split, len(streams.split)
    example = split.gather(np.arange(1))[0]
    self.resident = isinstance(split, ArraySplit) and n * example.nbytes <= RESIDENT_BYTES
    if self.resident:  # one gather of everything: the same floats, row by row
      images, labels = split.gather(np.arange(n))
      # A zero row for padding, as np.pad gives.
      self.pad = n
      self.data = (jnp.asarray(np.concatenate([images, np.zeros_like(images[:1])])),
                   jnp.asarray(np.concatenate([labels, np.zeros_like(labels[:1])])))
    else:
      self.rows = self.num_workers * self.b_max
      self.shape = (capacity * self.rows + 1, *example.shape[1:])
    total = sum(streams.batch_sizes)
    self.weights = np.stack([np.where(np.arange(self.b_max) < b, 1.0 / total, 0.0)
                             for b in streams.batch_sizes]).astype(np.float32)

  def start(self) -> None:
    if not self.resident:
      self.table = (np.zeros(self.shape, np.float32), np.zeros(self.shape[0], np.int32))
      self.used = 0

  def indices(self, pairs) -> np.ndarray:
    """(M, b_max) rows of the workers' batches (padding: a zero row)."""
    if not self.resident:
      return self._gathered(pairs)
    out = np.full((self.num_workers, self.b_max), self.pad, np.int32)
    for v, pair in enumerate(pairs):
      if pair is not None:
        rows = self.streams.indices(*pair)
        out[v, :len(rows)] = rows
    return out

  def _gathered(self, pairs) -> np.ndarray:
    base = self.used * self.rows
    self.used += 1
    out = np.full((self.num_workers, self.b_max), self.shape[0] - 1, np.int32)
    for v, pair in enumerate(pairs):
      if pair is not None:
        x, y = self.streams.batch(*pair)
        rows = base + v * self.b_max + np.arange(len(y))
        self.table[0][rows], self.table[1][rows] = x, y
        out[v, :len(y)] = rows
    return out

  def step_data(self):
    return self.data if self.resident else jax.device_put(self.table)


def _take(tree, m):
  return jax.tree.map(lambda x: lax.dynamic_index_in_dim(x, m, keepdims=False), tree)


def _put(tree, m, value, taken=None):
  """Writes worker m's `value` into the stacked `tree`, except the leaves that
  are still those `taken` out of it (e.g. a gradient the server only read):
  rewriting a buffer with its own slice made XLA copy the whole buffer.

  A dynamic-update-slice updates the donated buffer in place; `.at[m].set`
  (a scatter) became a select over the whole stacked array on the CPU.
  """
  taken = jax.tree.leaves(taken) if taken is not None else None
  leaves, treedef = jax.tree.flatten(tree)
  values = treedef.flatten_up_to(value)
  return treedef.unflatten([
      x if taken is not None and v is taken[i] else lax.dynamic_update_index_in_dim(x, v, m, 0)
      for i, (x, v) in enumerate(zip(leaves, values))])


def handlers(algorithm: Algorithm, problem: Problem, config,
             weights: np.ndarray) -> dict[str, Callable]:
  """Each op kind's math: (server, workers, sums, op, data) -> (server, workers, sums),
  with `sums` the (loss sum, count) of the step's metrics so far."""
  bind = lambda fn: functools.partial(fn, problem, config)
  one = WorkerAxis(size=1)  # asynchronous workers share no collective
  weights_MxB = jnp.asarray(weights)
  # A timed algorithm's pull and apply also get the event's duration.
  timed = lambda fn: (fn if algorithm.timed
                      else lambda server, worker, duration: fn(server, worker))
  add = lambda sums, loss, count: (sums[0] + loss, sums[1] + count)
  out = {"noop": lambda server, workers, sums, op, data: (server, workers, sums)}

  def batched(fn):
    fn = jax.vmap(functools.partial(bind(fn), axis=one))

    def run(server, workers, sums, op, data):
      new, metrics = fn(workers, Batch(data[0][op.index], data[1][op.index], weights_MxB))
      keep = lambda n, o: jnp.where(op.mask.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
      share = weights_MxB.sum(axis=1)  # metric shares -> each worker's own means
      return server, jax.tree.map(keep, new, workers), add(
          sums, jnp.sum(metrics["loss"] / share * op.mask), jnp.sum(op.mask, dtype=jnp.float32))
    return run

  def one_worker(fn):
    fn = functools.partial(bind(fn), axis=one)

    def run(server, workers, sums, op, data):
      m, index = op.worker, op.index[op.worker]
      taken = _take(workers, m)
      new, metrics = fn(taken, Batch(data[0][index], data[1][index], weights_MxB[m]))
      return server, _put(workers, m, new, taken), add(sums, metrics["loss"] / weights_MxB[m].sum(), 1.0)
    return run

  for kind in ("compute", "local"):
    if getattr(algorithm, kind):
      out[kind], out[f"{kind}_one"] = batched(getattr(algorithm, kind)), one_worker(
          getattr(algorithm, kind))
  if algorithm.pull:
    pull = timed(bind(algorithm.pull))
    def pull_fn(server, workers, sums, op, data):
      taken = _take(workers, op.worker)
      return server, _put(workers, op.worker, pull(server, taken, op.durations[0]), taken), sums
    out["pull"] = pull_fn
  if algorithm.apply:
    apply = timed(bind(algorithm.apply))

    def apply_fn(server, workers, sums, op, data):
      taken = _take(workers, op.worker)
      server, worker = apply(server, taken, op.durations[0])
      return server, _put(workers, op.worker, worker, taken), sums
    out["apply"] = apply_fn
    if algorithm.pull:
      def apply_pull(server, workers, sums, op, data):
        taken = _take(workers, op.worker)
        server, worker = apply(server, taken, op.durations[0])
        return server, _put(workers, op.worker, pull(server, worker, op.durations[1]), taken), sums
      out["apply_pull"] = apply_pull
  if algorithm.exchange:
    exchange = bind(algorithm.exchange)

    def exchange_fn(server, workers, sums, op, data):
      taken = _take(workers, op.worker)
      server, worker = exchange(server, taken)
      return server, _put(workers, op.worker, worker, taken), sums
    out["exchange"] = exchange_fn
  if algorithm.pair:
    pair = bind(algorithm.pair)

    def pair_fn(server, workers, sums, op, data):
      a, b = pair(_take(workers, op.worker), _take(workers, op.peer))
      return server, _put(_put(workers, op.worker, a), op.peer, b), sums
    out["pair"] = pair_fn
  if algorithm.step:  # a collective algorithm: all workers vmapped on this device
    m = config.algorithm.workers
    axis = WorkerAxis(size=m, local="workers", local_size=m)
    step = jax.vmap(functools.partial(bind(algorithm.step), axis=axis),
                    in_axes=(0, 0, None), axis_name="workers")

    def step_fn(server, workers, sums, op, data):
      batch = Batch(data[0][op.index], data[1][op.index], weights_MxB)
      workers, metrics = step(workers, batch, op.iteration)
      return server, workers, add(sums, jnp.sum(metrics["loss"]), 1.0)
    out["step"] = step_fn
  return out


class OpRunner:
  """Runs a step's ops: one scanned call ("scan"), or one call per op."""

  def __init__(self, fns: dict[str, Callable], batching: str, length: int,
               batches: DeviceBatches):
    self.names, self.batching, self.length, self.batches = list(fns), batching, length, batches
    if batching == "scan":
      branches = [fns[n] for n in self.names]

      def run(server, workers, ops, data):
        def body(carry, op):
          return lax.switch(op.kind, branches, *carry, op, data), None
        (server, workers, sums), _ = lax.scan(body, (server, workers, _zero_sums()), ops)
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
    worker, peer, iteration = (np.zeros(length, np.int32) for _ in range(3))
    durations = np.zeros((length, 2), np.float32)
    mask = np.zeros((length, m), bool)
    index = np.zeros((length, m, b), np.int32)
    for i, op in enumerate(ops):
      kind[i] = self.names.index(op.kind)
      worker[i], peer[i], iteration[i], durations[i] = op.worker, op.peer, op.iteration, op.durations
      if op.mask is not None:
        mask[i] = op.mask
      if op.pairs is not None:
        index[i] = self.batches.indices(op.pairs)
    return OpArrays(kind, worker, peer, iteration, durations, mask, index)

  def __call__(self, server, workers, ops: list[Op]):
    self.batches.start()
    if self.batching == "scan":
      arrays = self.encode(ops, self.length)
      return self.jitted["scan"](server, workers, arrays, self.batches.step_data())
    arrays = self.encode(ops, len(ops))
    data, sums = self.batches.step_data(), _zero_sums()
    start = 0
    while start < len(ops):
      kind, end = ops[start].kind, start + 1
      while end < len(ops) and ops[end].kind == kind:
        end += 1
      if end - start > 1 and kind in self.runs:
        pad = lambda x: np.concatenate([x[start:end], np.zeros_like(x[:self.length - end + start])])
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


def _zero_sums():
  return (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))
