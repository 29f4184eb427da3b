"""A parameter server sharded into k shards, each holding some of its leaves.

A parameter server's handlers (pull, apply) are pure functions of its whole
state and a worker's. They split into k shards when their leaves do:
`ShardLayout.of` reads, in each handler's jaxpr, which leaves of its result
depend on which of its arguments, and groups the leaves into parts no
handler mixes. Each shard runs the same handler on its own part (the others'
leaves stand in as zeros, which the compiler drops as unused): the same math
as one server, compiled apart (adam's parameters may differ from one
server's by an ulp, so a sharded run replays with these same programs).
Small leaves that a large one reads, computed from small leaves alone (an
optimizer's step count), are kept by every shard, each computing the same
value; one that the leaves of one part alone read (a compressed gradient's
payload) goes with that part.

An update that reads every leaf (a global-norm clip; LAMB's per-leaf trust
ratio is fine) leaves one part: such a server cannot be split, and
`ShardLayout.of` says so.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np

from jaxdl.algorithms import Centralized
from jaxdl.errors import ConfigError

SHARED_SIZE = 4096
"""Leaves of at most this many elements (counters, LC-ASGD's predictors) may
be kept by every shard."""


def _dependencies(jaxpr, inputs: Sequence[frozenset]) -> list[frozenset]:
  """For each output of `jaxpr`, the union of the sets of the inputs it
  depends on (`inputs`: one set per input variable)."""
  deps: dict[Any, frozenset] = {}
  none = frozenset()
  for v, d in zip(jaxpr.invars, inputs):
    deps[v] = d
  read = lambda v: deps.get(v, none) if not isinstance(v, jex.core.Literal) else none
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    inner = next((eqn.params[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr")
                  if k in eqn.params), None)
    inner = getattr(inner, "jaxpr", inner)
    if (inner is not None and hasattr(inner, "eqns") and len(inner.invars) == len(ins)
        and len(inner.outvars) == len(eqn.outvars)):
      outs = _dependencies(inner, ins)  # a call: look inside it
    else:  # any other primitive: each output depends on every input
      union = frozenset().union(*ins)
      outs = [union] * len(eqn.outvars)
    for v, d in zip(eqn.outvars, outs):
      deps[v] = d
  return [read(v) for v in jaxpr.outvars]


def leaf_dependencies(fn: Callable, args: Sequence) -> list[frozenset]:
  """For each leaf of fn(*args), the indices of the leaves of `args`
  (flattened together, in order) it depends on."""
  flat = jax.tree.leaves(args)
  closed = jax.make_jaxpr(fn)(*args)
  return _dependencies(closed.jaxpr, [frozenset([i]) for i in range(len(flat))])


def _shape(x) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))


def _bytes(x) -> int:
  return math.prod(x.shape) * x.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class ShardLayout:
  """Which leaves of (server, worker) each of k shards holds: `shards[s]`,
  indices into the server's leaves followed by a worker's; `shared`, the
  leaves every shard holds."""
  num_server: int
  shards: tuple[tuple[int, ...], ...]
  shared: tuple[int, ...]

  @staticmethod
  def of(algorithm: Centralized, server, worker, k: int) -> "ShardLayout":
    """Splits a parameter server's leaves (`server` and `worker`: states, or
    their shapes) into `k` shards of about equal bytes; a ConfigError
    ("servers") if its handlers mix them into fewer than k independent parts."""
    server, worker = jax.tree.map(_shape, (server, worker))
    ns = len(jax.tree.leaves(server))
    leaves = jax.tree.leaves((server, worker))
    n = len(leaves)
    seconds = jax.ShapeDtypeStruct((), jnp.float32)
    # what each leaf of the (server, worker) state becomes depends on
    pulled = leaf_dependencies(algorithm.pull, (server, worker, seconds))
    applied = leaf_dependencies(algorithm.apply, (server, worker, seconds))
    depends = [set() for _ in range(n)]
    for j, d in enumerate(pulled):  # pull returns a worker
      depends[ns + j] |= d
    for j, d in enumerate(applied):  # apply returns (server, worker)
      depends[j] |= d
    depends = [{i for i in d if i < n} for d in depends]  # not `seconds`
    # shared: the small leaves a large one depends on, and what they depend on
    # (all small: the small leaves computed from small leaves alone, a fixed point)
    small = {i for i, x in enumerate(leaves) if math.prod(x.shape) <= SHARED_SIZE}
    while True:
      out = {i for i in small if not depends[i] <= small}
      if not out:
        break
      small -= out
    shared = set().union(*(depends[j] & small for j in range(n) if j not in small))
    frontier = set(shared)
    while frontier:
      frontier = set().union(*(depends[i] for i in frontier)) - shared
      shared |= frontier
    # the other leaves: parts no handler mixes (union-find)
    parent = list(range(n))

    def root(i):
      while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
      return i
    for j in range(n):
      if j not in shared:
        for i in depends[j] - shared:
          parent[root(i)] = root(j)
    parts: dict[int, list[int]] = {}
    for i in range(n):
      if i not in shared:
        parts.setdefault(root(i), []).append(i)
    # a small leaf that only one part's leaves depend on (a compressed
    # push's payload of one parameter leaf) joins that part: it is sent to
    # one shard, not to all
    for i in sorted(shared):
      users = {root(j) for j in range(n) if j not in shared and i in depends[j]}
      if len(users) == 1 and not any(i in depends[j] for j in shared if j != i):
        shared.discard(i)
        parts[users.pop()].append(i)
    # a part of small leaves alone (a counter no other leaf reads) is no shard's worth
    large = sum(any(i not in small for i in part) for part in parts.values())
    if large < k:
      raise ConfigError("servers", k, f"at most {large}: this parameter server's update "
                        f"splits its leaves into {large} independent part(s) of more than "
                        f"{SHARED_SIZE} elements (an optimizer that reads all of them, such "
                        "as a global-norm clip, mixes them into one)")
    # largest part first, each to the shard with the fewest bytes so far
    size = lambda part: sum(_bytes(leaves[i]) for i in part)
    loads, shards = [0] * k, [[] for _ in range(k)]
    for part in sorted(parts.values(), key=size, reverse=True):
      s = int(np.argmin(loads))
      loads[s] += size(part)
      shards[s] += part
    return ShardLayout(ns, tuple(tuple(sorted(s + list(shared))) for s in shards),
                     tuple(sorted(shared)))

  def server_leaves(self, s: int) -> tuple[int, ...]:
    """The indices into the server's leaves that shard s holds."""
    return tuple(i for i in self.shards[s] if i < self.num_server)

  def worker_leaves(self, s: int) -> tuple[int, ...]:
    """The indices into a worker's leaves that shard s holds."""
    return tuple(i - self.num_server for i in self.shards[s] if i >= self.num_server)

  def part(self, tree, s: int, server: bool) -> list:
    """Shard s's leaves of a server's state (`server`) or a worker's."""
    flat = jax.tree.leaves(tree)
    return [flat[i] for i in (self.server_leaves(s) if server else self.worker_leaves(s))]

  def join(self, tree, parts: Sequence[Sequence], server: bool, first: int = 0):
    """`tree` (a server's state, or a worker's) with its leaves from the
    shards' `parts`, those of shards first, first + 1, ..."""
    flat, treedef = jax.tree.flatten(tree)
    for s, part in enumerate(parts, first):
      for i, x in zip(self.server_leaves(s) if server else self.worker_leaves(s), part):
        flat[i] = x
    return jax.tree.unflatten(treedef, flat)


class ShardPrograms:
  """A parameter server's pull and apply, each jitted for shard s's leaves:
  pull(server, worker, seconds) -> worker and apply(server, worker, seconds)
  -> (server, worker), each from and to lists of the shard's leaves (the
  others' stand in as zeros)."""

  def __init__(self, algorithm: Centralized, server, worker, layout: ShardLayout, s: int):
    server, worker = jax.tree.map(_shape, (server, worker))

    def whole(tree, leaves, is_server):
      zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), tree)
      return layout.join(zeros, [leaves], is_server, first=s)

    def pull(server_part, worker_part, seconds):
      new = algorithm.pull(whole(server, server_part, True),
                           whole(worker, worker_part, False), seconds)
      return layout.part(new, s, False)

    def apply(server_part, worker_part, seconds):
      new_server, new_worker = algorithm.apply(
          whole(server, server_part, True), whole(worker, worker_part, False), seconds)
      return layout.part(new_server, s, True), layout.part(new_worker, s, False)

    self.pull, self.apply = jax.jit(pull), jax.jit(apply)


def sharded(algorithm: Centralized, server, worker, k: int):
  """A parameter server's pull and apply as k shards run them, each shard on
  its own leaves: (layout, each shard's programs, pull, apply), the last
  two with the signatures of the algorithm's own."""
  layout = ShardLayout.of(algorithm, server, worker, k)
  shards = [ShardPrograms(algorithm, server, worker, layout, s) for s in range(k)]

  def pull(server, worker, seconds):
    parts = [p.pull(layout.part(server, s, True), layout.part(worker, s, False),
                    seconds) for s, p in enumerate(shards)]
    return layout.join(worker, parts, False)

  def apply(server, worker, seconds):
    parts = [p.apply(layout.part(server, s, True), layout.part(worker, s, False),
                     seconds) for s, p in enumerate(shards)]
    return (layout.join(server, [new for new, _ in parts], True),
            layout.join(worker, [new for _, new in parts], False))

  return layout, shards, pull, apply
