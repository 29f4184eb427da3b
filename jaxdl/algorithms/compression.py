"""Gradient compression with error feedback, as optax transformations.

A worker keeps a residual e of what it has not sent yet, sends C(g + e) and
keeps e <- g + e - C(g + e) (Seide et al., "1-Bit Stochastic Gradient Descent
and its Application to Data-Parallel Distributed Training of Speech DNNs",
Interspeech 2014; Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory",
NeurIPS 2018; Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes
SignSGD and other Gradient Compression Schemes", ICML 2019). Nothing is lost:
what was sent over all steps plus the residual is the sum of the gradients.

  tx = optax.chain(compression("topk:0.01"), optax.sgd(0.1))
  updates, state = tx.update(grads, state)      # updates: -0.1 * C(g + e)

Placed before the optimizer, as above, the residual is in gradient units and
the transformation compresses what a worker would push; placed after it
(`optax.chain(optax.sgd(0.1), compression(...))`) it compresses the step, which
is Karimireddy et al.'s EF-SGD as written. With plain SGD at a constant rate
the two agree: each compressor here commutes with multiplying by a number
(up to rounding, and to scaled sign's sign(0) = +1).

Public API:
  parse_compress(text, field="compress") -> CompressSpec
                                        the flag's value, "NAME[:ARG]", checked;
                                        a ConfigError(field, ...) if bad
  compression(spec, seed=0, error_feedback=True) -> optax.GradientTransformation
  encoded(spec, updates, state)         the same step as its message's payload
  message_bytes(spec, shapes) -> int    the exact size of one compressed message
  encode(spec, tree, key, memory, unbiased=False) -> (payload, memory)
  decode(spec, payload, like, unbiased=False) -> tree
  zeros(spec, like)                     a payload that decodes to zeros
  compress(spec, tree, key, memory, unbiased=False) -> (tree, memory)
  init_memory(spec, tree, seed=0)       the pure pytree compressor and its memory
  toward(spec, target, reference, key, memory), moved(spec, reference, payload):
                                        a message from a copy both ends hold
  for_worker(state, worker)             a transformation's state with a worker's own draws
  top_k, random_k, qsgd, scaled_sign, power_sgd, kept, qsgd_variance_bound:
                                        the per-leaf compressors
  Sparse, Quantized, Signs, LowRank     their payloads (jaxdl.algorithms.compressors)
  COMPRESSORS                           the registry of compressors by name

A message travels as its payload (`encode`): what `message_bytes` counts,
byte for byte; `decode` gives the dense values it stands for, the same bits
in every program that decodes it.

Every compressor works leaf by leaf (k, norms and ranks are per leaf). Its
randomness is a pure function of a key: the transformation's state carries
the key (its raw data, so a state checkpoints and ships as plain arrays) and
splits it each step, so a run is reproducible from `seed`. To give workers
independent draws, fold a worker's index into `state.key` after `init`.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdl.algorithms.compressors import (COMPRESSORS, INDEX_BYTES, Compressor, LowRank,
                                          Quantized, Signs, Sparse, kept, power_sgd,
                                          power_sgd_rank, qsgd, qsgd_variance_bound, random_k,
                                          scaled_sign, top_k)
from jaxdl.errors import ConfigError

__all__ = ["COMPRESSORS", "INDEX_BYTES", "Compressor", "CompressSpec", "CompressionState",
           "LowRank", "Quantized", "Signs", "Sparse", "compress", "compression", "decode",
           "encode", "encoded", "for_worker", "init_memory", "kept", "message_bytes", "moved",
           "parse_compress", "power_sgd", "power_sgd_rank", "qsgd", "qsgd_variance_bound",
           "random_k", "scaled_sign", "top_k", "toward", "zeros"]


@dataclasses.dataclass(frozen=True)
class CompressSpec:
  """A compressor's name and its argument (a fraction, levels or a rank; None)."""
  name: str
  arg: float | int | None = None

  def __str__(self) -> str:
    return self.name if self.arg is None else f"{self.name}:{self.arg}"


def parse_compress(text: str, field: str = "compress") -> CompressSpec:
  """The --compress flag's "NAME[:ARG]" as a CompressSpec, or a ConfigError
  naming `field` (the flag that gave it: compress or compress_pull).

  topk:FRACTION and randk:FRACTION keep a fraction in (0, 1] of each leaf's
  coordinates; qsgd:LEVELS and powersgd:RANK take integers >= 1; sign and
  none take no argument. Without ARG, the compressor's default.
  """
  name, colon, arg = str(text).partition(":")
  if name not in COMPRESSORS:
    raise ConfigError(field, text, "NAME[:ARG], NAME one of " +
                      ", ".join(COMPRESSORS.get(n).usage() for n in COMPRESSORS))
  compressor = COMPRESSORS.get(name)
  if not colon:
    return CompressSpec(name, compressor.default)
  if not compressor.arg_name:
    raise ConfigError(field, text, f"{name} takes no argument")
  if compressor.arg_name == "FRACTION":
    try:
      value = float(arg)
    except ValueError:
      value = math.nan
    if not 0 < value <= 1:
      raise ConfigError(field, text, f"{name}:FRACTION with FRACTION in (0, 1], the "
                        "share of each leaf's coordinates sent")
    return CompressSpec(name, value)
  if not re.fullmatch(r"[0-9]+", arg) or int(arg) < 1:
    raise ConfigError(field, text,
                      f"{name}:{compressor.arg_name} with {compressor.arg_name} an integer >= 1")
  return CompressSpec(name, int(arg))


def _spec(spec: CompressSpec | str) -> CompressSpec:
  return parse_compress(str(spec))  # a spec built by hand is checked as its text


def message_bytes(spec: CompressSpec | str, shapes) -> int:
  """The bytes of one compressed message of a pytree of `shapes` (arrays or
  jax.ShapeDtypeStruct), summed over leaves. Values are at the leaf's dtype
  (4 bytes for float32):

    none:     d values
    topk:     k values + k int32 indices   (k = kept(d, FRACTION))
    randk:    the same: the indices travel, so a message decodes alone,
              whoever draws which coordinates and whenever it arrives
    qsgd:     one norm + ceil(d * (ceil(log2(s + 1)) + 1) / 8)
    sign:     one scale + ceil(d / 8)
    powersgd: r (n + m) values per matrix (r = min(RANK, n, m)), d per vector
  """
  spec = _spec(spec)
  compressor = COMPRESSORS.get(spec.name)
  return sum(compressor.leaf_bytes(tuple(leaf.shape), np.dtype(leaf.dtype).itemsize, spec.arg)
             for leaf in jax.tree.leaves(shapes))


def init_memory(spec: CompressSpec | str, tree, seed: int = 0) -> tuple:
  """Each leaf's compressor memory (PowerSGD's initial Q, from `seed`; else None)."""
  spec = _spec(spec)
  compressor = COMPRESSORS.get(spec.name)
  key = jax.random.fold_in(jax.random.key(seed), 0)
  return tuple(compressor.init_memory(tuple(x.shape), x.dtype, jax.random.fold_in(key, i),
                                      spec.arg)
               for i, x in enumerate(jax.tree.leaves(tree)))


def encode(spec: CompressSpec | str, tree, key: jax.Array, memory: tuple,
           unbiased: bool = False):
  """(the message of `tree` as it travels, new memory): each leaf's payload
  (Sparse, Quantized, Signs, LowRank, or the leaf itself), with its own key
  (fold_in(key, i)), in the tree's structure.

  The compressors are contractions, E||x - C(x)||^2 <= (1 - delta) ||x||^2
  with delta > 0, as error feedback needs; `unbiased` asks for E[C(x)] = x instead, what compression
  without feedback needs: random-k scaled by d / k and QSGD undamped
  (qsgd_variance_bound). Top-k, sign and PowerSGD have one form.
  """
  spec = _spec(spec)
  compressor = COMPRESSORS.get(spec.name)
  leaves, treedef = jax.tree.flatten(tree)
  out = [compressor.encode(x, jax.random.fold_in(key, i), m, spec.arg, unbiased)
         for i, (x, m) in enumerate(zip(leaves, memory))]
  return treedef.unflatten([p for p, _ in out]), tuple(m for _, m in out)


def decode(spec: CompressSpec | str, payload, like, unbiased: bool = False):
  """C(tree): the tree a message `encode` gave stands for, shaped like `like`
  (arrays or jax.ShapeDtypeStruct), with the same `unbiased`.

  A pure function of the payload, computed apart (its input and output
  pass an optimization barrier), so that a sender, a receiver and a replay,
  each in its own program, decode the same bits.
  """
  spec = _spec(spec)
  if spec.name == "none":
    return payload
  compressor = COMPRESSORS.get(spec.name)
  leaves, treedef = jax.tree.flatten(like)
  barrier = jax.lax.optimization_barrier  # leaf by leaf: the leaves stay independent
  return treedef.unflatten([
      barrier(compressor.decode(barrier(p), tuple(x.shape), x.dtype, spec.arg, unbiased))
      for p, x in zip(treedef.flatten_up_to(payload), leaves)])


def zeros(spec: CompressSpec | str, like):
  """A payload of `encode`'s shapes for a tree like `like`, all zeros (it
  decodes to zeros): a state's message before the first is sent."""
  def encoded_shapes(tree):
    return encode(spec, tree, jax.random.key(0), init_memory(spec, tree))[0]
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(encoded_shapes, like))


def compress(spec: CompressSpec | str, tree, key: jax.Array, memory: tuple,
             unbiased: bool = False):
  """(C(tree), new memory): `decode` of `encode`."""
  payload, memory = encode(spec, tree, key, memory, unbiased)
  return decode(spec, payload, tree, unbiased), memory


def toward(spec: CompressSpec | str, target, reference, key: jax.Array, memory: tuple):
  """A message that moves a copy of `reference`, which both ends hold, toward
  `target`, which only the sender has: (the payload of q = C(target -
  reference), reference + q, new memory). The receiver's end is `moved`.

  Error feedback without a residual: what C left out stays in
  target - reference and goes in later messages. Both ends add the same q
  (`decode`'s bits) to the same reference, so their copies stay equal bit
  for bit (CHOCO-SGD's public copies, Koloskova et al. 2019; a parameter
  server's copy of what a worker holds).
  """
  difference = jax.tree.map(jnp.subtract, target, reference)
  payload, memory = encode(spec, difference, key, memory)
  return payload, moved(spec, reference, payload), memory


def moved(spec: CompressSpec | str, reference, payload):
  """The receiving end of `toward`: reference + q, q the payload decoded."""
  return jax.tree.map(jnp.add, reference, decode(spec, payload, reference))


class CompressionState(NamedTuple):
  residual: Any  # e, like the updates: what was not sent yet; None without error feedback
  memory: tuple  # per leaf: PowerSGD's Q (m x r, warm start) or None
  key: jax.Array  # uint32 raw key data (jax.random.key_data) of the next step's draws


def _init(spec: CompressSpec, params, seed: int, error_feedback: bool) -> CompressionState:
  key = jax.random.key_data(jax.random.fold_in(jax.random.key(seed), 1))
  residual = jax.tree.map(jnp.zeros_like, params) if error_feedback else None
  return CompressionState(residual, init_memory(spec, params, seed), key)


def _step(spec: CompressSpec, updates, state: CompressionState, error_feedback: bool):
  """(payload, C(updates + e), state): one step of the transformation."""
  key, step_key = jax.random.split(jax.random.wrap_key_data(state.key))
  corrected = (jax.tree.map(jnp.add, updates, state.residual) if error_feedback
               else updates)
  unbiased = not error_feedback
  payload, memory = encode(spec, corrected, step_key, state.memory, unbiased)
  sent = decode(spec, payload, corrected, unbiased)
  residual = jax.tree.map(jnp.subtract, corrected, sent) if error_feedback else None
  return payload, sent, CompressionState(residual, memory, jax.random.key_data(key))


def compression(spec: CompressSpec | str, seed: int = 0,
                error_feedback: bool = True) -> optax.GradientTransformation:
  """Compresses the updates, with error feedback: c = C(g + e), e <- g + e - c.

  Seide et al. 2014; Karimireddy et al. 2019. `spec` is a CompressSpec or the
  text of --compress ("topk:0.01", "randk:0.01", "qsgd:16", "sign",
  "powersgd:2", "none": the identity). Without `error_feedback` the updates
  are C(g), with random-k scaled by d / k and QSGD undamped to be unbiased;
  with it, QSGD is damped by 1 / (1 + omega) to be a contraction (see
  `encode`, `qsgd_variance_bound`). `encoded` gives the same step's message
  as its payload, as it travels.

  Returns:
    A transformation whose state is a CompressionState; jittable, and its
    draws a pure function of `seed` and the step.
  """
  spec = _spec(spec)
  if spec.name == "none":
    return optax.identity()

  def update_fn(updates, state, params=None):
    del params
    _, sent, state = _step(spec, updates, state, error_feedback)
    return sent, state

  return optax.GradientTransformation(
      lambda params: _init(spec, params, seed, error_feedback), update_fn)


def encoded(spec: CompressSpec | str, updates, state, error_feedback: bool = True):
  """(the payload of C(updates + e), new state): the step of a
  `compression(spec, ...)` transformation whose state is `state`, as the
  message it sends (`decode(spec, payload, updates)` is the transformation's
  updates, bit for bit). With none, (updates, state)."""
  spec = _spec(spec)
  if spec.name == "none":
    return updates, state
  payload, _, state = _step(spec, updates, state, error_feedback)
  return payload, state


def for_worker(state, worker) -> Any:
  """`state`, a `compression(...)` transformation's, with `worker` (an int, or
  a traced int32) folded into its key: each worker draws its own coordinates
  and roundings. Another state (none's) is returned as it is."""
  if not isinstance(state, CompressionState):
    return state
  key = jax.random.fold_in(jax.random.wrap_key_data(state.key), worker)
  return state._replace(key=jax.random.key_data(key))
