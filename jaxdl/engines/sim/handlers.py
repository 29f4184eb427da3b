"""Each op kind's math, from the algorithm's own pure functions.

A handler is ``(server, workers, sums, op, data) -> (server, workers, sums)``:
`server` the server's state (for gossip: the messages in flight, stacked over
slots), `workers` stacked over workers, `sums` the (metric sums, count) of the
step's metrics so far (each computing worker's own means, summed), `op` one
row of the step's op arrays (a cheap op: its worker, peer, durations, slot)
or, for a kind that computes batches (`plan.BATCH_KINDS`), its `BatchArrays`, and
`data` the device batches. The shapes' functions are adapted to that one
signature here; no algorithm's math is written in the engine.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdl.algorithms import Batch, Collective, Shape, WorkerAxis
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


def _rows(data, index):
  """The rows `index` of every field of the data table."""
  return jax.tree.map(lambda x: x[index], data)


def handlers(algorithm: Shape, num_workers: int, global_batch: int,
             pad: int) -> dict[str, Callable]:
  """Each op kind's handler (see the module's docstring). An example's
  weight is 1/B (`global_batch`), a padding row's (index `pad`) 0: batches
  of any size, whatever the partition of B at their step."""
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
    """Over all M workers, masked (K = M), or over the K rows computing,
    gathered and written back: the work of K gradients, not M."""
    fn = jax.vmap(fn)

    def run(server, workers, sums, op, data):
      weights = weights_of(op.index)
      batch = Batch(_rows(data, op.index), weights, op.ids)
      share = weights.sum(axis=1)  # metric shares -> each worker's own means
      if op.mask.shape[0] == num_workers:
        new, metrics = fn(workers, batch)
        keep = lambda n, o: n if n is o else jnp.where(
            op.mask.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
        workers = jax.tree.map(keep, new, workers)
      else:
        taken = _gather(workers, op.rows)
        new, metrics = fn(taken, batch)
        workers = _scatter(workers, op.rows, new, taken)
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
