"""Pipeline parallelism: a model's stages on the devices of a stage axis.

A model split into p stages, stage s a function `fn_s(params_s, x) -> y` of
its own parameters, runs with stage s on device s of a mesh axis; each
global batch is cut into m micro-batches. A schedule (`schedule`: GPipe, or
1F1B) says what each stage does in each slot: a forward of a micro-batch
(its output handed to the next stage, `lax.ppermute`), a backward (its
input's cotangent handed to the stage before; the last stage's starts from
the micro-batch's loss), or nothing (the bubble: (p - 1) of m + p - 1). One
executor runs any schedule (`scheduled_gradients`), a backward recomputing
its stage's forward from the input kept at the forward; the loss's gradient
it returns is a custom VJP, so an algorithm differentiates the loss as any
other (`pipeline_task`).

Stages may differ in shape (a convolution's, a dense layer's): every device holds its
stage's parameters as one row of a (p, L) array (raveled, zero padded to
the largest stage's L), and its activations cross the axis as
(micro-batch, A) rows (each example's activation raveled, zero padded to
the widest boundary's A); each device runs its own stage's function
(`lax.switch` on its index along the axis). An elementwise optimizer
(sgd, momentum, adam) updates a row as it would the stage's leaves; the
padding's gradients are zero.

Stages with batch norm normalize each micro-batch by its own statistics (as
GPipe does) and move their running statistics at each forward, micro-batch
0 first; those statistics travel as (p, S) rows like the parameters. A step
then equals one device running the micro-batches in turn (`pipeline_task`'s
loss off the stage axis). `stage_seconds` times each stage's own work of a
step alone on its device: over a run's step time, each device's busy
fraction (jaxdl.engines.mesh).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.flatten_util import ravel_pytree

from jaxdl.errors import ConfigError
from jaxdl.models import MODELS, Model, resolve_stem
from jaxdl.models.layers import BatchStats
from jaxdl.task import Task, classification, weighted_cross_entropy


@dataclasses.dataclass(frozen=True)
class Stages:
  """A model as p stages: `fns[s](params_s, x) -> y`, or, for stages with
  state (batch norm's running statistics), `fns[s](params_s, state_s, x,
  train, stats) -> (y, state_s)`; the parameters' structure of each stage
  (`unravels`, from its leaves) and of its state, the shape of an example's
  input to each stage and of the last stage's output."""
  fns: tuple[Callable, ...]
  sizes: tuple[int, ...]                 # each stage's parameter count
  unravels: tuple[Callable, ...]         # a stage's raveled parameters -> its pytree
  shapes: tuple[tuple[int, ...], ...]    # an example's activation entering stage s; last: output
  dtype: Any
  state_sizes: tuple[int, ...] = ()      # each stage's state's count; () without state
  state_unravels: tuple[Callable, ...] = ()

  @classmethod
  def of(cls, fns: Sequence[Callable], params: Sequence[Any], input_shape: Sequence[int],
         states: Sequence[Any] | None = None) -> Stages:
    """Stages from their functions and parameters (and states, for stages
    with state; traced for the shapes of one example's activations from
    `input_shape`)."""
    raveled = [ravel_pytree(p) for p in params]
    kept = [ravel_pytree(s) for s in states] if states is not None else []
    stages = cls(tuple(fns), tuple(int(r.size) for r, _ in raveled),
                 tuple(u for _, u in raveled), (), raveled[0][0].dtype,
                 tuple(int(r.size) for r, _ in kept), tuple(u for _, u in kept))
    shapes = [tuple(input_shape)]
    for s, p in enumerate(params):
      state = states[s] if states is not None else None
      out = jax.eval_shape(lambda x: stages.apply(s, p, state, x, True)[0],
                           jax.ShapeDtypeStruct((1, *shapes[-1]), jnp.float32))
      shapes.append(tuple(out.shape[1:]))
    dtypes = {r.dtype for r, _ in raveled}
    if len(dtypes) != 1:
      raise ValueError(f"stages' parameters of one dtype, not {sorted(map(str, dtypes))}")
    return dataclasses.replace(stages, shapes=tuple(shapes))

  @property
  def count(self) -> int:
    return len(self.fns)

  @property
  def stateful(self) -> bool:
    return bool(self.state_sizes)

  @property
  def width(self) -> int:
    """A raveled activation's length: the widest boundary's."""
    return max(math.prod(s) for s in self.shapes)

  def apply(self, s: int, params, state, x: jax.Array, train: bool, stats=None):
    """Stage s on `x`: (its output, its state after; `state` as given
    without state or in evaluation)."""
    if not self.stateful:
      return self.fns[s](params, x), state
    return self.fns[s](params, state, x, train, stats)

  def rows(self, params: Sequence[Any]) -> jax.Array:
    """The stages' parameters as (p, L) rows, each raveled and zero padded."""
    return _rows(params, self.sizes)

  def params(self, rows: jax.Array) -> list[Any]:
    """The stages' parameter pytrees from their rows."""
    return [u(rows[s, :n]) for s, (u, n) in enumerate(zip(self.unravels, self.sizes))]

  def state_rows(self, states: Sequence[Any]) -> jax.Array:
    """The stages' states as (p, S) rows, as `rows`."""
    return _rows(states, self.state_sizes)

  def states(self, rows: jax.Array) -> list[Any]:
    """The stages' state pytrees from their rows."""
    return [u(rows[s, :n]) for s, (u, n) in
            enumerate(zip(self.state_unravels, self.state_sizes))]

  def on_rows(self, s: int) -> Callable:
    """Stage s in training on padded rows: (its row of L, its state's row
    of S, activations (b, A), batch-norm stats) -> ((b, A), its state's row
    after)."""
    def run(row, state_row, x, stats=None):
      b = x.shape[0]
      inputs = x[:, :math.prod(self.shapes[s])].reshape(b, *self.shapes[s])
      state = (self.state_unravels[s](state_row[:self.state_sizes[s]]) if self.stateful
               else None)
      y, state = self.apply(s, self.unravels[s](row[:self.sizes[s]]), state, inputs, True,
                            stats)
      y = y.reshape(b, -1)
      if self.stateful:
        state_row = state_row.at[:self.state_sizes[s]].set(ravel_pytree(state)[0])
      return jnp.pad(y, ((0, 0), (0, self.width - y.shape[1]))), state_row
    return run

  def padded(self, micro: jax.Array) -> jax.Array:
    """Micro-batches (m, b, *input shape) as activation rows (m, b, A)."""
    flat = micro.reshape(micro.shape[0], micro.shape[1], -1)
    return jnp.pad(flat, ((0, 0), (0, 0), (0, self.width - flat.shape[2]))).astype(self.dtype)

  def forward(self, params: Sequence[Any], states: Sequence[Any] | None, x: jax.Array,
              train: bool = False, stats=None) -> tuple[jax.Array, list[Any] | None]:
    """The stages one after the other on one device: the model's output and
    the stages' states after (None without state)."""
    after = []
    for s, p in enumerate(params):
      x, state = self.apply(s, p, states[s] if states is not None else None, x, train, stats)
      after.append(state)
    return x, after if states is not None else None

  def sequential(self, params: Sequence[Any], x: jax.Array) -> jax.Array:
    """The stages one after the other on one device (without state): the model's output."""
    return self.forward(params, None, x)[0]


def _rows(trees: Sequence[Any], sizes: Sequence[int]) -> jax.Array:
  """Pytrees as rows of one array, each raveled and zero padded to the longest."""
  length = max(sizes)
  return jnp.stack([jnp.pad(ravel_pytree(t)[0], (0, length - n))
                    for t, n in zip(trees, sizes)])


IDLE, FORWARD, BACKWARD = 0, 1, 2


SCHEDULES = ("gpipe", "1f1b")


def schedule(kind: str, stages: int, microbatches: int) -> np.ndarray:
  """A pipeline schedule's slots: (T, p, 2) int, [t, s] = (what stage s does
  in slot t: IDLE, FORWARD or BACKWARD, of which micro-batch).

  gpipe: every stage takes all m forwards, then all m backwards (m
  micro-batches' inputs kept a stage). 1f1b (PipeDream-flush): stage s takes
  min(p - 1 - s, m) forwards, then alternates a forward and a backward, then
  the backwards left (at most p kept). An operation waits for what it needs
  (the stage before's forward, the stage after's backward, its own forward)
  from an earlier slot. Both take T = 2 (m + p - 1) slots: the same bubble."""
  if kind not in SCHEDULES:
    raise ValueError(f"schedule {kind!r}: one of {', '.join(SCHEDULES)}")
  p, m = stages, microbatches
  orders = []
  for s in range(p):
    warm = m if kind == "gpipe" else min(p - 1 - s, m)
    order = [(FORWARD, i) for i in range(warm)]
    for i in range(m - warm):
      order += [(FORWARD, warm + i), (BACKWARD, i)]
    order += [(BACKWARD, i) for i in range(m - warm, m)]
    orders.append(order)
  done: dict[tuple[int, int, int], int] = {}  # (op, micro-batch, stage) -> its slot
  slots, position = [], [0] * p
  while any(position[s] < 2 * m for s in range(p)):
    t, row = len(slots), []
    for s in range(p):
      if position[s] == 2 * m:
        row.append((IDLE, 0))
        continue
      op, i = orders[s][position[s]]
      need = ((FORWARD, i, s - 1) if op == FORWARD and s > 0 else
              (BACKWARD, i, s + 1) if op == BACKWARD and s < p - 1 else
              (FORWARD, i, s) if op == BACKWARD else None)
      if need is None or done.get(need, t) < t:
        row.append((op, i))
      else:
        row.append((IDLE, 0))
    for s, (op, i) in enumerate(row):
      if op != IDLE:
        done[(op, i, s)] = t
        position[s] += 1
    slots.append(row)
  return np.asarray(slots, np.int32)


def held(table: np.ndarray) -> int:
  """The most micro-batches a stage holds at once in a schedule: inputs kept
  from a forward to its backward, activations and cotangents received and
  not yet used. Each is a run of consecutive micro-batches, so buffers of
  this many rows, indexed by micro-batch mod it, never collide."""
  p = table.shape[1]
  slot = {(int(o), int(i), s): t for t in range(len(table)) for s in range(p)
          for o, i in [table[t, s]] if o != IDLE}
  m = max(i for _, i, _ in slot) + 1
  most = 0
  for s in range(p):
    # each buffer's spans (from, to], one per micro-batch: held after `from`, up to
    # `to`: inputs kept, activations received, cotangents received
    buffers = [[(slot[(FORWARD, i, s)], slot[(BACKWARD, i, s)]) for i in range(m)]]
    if s > 0:
      buffers.append([(slot[(FORWARD, i, s - 1)], slot[(FORWARD, i, s)]) for i in range(m)])
    if s < p - 1:
      buffers.append([(slot[(BACKWARD, i, s + 1)], slot[(BACKWARD, i, s)]) for i in range(m)])
    for spans in buffers:
      held_at = np.zeros(len(table) + 1, int)
      for start, end in spans:  # held in slots start + 1 ... end
        held_at[start + 1:end + 1] += 1
      most = max(most, int(held_at.max()))
  return most


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
  flat = stages.padded(micro)
  forward = [stages.on_rows(i) for i in range(p)]
  out_size = math.prod(stages.shapes[-1])
  stats_of = stats or (lambda i: None)

  def last_loss(row, state, x, i):  # the last stage's output and its loss
    y = forward[p - 1](row, state, x, stats_of(i))[0]
    outputs = y[:, :out_size].reshape(b, *stages.shapes[-1])
    return loss(outputs, jax.tree.map(lambda a: a[i], aux))

  def slot(carry, slots):
    kept, inputs, cotangents, from_before, from_after, grad, total, state = carry
    ops, before = slots  # this slot's operations, and the slot before's
    # what the neighbours sent in the slot before, kept by micro-batch until used
    sent = lambda j, op: (j >= 0) & (j < p) & (before[jnp.clip(j, 0, p - 1), 0] == op)
    which = lambda j: before[jnp.clip(j, 0, p - 1), 1] % k
    inputs = jnp.where(sent(s - 1, FORWARD), inputs.at[which(s - 1)].set(from_before), inputs)
    cotangents = jnp.where(sent(s + 1, BACKWARD),
                           cotangents.at[which(s + 1)].set(from_after), cotangents)
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

  zeros = jnp.zeros((b, stages.width), stages.dtype)
  ring = jnp.zeros((k, b, stages.width), stages.dtype)
  start = jax.lax.pcast((ring, ring, ring, zeros, zeros, jnp.zeros(row.shape, row.dtype),
                         jnp.zeros((), stages.dtype)), (axis,), to="varying")
  if state_row is None:  # (stages without state carry an empty one)
    state_row = jax.lax.pcast(jnp.zeros((0,), stages.dtype), (axis,), to="varying")
  before = jnp.concatenate([jnp.zeros_like(table[:1]), table[:-1]])  # (IDLE, 0) first
  (*_, grad, total, state_row), _ = jax.lax.scan(slot, (*start, state_row), (table, before))
  return jax.lax.psum(total, axis), grad, state_row


def balanced_groups(sizes: Sequence[int], count: int) -> list[range]:
  """`sizes` (the pieces' parameter counts, in order) cut into `count`
  contiguous non-empty groups whose largest total is the smallest possible."""
  n = len(sizes)
  if not 1 <= count <= n:
    raise ValueError(f"{count} stages of {n} pieces: between 1 and {n}")
  ends = np.cumsum([0, *sizes])
  # best[k][i]: the smallest largest total of the first i pieces in k groups
  best = np.full((count + 1, n + 1), np.inf)
  cut = np.zeros((count + 1, n + 1), int)
  best[0][0] = 0
  for k in range(1, count + 1):
    for i in range(k, n + 1):
      for j in range(k - 1, i):
        cost = max(best[k - 1][j], ends[i] - ends[j])
        if cost < best[k][i]:
          best[k][i], cut[k][i] = cost, j
  groups, i = [], n
  for k in range(count, 0, -1):
    groups.append(range(cut[k][i], i))
    i = cut[k][i]
  return groups[::-1]


def model_stages(build: Callable, key: jax.Array, count: int, input_shape: Sequence[int]
                 ) -> tuple[Stages, list[Any], list[Any] | None]:
  """A Flax NNX model (`build(rngs)`, a module with a `pieces()` method: its
  forward pass as a sequence of (submodule, call(submodule, x) -> x), or
  `call(submodule, x, train, stats)` for a model with batch norm) as `count`
  stages of contiguous pieces, balanced by parameter count, and each
  stage's parameters and state (None for a model without state besides its
  parameters): those of the module built from `key`, as the zoo's
  `Model.init(key)` gives them."""
  module = build(nnx.Rngs(key))
  pieces = module.pieces()
  sizes = [sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param))) for m, _ in pieces]
  stateful = bool(jax.tree.leaves(nnx.split(module, nnx.Param, ...)[2]))
  fns, params, states = [], [], []
  for group in balanced_groups(sizes, count):
    holder = nnx.List([pieces[i][0] for i in group])
    calls = [pieces[i][1] for i in group]
    graphdef, own, rest = nnx.split(holder, nnx.Param, ...)
    params.append(nnx.to_pure_dict(own))
    states.append(nnx.to_pure_dict(rest))

    def stage_of(p, state, holder=holder, graphdef=graphdef):
      """The stage's modules: a fresh copy, filled with p (and state)."""
      _, own, rest = nnx.split(holder, nnx.Param, ...)
      nnx.replace_by_pure_dict(own, p)
      if state is not None:
        nnx.replace_by_pure_dict(rest, state)
      return nnx.merge(graphdef, own, rest, copy=True)

    def fn(p, x, stage_of=stage_of, calls=calls):
      stage = stage_of(p, None)
      for i, call in enumerate(calls):
        x = call(stage[i], x)
      return x

    def fn_with_state(p, state, x, train, stats, stage_of=stage_of, calls=calls):
      stage = stage_of(p, state)
      for i, call in enumerate(calls):
        x = call(stage[i], x, train, stats)
      return x, nnx.to_pure_dict(nnx.split(stage, nnx.Param, ...)[2])
    fns.append(fn_with_state if stateful else fn)
  states = states if stateful else None
  return Stages.of(fns, params, input_shape, states), params, states


STAGE_AXIS = "stages"
"""The mesh axis a pipelined model's stages lie along (jaxdl.engines.mesh)."""


@dataclasses.dataclass(frozen=True)
class PipelinedTask(Task):
  """A task whose loss runs a pipeline schedule, and the stages it runs."""
  stages: Stages | None = None


def _pipelined_model(name: str, num_classes: int, image_shape: Sequence[int], stem: str,
                     count: int):
  """The zoo model `name` as a `jaxdl.models.Model` whose parameters are its
  `count` stages' rows ({"stages": (count, L)}) and whose state, with batch
  norm, its stages' states' rows ({"stages": (count, S)}), applied as the
  stages one after the other (evaluation; training goes through
  `pipeline_task`'s loss), and its stages."""
  stem = resolve_stem(stem, tuple(image_shape))
  build = lambda rngs: MODELS.get(name)(tuple(image_shape), num_classes, stem, rngs=rngs)
  pieces = len(nnx.eval_shape(lambda: build(nnx.Rngs(0))).pieces())
  if count > pieces:
    raise ConfigError("stages", count, f"at most {pieces}: {name} is a sequence of {pieces} "
                      "pieces (layers or blocks), a stage at least one")
  stages = model_stages(build, jax.random.key(0), count, image_shape)[0]  # the structure

  def init(key):
    _, params, states = model_stages(build, key, count, image_shape)
    return {"stages": stages.rows(params)}, ({"stages": stages.state_rows(states)}
                                             if stages.stateful else {})

  def apply(params, model_state, images, train, stats=None):
    states = stages.states(model_state["stages"]) if stages.stateful else None
    y, states = stages.forward(stages.params(params["stages"]), states, images, train, stats)
    if train and stages.stateful:
      model_state = {"stages": stages.state_rows(states)}
    return y, model_state

  return Model(name=f"{name}/pipeline{count}", init=init, apply=apply,
               num_classes=num_classes, image_shape=tuple(image_shape)), stages


def _own_row(rows: jax.Array) -> jax.Array:
  """This device's stage's row: its block of the rows laid along the stage
  axis, or, given every stage's row (bsp's pull), its own, every row's
  gradient then summed over the stages (whole on every device)."""
  if rows.shape[0] == 1:
    return rows[0]
  return _gradient_summed_over_stages(rows)[jax.lax.axis_index(STAGE_AXIS)]


def pipeline_task(name: str, dataset, stem: str, count: int, microbatches: int,
                  kind: str):
  """Image classification (jaxdl.task.classification) of the zoo model
  `name` cut into `count` stages, each batch into `microbatches`, trained by
  the schedule `kind` ("gpipe" or "1f1b"): its loss and gradient come from
  `scheduled_gradients` (the loss's gradient is a custom VJP: the
  algorithm's own step takes it as any other). With batch norm, each
  micro-batch is normalized by its own statistics (as GPipe does), the
  running statistics moving once a micro-batch; on one device (the stage
  axis unbound) the micro-batches run in turn, the same math."""
  model, stages = _pipelined_model(name, dataset.num_classes, dataset.image_shape, stem, count)
  task = classification(model, dataset)
  micro_loss = lambda logits, aux: weighted_cross_entropy(logits, *aux)

  def loss(params, model_state, batch, key, stats=None):
    if not stages.stateful and not _bound(STAGE_AXIS):  # one device runs every stage
      return task.loss(params, model_state, batch, key, stats)
    cut = lambda a: a.reshape(microbatches, a.shape[0] // microbatches, *a.shape[1:])
    micro, aux = cut(batch["image"]), (cut(batch["label"]), cut(batch["weight"]))
    masks = cut(stats.mask if stats is not None and stats.mask is not None
                else jnp.ones(batch["weight"].shape, jnp.float32))
    momentum = stats.momentum if stats is not None else None
    stats_of = lambda masks: lambda i: BatchStats(mask=masks[i], momentum=momentum)
    if not _bound(STAGE_AXIS):  # with state: the micro-batches in turn
      states, total = stages.states(model_state["stages"]), 0.0
      for i in range(microbatches):
        logits, states = stages.forward(stages.params(params["stages"]), states, micro[i],
                                        True, stats_of(masks)(i))
        total = total + micro_loss(logits, jax.tree.map(lambda a: a[i], aux))
      return total, ({"stages": stages.state_rows(states)}, {})

    def forward(row, state_row, micro, aux, masks):
      total, grad, after = scheduled_gradients(
          stages, row, micro, aux, micro_loss, STAGE_AXIS, kind,
          state_row if stages.stateful else None, stats_of(masks))
      return (total, after), (grad, state_row, micro, aux, masks)

    value = jax.custom_vjp(lambda *args: forward(*args)[0])

    def backward(saved, cotangents):
      grad, *rest = saved
      zero = lambda a: (np.zeros(a.shape, jax.dtypes.float0)
                        if not jnp.issubdtype(a.dtype, jnp.inexact) else jnp.zeros_like(a))
      return (cotangents[0] * grad, *jax.tree.map(zero, rest))

    value.defvjp(forward, backward)
    state_rows = model_state["stages"] if stages.stateful else jnp.zeros((1, 0), stages.dtype)
    total, after = value(_own_row(params["stages"]), _own_state(state_rows), micro, aux, masks)
    return total, ({"stages": after[None]} if stages.stateful else model_state, {})

  fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
  return PipelinedTask(**{**fields, "loss": loss}, stages=stages)


def _own_state(rows: jax.Array) -> jax.Array:
  """This device's stage's state row: its block of the rows laid along the
  stage axis, or its own of every stage's row."""
  return rows[0] if rows.shape[0] == 1 else rows[jax.lax.axis_index(STAGE_AXIS)]


@jax.custom_vjp
def _gradient_summed_over_stages(x):
  """x; its cotangent summed over STAGE_AXIS."""
  return x


_gradient_summed_over_stages.defvjp(
    lambda x: (x, None), lambda _, g: (jax.lax.psum(g, STAGE_AXIS),))


def _bound(axis: str) -> bool:
  """Whether `axis` is a mesh axis of the computation being traced."""
  try:
    jax.lax.axis_index(axis)
  except NameError:
    return False
  return True


def bubble_fraction(stages: int, microbatches: int) -> float:
  """The share of a stage's ticks in which it has no micro-batch: (p - 1) / (m + p - 1)."""
  return (stages - 1) / (microbatches + stages - 1)


def stage_seconds(stages: Stages, microbatches: int, micro_batch: int, devices,
                  repeats: int = 5) -> list[float]:
  """Each stage's own work in a step, timed alone on its device (`devices[s]`):
  m forwards and m backwards, each backward recomputing its forward, on
  micro-batches of `micro_batch` examples (random parameters and inputs;
  the median of `repeats` runs after a compile). A step's time over these
  is what its bubble, imbalance and messages add."""
  key = jax.random.key(0)
  seconds = []
  for s in range(stages.count):
    run = stages.on_rows(s)

    def work(row, state_row, micro, cotangents, run=run):
      def one(carry, xs):
        state_row, grad = carry
        x, cotangent = xs
        _, state_row = run(row, state_row, x)
        _, pull = jax.vjp(lambda r, a: run(r, state_row, a)[0], row, x)
        return (state_row, grad + pull(cotangent)[0]), None
      return jax.lax.scan(one, (state_row, jnp.zeros_like(row)), (micro, cotangents))[0]

    keys = jax.random.split(jax.random.fold_in(key, s), 3)
    shape = (microbatches, micro_batch, stages.width)
    arguments = jax.device_put((
        0.01 * jax.random.normal(keys[0], (max(stages.sizes),), stages.dtype),
        jnp.zeros((max(stages.state_sizes, default=0),), stages.dtype),
        jax.random.normal(keys[1], shape, stages.dtype),
        jax.random.normal(keys[2], shape, stages.dtype)), devices[s])
    compiled = jax.jit(work).lower(*arguments).compile()
    jax.block_until_ready(compiled(*arguments))
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(compiled(*arguments))
      times.append(time.perf_counter() - start)
    seconds.append(float(np.median(times)))
  return seconds
