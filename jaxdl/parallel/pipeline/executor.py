"""The executor of a pipeline schedule: inside `shard_map` over the stage
axis, each device runs its stage's operations slot by slot (`schedules`),
handing activations forward and cotangents back (`lax.ppermute`); a
backward recomputes its stage's forward from the input kept at the forward."""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from jaxdl.parallel.pipeline.schedules import BACKWARD, FORWARD, held, schedule
from jaxdl.parallel.pipeline.stages import Stages


def scheduled_gradients(stages: Stages, row: jax.Array, micro: jax.Array, aux,
                        loss: Callable, axis: str, kind: str = "1f1b",
                        state_row: jax.Array | None = None, stats: Callable | None = None
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The loss summed over micro-batches `micro` (m, b, *input shape) and its
  gradient with respect to this device's stage `row`, by the schedule `kind`
  (`schedule`), inside `shard_map` over `axis`: (the loss on every device,
  this stage's row's gradient, its state's row after). `loss(outputs,
  aux_i)`: a micro-batch's loss from the last stage's outputs and its `aux`
  (a pytree of (m, ...) arrays: labels, weights). A backward recomputes its
  stage's forward from the input kept at the forward; what a neighbour
  sends is kept by micro-batch until its stage uses it (`held` rows of
  each). Stages with state (batch norm) take this device's stage's
  `state_row` and `stats(i)`, micro-batch i's `BatchStats`: each micro-batch
  is normalized by its own statistics, and the running ones move at each
  forward, micro-batch 0 first (one device running the micro-batches in
  turn computes the same)."""
  p, m, b = stages.count, micro.shape[0], micro.shape[1]
  s = jax.lax.axis_index(axis)
  slots = schedule(kind, p, m)
  table, k = jnp.asarray(slots), held(slots)
  slot = _slot(stages, row, stages.padded(micro), aux, loss, axis, s, k,
               stats or (lambda i: None))
  zeros = jnp.zeros((b, stages.width), stages.dtype)
  ring = jnp.zeros((k, b, stages.width), stages.dtype)
  start = jax.lax.pcast((ring, ring, ring, zeros, zeros, jnp.zeros(row.shape, row.dtype),
                         jnp.zeros((), stages.dtype)), (axis,), to="varying")
  if state_row is None:  # (stages without state carry an empty one)
    state_row = jax.lax.pcast(jnp.zeros((0,), stages.dtype), (axis,), to="varying")
  before = jnp.concatenate([jnp.zeros_like(table[:1]), table[:-1]])  # (IDLE, 0) first
  (*_, grad, total, state_row), _ = jax.lax.scan(slot, (*start, state_row), (table, before))
  return jax.lax.psum(total, axis), grad, state_row


def _slot(stages: Stages, row: jax.Array, flat: jax.Array, aux, loss: Callable, axis: str,
          s: jax.Array, k: int, stats_of: Callable) -> Callable:
  """A slot of the schedule on this device (stage `s`), as a `lax.scan` step
  over (this slot's operations, the slot before's): the carry is (inputs
  kept for backwards, inputs received, cotangents received, in `k`-row
  rings; what the neighbours sent; the row's gradient, the loss and the
  state's row so far). `flat`: the micro-batches as activation rows."""
  p, b = stages.count, flat.shape[1]
  forward = [stages.on_rows(i) for i in range(p)]
  out_size = math.prod(stages.shapes[-1])

  def last_loss(row, state, x, i):  # the last stage's output and its loss
    y = forward[p - 1](row, state, x, stats_of(i))[0]
    outputs = y[:, :out_size].reshape(b, *stages.shapes[-1])
    return loss(outputs, jax.tree.map(lambda a: a[i], aux))

  def slot(carry, slots):
    kept, inputs, cotangents, from_before, from_after, grad, total, state = carry
    ops, before = slots  # this slot's operations, and the slot before's
    inputs, cotangents = _received(before, s, p, k, inputs, cotangents, from_before,
                                   from_after)
    op, i = ops[s, 0], ops[s, 1]
    x = jnp.where(s == 0, flat[i], inputs[i % k])  # a forward's input

    nothing = jnp.zeros_like(total)  # (of total's type: differing among devices)

    def idle(_):
      return kept, jnp.zeros_like(x), jnp.zeros_like(x), jnp.zeros_like(row), nothing, state

    def run_forward(stage):
      def go(_):
        y, after = forward[stage](row, state, x, stats_of(i))
        return kept.at[i % k].set(x), y, jnp.zeros_like(x), jnp.zeros_like(row), nothing, \
            after
      return go

    def run_backward(stage):
      def go(_):
        saved = kept[i % k]
        if stage == p - 1:
          value, pull = jax.vjp(lambda r, a: last_loss(r, state, a, i), row, saved)
          d_row, d_x = pull(jnp.ones_like(value))
        else:
          value = nothing
          _, pull = jax.vjp(lambda r, a: forward[stage](r, state, a, stats_of(i))[0],
                            row, saved)
          d_row, d_x = pull(cotangents[i % k])
        return kept, jnp.zeros_like(x), d_x, d_row, value, state
      return go

    branches = [idle] + [run_forward(j) for j in range(p)] + [run_backward(j) for j in range(p)]
    index = jnp.where(op == FORWARD, 1 + s, jnp.where(op == BACKWARD, 1 + p + s, 0))
    kept, y, d_x, d_row, value, state = jax.lax.switch(index, branches, None)
    from_before = jax.lax.ppermute(y, axis, [(j, j + 1) for j in range(p - 1)])
    from_after = jax.lax.ppermute(d_x, axis, [(j + 1, j) for j in range(p - 1)])
    return (kept, inputs, cotangents, from_before, from_after, grad + d_row,
            total + value, state), None
  return slot


def _received(before: jax.Array, s: jax.Array, p: int, k: int, inputs: jax.Array,
              cotangents: jax.Array, from_before: jax.Array, from_after: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
  """The rings of inputs and cotangents with what the neighbours sent in the
  slot before (`before`: its operations) put in, kept by micro-batch until used."""
  sent = lambda j, op: (j >= 0) & (j < p) & (before[jnp.clip(j, 0, p - 1), 0] == op)
  which = lambda j: before[jnp.clip(j, 0, p - 1), 1] % k
  inputs = jnp.where(sent(s - 1, FORWARD), inputs.at[which(s - 1)].set(from_before), inputs)
  cotangents = jnp.where(sent(s + 1, BACKWARD),
                         cotangents.at[which(s + 1)].set(from_after), cotangents)
  return inputs, cotangents
