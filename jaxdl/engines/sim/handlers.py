"""Each op kind's math, from the algorithm's own pure functions.

A handler is ``(server, workers, sums, op, data) -> (server, workers, sums)``:
`server` the server's state (for gossip: the messages in flight, stacked over
slots), `workers` stacked over workers, `sums` the (metric sums, count) of the
step's metrics so far (each computing worker's own means, summed), `op` one
row of the step's op arrays (a cheap op: its worker, peer, durations, slot)
or, for a kind that computes batches (`plan.BATCH_KINDS`), its `BatchArrays`, and
`data` the device batches. The families' functions are adapted to that one
signature here; no algorithm's math is written in the engine.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdl.algorithms import Batch, Collective, Family, WorkerAxis
from jaxdl.engines.events import event_functions


class BatchArrays(NamedTuple):
  """A batched op's workers and batches, over K rows: all M workers (masked),
  or only those computing, in worker order, padded to K with worker M (whose
  rows are computed on a clamped copy and never written back)."""
  mask: Any       # (K,) bool: the row's worker computes
  rows: Any       # (K,) int32: its worker
  index: Any      # (K, b_max) int32: rows of the data table
  ids: Any        # (K, 2) int32: each batch's (worker, step)
  iteration: Any  # () int32: a collective step's iteration



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


def _gather(tree, rows):
  return jax.tree.map(lambda x: x[rows], tree)


def _scatter(tree, rows, value, taken):
  """Writes the rows' `value` into the stacked `tree` (padding rows, index M,
  dropped), except the leaves that are still those `taken` out of it."""
  taken = jax.tree.leaves(taken)
  leaves, treedef = jax.tree.flatten(tree)
  values = treedef.flatten_up_to(value)
  return treedef.unflatten([
      x if v is taken[i] else x.at[rows].set(v, mode="drop", unique_indices=True)
      for i, (x, v) in enumerate(zip(leaves, values))])


def _gathered(fn, workers, rows, index, ids, data, weights_of):
  """`fn` over the `rows` of the stacked `workers` on the batches `index`,
  written back (rows M dropped) -> (workers, the rows' metrics)."""
  taken = _gather(workers, rows)
  new, values = fn(taken, Batch(_rows(data, index), weights_of(index), ids))
  return _scatter(workers, rows, new, taken), values


def _rows(data, index):
  """The rows `index` of every field of the data table."""
  return jax.tree.map(lambda x: x[index], data)


def _keep(old, new, mask):
  """`new`'s rows where `mask`, `old`'s elsewhere (leaves `new` passed
  through untouched)."""
  keep = lambda n, o: n if n is o else jnp.where(
      mask.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
  return jax.tree.map(keep, new, old)


def _in_chunks(fn, workers, op, data, weights_of, chunk: int, num_workers: int):
  """A gathered op's K rows, `chunk` at a time, each chunk gathered and
  written into the (donated) stacked `workers` (padding rows, worker M, and
  rows not in `op.mask` dropped) before the next is computed -> (workers,
  the rows' metrics). What the op holds beside the states is then a chunk's
  gradients and activations, whatever K.

  Every chunk has `chunk` rows, a last one too (it overlaps the one before;
  only its rows not yet written are): XLA's CPU code rounded the mlp's
  vmapped gradient of fewer than 64 rows otherwise than one of more, and
  chunks of 64 gave each row the bits of the op computed whole
  (`tests/engines/test_sim.py`)."""
  k = op.mask.shape[0]

  def part(start, skip, workers, metrics):
    """Rows start, ..., start + chunk - 1, the first `skip` already written."""
    take = lambda x: lax.dynamic_slice_in_dim(x, start, chunk)
    index, fresh = take(op.index), jnp.arange(chunk) >= skip
    rows = jnp.where(fresh & take(op.mask), take(op.rows), num_workers)
    workers, values = _gathered(fn, workers, rows, index, take(op.ids), data, weights_of)
    metrics = {name: lax.dynamic_update_slice_in_dim(
        v, jnp.where(fresh, values[name], take(v)), start, 0) for name, v in metrics.items()}
    return workers, metrics

  metrics = _zero_metrics(fn, workers, op, data, weights_of, chunk, k)

  def body(i, carry):
    start = jnp.minimum(i * chunk, k - chunk)
    return part(start, i * chunk - start, *carry)
  return lax.fori_loop(0, -(-k // chunk), body, (workers, metrics))


def _pending(fn, workers, op, data, weights_of, chunk: int, num_workers: int):
  """An op over all M workers (masked) that computes only the rows of
  `op.mask`, in worker order, `chunk` at a time: ceil(count / chunk) chunks,
  each gathered and written back (rows past the count: worker M, dropped)
  -> (workers, the M rows' metrics, zero where no worker computes). Rows
  whose gradient waits in the states are not computed again: at 32 workers
  a masked op of the bench's schedule recomputed 17% of its rows
  (BENCHMARKS.md)."""
  m = num_workers
  count = jnp.sum(op.mask, dtype=jnp.int32)
  order = jnp.concatenate([jnp.argsort(~op.mask, stable=True).astype(jnp.int32),
                           jnp.full((chunk,), m, jnp.int32)])
  metrics = _zero_metrics(fn, workers, op, data, weights_of, chunk, m)

  def body(i, carry):
    workers, metrics = carry
    rows = jnp.where(i * chunk + jnp.arange(chunk) < count,
                     lax.dynamic_slice_in_dim(order, i * chunk, chunk), m)
    # (op.index and op.ids clamped for the rows past the count)
    workers, values = _gathered(fn, workers, rows, op.index[rows], op.ids[rows], data,
                                weights_of)
    return workers, {k: v.at[rows].set(values[k], mode="drop", unique_indices=True)
                     for k, v in metrics.items()}
  return lax.fori_loop(0, (count + chunk - 1) // chunk, body, (workers, metrics))


def _zero_metrics(fn, workers, op, data, weights_of, chunk: int, k: int):
  """Zeros for the metrics of k rows, shaped as `fn` reports them."""
  def shapes(workers):
    index = op.index[:chunk]
    batch = Batch(_rows(data, index), weights_of(index), op.ids[:chunk])
    return fn(jax.tree.map(lambda x: x[:chunk], workers), batch)[1]
  return {name: jnp.zeros((k, *v.shape[1:]), v.dtype)
          for name, v in jax.eval_shape(shapes, workers).items()}


CHUNK_ROWS = 64
"""A gathered op of more rows computes them this many at a time
(`_in_chunks`): a program of as many rows as before for every op of up to 64
rows, and one whose rows round as the whole op's for the mlp."""

PENDING_FROM, PENDING_ROWS = 32, 4
"""With at least PENDING_FROM workers, an op over all of them computes only
the rows of the workers computing, PENDING_ROWS at a time (`_pending`).
Fewer workers' ops compute every row, masked: on the mlp (CPU), chunks at 8
workers cost more than the rows they spare, at 16 as much, and at 32 and 64
workers the step fell from 1.41-1.52 to 1.25-1.34 and from 1.47 to 1.30
times the floor (bench.sim_asp; BENCHMARKS.md)."""


def handlers(algorithm: Family, num_workers: int, global_batch: int,
             pad: int, chunk_rows: int = CHUNK_ROWS,
             pending_from: int = PENDING_FROM) -> dict[str, Callable]:
  """Each op kind's handler (see the module's docstring). An example's
  weight is 1/B (`global_batch`), a padding row's (index `pad`) 0: batches
  of any size, whatever the partition of B at their step. A gathered op of
  more than `chunk_rows` rows computes them `chunk_rows` at a time; an op
  over all M workers, M >= `pending_from`, only its computing rows."""
  weight = np.float32(1.0 / global_batch)
  weights_of = lambda index: jnp.where(index == pad, jnp.float32(0.0), weight)
  add = lambda sums, values, count: ({k: v + values[k] for k, v in sums[0].items()},
                                     sums[1] + count)
  out = {"noop": lambda server, workers, sums, op, data: (server, workers, sums)}
  if isinstance(algorithm, Collective):  # all workers vmapped on this device
    m = num_workers
    axis = WorkerAxis(size=m, local="workers", local_size=m)
    step = jax.vmap(lambda worker, batch, t: algorithm.step(worker, batch, t, axis),
                    in_axes=(0, 0, None), axis_name="workers")

    def step_fn(server, workers, sums, op, data):
      batch = Batch(_rows(data, op.index), weights_of(op.index), op.ids)
      workers, metrics = step(workers, batch, op.iteration)
      return server, workers, add(sums, {k: jnp.sum(v) for k, v in metrics.items()}, 1.0)
    out["step"] = step_fn
    return out

  fns = event_functions(algorithm)

  def batched(fn):
    """Over all M workers, masked (K = M; from `pending_from` workers only
    the rows computing), or over the K rows computing, gathered and written
    back: the work of K gradients, not M."""
    fn = jax.vmap(fn)

    def run(server, workers, sums, op, data):
      weights = weights_of(op.index)
      share = weights.sum(axis=1)  # metric shares -> each worker's own means
      every_worker = op.mask.shape[0] == num_workers
      if every_worker and num_workers >= pending_from:
        workers, metrics = _pending(fn, workers, op, data, weights_of, PENDING_ROWS,
                                    num_workers)
      elif op.mask.shape[0] > chunk_rows:
        workers, metrics = _in_chunks(fn, workers, op, data, weights_of, chunk_rows,
                                      num_workers)
      elif every_worker:
        new, metrics = fn(workers, Batch(_rows(data, op.index), weights, op.ids))
        workers = _keep(workers, new, op.mask)
      else:
        workers, metrics = _gathered(fn, workers, op.rows, op.index, op.ids, data, weights_of)
      share = jnp.where(op.mask, share, 1.0)  # a worker not computing: no batch
      means = {k: jnp.sum(v / share * op.mask) for k, v in metrics.items()}
      return server, workers, add(sums, means, jnp.sum(op.mask, dtype=jnp.float32))
    return run

  def one_worker(fn):
    def run(server, workers, sums, op, data):
      m, index = op.rows[0], op.index[0]
      taken = _take(workers, m)
      weights = weights_of(index)
      new, metrics = fn(taken, Batch(_rows(data, index), weights, op.ids[0]))
      share = weights.sum()
      means = {k: v / share for k, v in metrics.items()}
      return server, _put(workers, m, new, taken), add(sums, means, 1.0)
    return run

  for kind in ("compute", "local"):
    if kind in fns:
      out[kind], out[f"{kind}_one"] = batched(fns[kind]), one_worker(fns[kind])
  if "pull" in fns:
    pull = fns["pull"]

    def pull_fn(server, workers, sums, op, data):
      taken = _take(workers, op.worker)
      return server, _put(workers, op.worker, pull(server, taken, op.durations[0]), taken), sums
    out["pull"] = pull_fn

  def received(fn):
    """A server handler: `fn(server, worker, op) -> (server, worker)` on op's worker."""
    def run(server, workers, sums, op, data):
      taken = _take(workers, op.worker)
      server, worker = fn(server, taken, op)
      return server, _put(workers, op.worker, worker, taken), sums
    return run

  if "apply" in fns:
    apply = fns["apply"]
    out["apply"] = received(lambda server, worker, op: apply(server, worker, op.durations[0]))

    def apply_pull(server, workers, sums, op, data):
      taken = _take(workers, op.worker)
      server, worker = apply(server, taken, op.durations[0])
      return server, _put(workers, op.worker, pull(server, worker, op.durations[1]), taken), sums
    out["apply_pull"] = apply_pull
  if "exchange" in fns:
    exchange = fns["exchange"]
    out["exchange"] = received(lambda server, worker, op: exchange(server, worker))
  if "send" in fns:  # the server's place holds the messages in flight
    send, receive = fns["send"], fns["receive"]

    def send_fn(messages, workers, sums, op, data):
      taken = _take(workers, op.worker)
      worker, message = send(taken, op.peer)
      return _put(messages, op.slot, message), _put(workers, op.worker, worker, taken), sums

    def receive_fn(messages, workers, sums, op, data):
      taken = _take(workers, op.worker)
      worker = receive(taken, _take(messages, op.slot))
      return messages, _put(workers, op.worker, worker, taken), sums
    out["send"], out["receive"] = send_fn, receive_fn
  if "pair" in fns:
    pair = fns["pair"]

    def pair_fn(server, workers, sums, op, data):
      a, b = pair(_take(workers, op.worker), _take(workers, op.peer))
      return server, _put(_put(workers, op.worker, a), op.peer, b), sums
    out["pair"] = pair_fn
  return out
