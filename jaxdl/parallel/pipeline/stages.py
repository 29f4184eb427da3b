"""A model cut into pipeline stages: each stage a function of its own
parameters, its parameters and state laid out as padded rows of one array.

Stages may differ in shape (a convolution's, a dense layer's): every device holds its
stage's parameters as one row of a (p, L) array (raveled, zero padded to
the largest stage's L), and its activations cross the axis as
(micro-batch, A) rows (each example's activation raveled, zero padded to
the widest boundary's A); each device runs its own stage's function
(`lax.switch` on its index along the axis). An elementwise optimizer
(sgd, momentum, adam) updates a row as it would the stage's leaves; the
padding's gradients are zero. Stages with batch norm keep their running
statistics as (p, S) rows like the parameters.

`model_stages` cuts a zoo model (its `pieces()`) into contiguous stages
balanced by parameter count (`balanced_groups`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.flatten_util import ravel_pytree


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
