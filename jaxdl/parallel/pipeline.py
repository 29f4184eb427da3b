"""Pipeline parallelism: a model's stages on the devices of a stage axis.

A model split into p stages, stage s a function `fn_s(params_s, x) -> y` of
its own parameters, runs with stage s on device s of a mesh axis: each
global batch is cut into m micro-batches, and at tick t = 0 .. m + p - 2
stage s works on micro-batch t - s (when there is one), then hands its
output to stage s + 1 (`lax.ppermute`). That is GPipe's forward; its
backward, reverse-mode differentiation of the same ticks, runs the ticks
in reverse, ppermute's transpose handing each stage's cotangents back to
the stage before. A stage idles (a "bubble") in (p - 1) of its m + p - 1
ticks.

Stages may differ in shape (a ResNet's, a VGG's): every device holds its
stage's parameters as one row of a (p, L) array (raveled, zero padded to
the largest stage's L), and its activations cross the axis as
(micro-batch, A) rows (each example's activation raveled, zero padded to
the widest boundary's A); each device runs its own stage's function
(`lax.switch` on its index along the axis). An elementwise optimizer
(sgd, momentum, adam) updates a row as it would the stage's leaves; the
padding's gradients are zero.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree


@dataclasses.dataclass(frozen=True)
class Stages:
  """A model as p stages: `fns[s](params_s, x) -> y`, the parameters'
  structure of each stage (`unravels`, from its leaves), the shape of an
  example's input to each stage and of the last stage's output."""
  fns: tuple[Callable, ...]
  sizes: tuple[int, ...]                 # each stage's parameter count
  unravels: tuple[Callable, ...]         # a stage's raveled parameters -> its pytree
  shapes: tuple[tuple[int, ...], ...]    # an example's activation entering stage s; last: output
  dtype: Any

  @classmethod
  def of(cls, fns: Sequence[Callable], params: Sequence[Any],
         input_shape: Sequence[int]) -> Stages:
    """Stages from their functions and parameters (traced for the shapes of
    one example's activations from `input_shape`)."""
    raveled = [ravel_pytree(p) for p in params]
    shapes = [tuple(input_shape)]
    for fn, p in zip(fns, params):
      out = jax.eval_shape(fn, p, jax.ShapeDtypeStruct((1, *shapes[-1]), jnp.float32))
      shapes.append(tuple(out.shape[1:]))
    dtypes = {r.dtype for r, _ in raveled}
    if len(dtypes) != 1:
      raise ValueError(f"stages' parameters of one dtype, not {sorted(map(str, dtypes))}")
    return cls(tuple(fns), tuple(int(r.size) for r, _ in raveled),
               tuple(u for _, u in raveled), tuple(shapes), dtypes.pop())

  @property
  def count(self) -> int:
    return len(self.fns)

  @property
  def width(self) -> int:
    """A raveled activation's length: the widest boundary's."""
    return max(math.prod(s) for s in self.shapes)

  def rows(self, params: Sequence[Any]) -> jax.Array:
    """The stages' parameters as (p, L) rows, each raveled and zero padded."""
    length = max(self.sizes)
    return jnp.stack([jnp.pad(ravel_pytree(p)[0], (0, length - n))
                      for p, n in zip(params, self.sizes)])

  def params(self, rows: jax.Array) -> list[Any]:
    """The stages' parameter pytrees from their rows."""
    return [u(rows[s, :n]) for s, (u, n) in enumerate(zip(self.unravels, self.sizes))]

  def _branch(self, s: int) -> Callable:
    """Stage s on padded rows: (its row of L, activations (b, A)) -> (b, A)."""
    def run(row, x):
      b = x.shape[0]
      inputs = x[:, :math.prod(self.shapes[s])].reshape(b, *self.shapes[s])
      y = self.fns[s](self.unravels[s](row[:self.sizes[s]]), inputs).reshape(b, -1)
      return jnp.pad(y, ((0, 0), (0, self.width - y.shape[1])))
    return run

  def padded(self, micro: jax.Array) -> jax.Array:
    """Micro-batches (m, b, *input shape) as activation rows (m, b, A)."""
    flat = micro.reshape(micro.shape[0], micro.shape[1], -1)
    return jnp.pad(flat, ((0, 0), (0, 0), (0, self.width - flat.shape[2]))).astype(self.dtype)

  def sequential(self, params: Sequence[Any], x: jax.Array) -> jax.Array:
    """The stages one after the other on one device: the model's output."""
    for fn, p in zip(self.fns, params):
      x = fn(p, x)
    return x


def gpipe(stages: Stages, row: jax.Array, micro: jax.Array, axis: str) -> jax.Array:
  """The GPipe forward of micro-batches `micro` (m, b, *input shape) through
  the stages, inside `shard_map` over `axis` (p devices, device s holding
  stage s's `row` of L): the last stage's outputs (m, b, *output shape) on
  the last device, zeros on the others."""
  p, m, b = stages.count, micro.shape[0], micro.shape[1]
  s = jax.lax.axis_index(axis)
  flat = stages.padded(micro)
  branches = [stages._branch(i) for i in range(p)]
  shift = [(i, i + 1) for i in range(p - 1)]

  def tick(carry, t):
    incoming, outputs = carry
    x = jnp.where(s == 0, flat[jnp.clip(t, 0, m - 1)], incoming)
    y = jax.lax.switch(s, branches, row, x)
    done = t - (p - 1)  # the micro-batch the last stage finishes now
    keep = (s == p - 1) & (done >= 0)
    outputs = outputs.at[jnp.clip(done, 0, m - 1)].set(
        jnp.where(keep, y, outputs[jnp.clip(done, 0, m - 1)]))
    return (jax.lax.ppermute(y, axis, shift), outputs), None

  # the carry differs from device to device (shard_map's "varying" values)
  start = jax.lax.pcast((jnp.zeros((b, stages.width), stages.dtype),
                         jnp.zeros((m, b, stages.width), stages.dtype)), (axis,), to="varying")
  (_, outputs), _ = jax.lax.scan(tick, start, jnp.arange(m + p - 1))
  out_shape = stages.shapes[-1]
  return outputs[:, :, :math.prod(out_shape)].reshape(m, b, *out_shape)


IDLE, FORWARD, BACKWARD = 0, 1, 2


def one_f_one_b(stages: int, microbatches: int) -> np.ndarray:
  """1F1B's (PipeDream-flush) slots: (T, p, 2) int, [t, s] = (what stage s
  does in slot t: IDLE, FORWARD or BACKWARD, of which micro-batch). Stage s
  takes min(p - 1 - s, m) forwards, then alternates a forward and a
  backward, then the backwards left; an operation waits for what it needs
  (the stage before's forward, the stage after's backward) from an earlier
  slot. T = 2 (m + p - 1): GPipe's bubble, with at most p micro-batches in
  flight at a stage instead of m."""
  p, m = stages, microbatches
  orders = []
  for s in range(p):
    warm = min(p - 1 - s, m)
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


def one_f_one_b_gradients(stages: Stages, row: jax.Array, micro: jax.Array, aux,
                          loss: Callable, axis: str) -> tuple[jax.Array, jax.Array]:
  """The loss summed over micro-batches `micro` (m, b, *input shape) and its
  gradient with respect to this device's stage `row`, by the 1F1B schedule
  (`one_f_one_b`), inside `shard_map` over `axis`: (the loss on every
  device, this stage's row's gradient). `loss(outputs, aux_i)`: a
  micro-batch's loss from the last stage's outputs and its `aux` (a pytree
  of (m, ...) arrays: labels, weights). A backward recomputes its stage's
  forward from the input kept at the forward (p inputs at most a stage);
  what a neighbour sends is kept by micro-batch until its stage uses it."""
  p, m, b = stages.count, micro.shape[0], micro.shape[1]
  s = jax.lax.axis_index(axis)
  table = jnp.asarray(one_f_one_b(p, m))
  flat = stages.padded(micro)
  forward = [stages._branch(i) for i in range(p)]
  out_size = math.prod(stages.shapes[-1])

  def last_loss(row, x, i):  # the last stage's output and its loss
    y = forward[p - 1](row, x)
    outputs = y[:, :out_size].reshape(b, *stages.shapes[-1])
    return loss(outputs, jax.tree.map(lambda a: a[i], aux))

  def slot(carry, slots):
    kept, inputs, cotangents, from_before, from_after, grad, total = carry
    ops, before = slots  # this slot's operations, and the slot before's
    # what the neighbours sent in the slot before, kept by micro-batch until used
    sent = lambda k, kind: (k >= 0) & (k < p) & (before[jnp.clip(k, 0, p - 1), 0] == kind)
    which = lambda k: before[jnp.clip(k, 0, p - 1), 1] % p
    inputs = jnp.where(sent(s - 1, FORWARD), inputs.at[which(s - 1)].set(from_before), inputs)
    cotangents = jnp.where(sent(s + 1, BACKWARD),
                           cotangents.at[which(s + 1)].set(from_after), cotangents)
    op, i = ops[s, 0], ops[s, 1]
    x = jnp.where(s == 0, flat[i], inputs[i % p])  # a forward's input

    nothing = jnp.zeros_like(total)  # (of total's type: differing among devices)

    def idle(_):
      return kept, jnp.zeros_like(x), jnp.zeros_like(x), jnp.zeros_like(row), nothing

    def run_forward(k):
      def go(_):
        return kept.at[i % p].set(x), forward[k](row, x), jnp.zeros_like(x), \
            jnp.zeros_like(row), nothing
      return go

    def run_backward(k):
      def go(_):
        saved = kept[i % p]
        if k == p - 1:
          value, pull = jax.vjp(lambda r, a: last_loss(r, a, i), row, saved)
          d_row, d_x = pull(jnp.ones_like(value))
        else:
          value = nothing
          _, pull = jax.vjp(forward[k], row, saved)
          d_row, d_x = pull(cotangents[i % p])
        return kept, jnp.zeros_like(x), d_x, d_row, value
      return go

    branches = [idle] + [run_forward(k) for k in range(p)] + [run_backward(k) for k in range(p)]
    index = jnp.where(op == FORWARD, 1 + s, jnp.where(op == BACKWARD, 1 + p + s, 0))
    kept, y, d_x, d_row, value = jax.lax.switch(index, branches, None)
    from_before = jax.lax.ppermute(y, axis, [(j, j + 1) for j in range(p - 1)])
    from_after = jax.lax.ppermute(d_x, axis, [(j + 1, j) for j in range(p - 1)])
    return (kept, inputs, cotangents, from_before, from_after, grad + d_row,
            total + value), None

  zeros = jnp.zeros((b, stages.width), stages.dtype)
  ring = jnp.zeros((p, b, stages.width), stages.dtype)
  start = jax.lax.pcast((ring, ring, ring, zeros, zeros, jnp.zeros(row.shape, row.dtype),
                         jnp.zeros((), stages.dtype)), (axis,), to="varying")
  before = jnp.concatenate([jnp.zeros_like(table[:1]), table[:-1]])  # (IDLE, 0) first
  (*_, grad, total), _ = jax.lax.scan(slot, start, (table, before))
  return jax.lax.psum(total, axis), grad


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


def model_stages(build: Callable, key: jax.Array, count: int,
                 input_shape: Sequence[int]) -> tuple[Stages, list[Any]]:
  """A Flax NNX model (`build(rngs)`, a module with a `pieces()` method: its
  forward pass as a sequence of (submodule, call(submodule, x) -> x)) as
  `count` stages of contiguous pieces, balanced by parameter count, and
  each stage's parameters: those of the module built from `key`, as the
  zoo's `Model.init(key)` gives them. A model with state besides its
  parameters (batch norm) has no stages: each micro-batch would have its
  own statistics."""
  from flax import nnx  # local: the pipeline itself needs no NNX
  module = build(nnx.Rngs(key))
  pieces = module.pieces()
  sizes = [sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param))) for m, _ in pieces]
  fns, params = [], []
  for group in balanced_groups(sizes, count):
    holder = nnx.List([pieces[i][0] for i in group])
    calls = [pieces[i][1] for i in group]
    graphdef, own, rest = nnx.split(holder, nnx.Param, ...)
    if jax.tree.leaves(rest):
      raise ValueError(f"{type(module).__name__}: state besides parameters (batch norm) in "
                       "its pieces: no pipeline stages")
    params.append(nnx.to_pure_dict(own))

    def fn(p, x, holder=holder, graphdef=graphdef, calls=calls):
      _, own, rest = nnx.split(holder, nnx.Param, ...)  # a fresh copy, filled with p
      nnx.replace_by_pure_dict(own, p)
      stage = nnx.merge(graphdef, own, rest, copy=True)
      for i, call in enumerate(calls):
        x = call(stage[i], x)
      return x
    fns.append(fn)
  return Stages.of(fns, params, input_shape), params


STAGE_AXIS = "stages"
"""The mesh axis a pipelined model's stages lie along (jaxdl.engines.mesh)."""


def pipelined_model(name: str, num_classes: int, image_shape: Sequence[int], stem: str,
                    count: int, microbatches: int, zoo=None):
  """The zoo model `name` as a `jaxdl.models.Model` whose parameters are its
  `count` stages' rows ({"stages": (count, L)}; `zoo`: its `_zoo_stages`,
  if made already). In training its apply runs
  GPipe over `microbatches` micro-batches of the batch, inside shard_map
  over STAGE_AXIS (the mesh engine's pipeline); every stage's device gets
  the last stage's logits, their gradient counted once, on the last stage.
  A device holds its stage's row alone where the algorithm's state is laid
  along the stage axis (ar_sgd, local_sgd, sgd: the mesh engine's layout);
  given every row (bsp's pull from its server, whose slices the stages
  share), it runs its own and the rows' gradient is summed over the stages.
  In evaluation, or outside a stage axis, it runs the stages one after the
  other."""
  from jaxdl.models import Model
  stages, build = zoo or _zoo_stages(name, num_classes, image_shape, stem, count)

  def init(key):
    return {"stages": stages.rows(model_stages(build, key, count, image_shape)[1])}, {}

  def apply(params, model_state, images, train, stats=None):
    del stats  # no batch norm in a pipelined model
    rows = params["stages"]
    if not train or not _bound(STAGE_AXIS):  # one device runs every stage
      return stages.sequential(stages.params(rows), images), model_state
    row = _own_row(rows)
    b = images.shape[0]
    micro = images.reshape(microbatches, b // microbatches, *images.shape[1:])
    out = gpipe(stages, row, micro, STAGE_AXIS).reshape(b, -1)
    # the last stage's logits on every stage; the gradient through the last's alone
    return out + jax.lax.stop_gradient(jax.lax.psum(out, STAGE_AXIS) - out), model_state

  return Model(name=f"{name}/pipeline{count}x{microbatches}", init=init, apply=apply,
               num_classes=num_classes, image_shape=tuple(image_shape))


def _zoo_stages(name: str, num_classes: int, image_shape: Sequence[int], stem: str,
                count: int) -> tuple[Stages, Callable]:
  """The zoo model `name`'s stages (their structure), and its builder."""
  from jaxdl.models import MODELS, resolve_stem
  stem = resolve_stem(stem, tuple(image_shape))
  build = lambda rngs: MODELS.get(name)(tuple(image_shape), num_classes, stem, rngs=rngs)
  return model_stages(build, jax.random.key(0), count, image_shape)[0], build


def _own_row(rows: jax.Array) -> jax.Array:
  """This device's stage's row: its block of the rows laid along the stage
  axis, or, given every stage's row (bsp's pull), its own, every row's
  gradient then summed over the stages (whole on every device)."""
  if rows.shape[0] == 1:
    return rows[0]
  return _gradient_summed_over_stages(rows)[jax.lax.axis_index(STAGE_AXIS)]


def pipeline_task(name: str, dataset, stem: str, count: int, microbatches: int,
                  schedule: str):
  """Image classification (jaxdl.task.classification) of the zoo model
  `name` cut into `count` stages, each batch into `microbatches`, run by
  `schedule`: "gpipe" (`pipelined_model`'s apply, differentiated), or
  "1f1b", whose loss and gradient come from `one_f_one_b_gradients` (the
  loss's gradient is a custom VJP: the algorithm's own step takes it as
  any other)."""
  from jaxdl.task import classification
  zoo = _zoo_stages(name, dataset.num_classes, dataset.image_shape, stem, count)
  task = classification(pipelined_model(name, dataset.num_classes, dataset.image_shape, stem,
                                        count, microbatches, zoo), dataset)
  if schedule == "gpipe":
    return task
  stages = zoo[0]
  per_example = lambda logits, labels: optax.softmax_cross_entropy_with_integer_labels(
      logits, labels)
  micro_loss = lambda out, aux: jnp.sum(per_example(out, aux[0]) * aux[1])

  def loss(params, model_state, batch, key, stats=None):
    if not _bound(STAGE_AXIS):  # one device runs every stage
      return task.loss(params, model_state, batch, key, stats)
    cut = lambda a: a.reshape(microbatches, a.shape[0] // microbatches, *a.shape[1:])
    micro, aux = cut(batch["image"]), (cut(batch["label"]), cut(batch["weight"]))

    @jax.custom_vjp
    def value(row, micro, aux):
      return one_f_one_b_gradients(stages, row, micro, aux, micro_loss, STAGE_AXIS)[0]

    def forward(row, micro, aux):
      total, grad = one_f_one_b_gradients(stages, row, micro, aux, micro_loss, STAGE_AXIS)
      return total, (grad, micro, aux)

    def backward(saved, cotangent):
      grad, micro, aux = saved
      zero = lambda a: (np.zeros(a.shape, jax.dtypes.float0)
                        if not jnp.issubdtype(a.dtype, jnp.inexact) else jnp.zeros_like(a))
      return cotangent * grad, zero(micro), jax.tree.map(zero, aux)

    value.defvjp(forward, backward)
    return value(_own_row(params["stages"]), micro, aux), (model_state, {})

  return dataclasses.replace(task, loss=loss)


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
