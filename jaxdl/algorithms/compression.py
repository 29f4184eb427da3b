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
  parse_compress(text) -> CompressSpec  the flag's value, "NAME[:ARG]", checked;
                                        a ConfigError("compress", ...) if bad
  compression(spec, seed=0, error_feedback=True) -> optax.GradientTransformation
  message_bytes(spec, shapes) -> int    the exact size of one compressed message
  compress(spec, tree, key, memory, unbiased=False) -> (tree, memory)
  init_memory(spec, tree, seed=0)       the pure pytree compressor and its memory
  for_worker(state, worker)             a transformation's state with a worker's own draws
  top_k, random_k, qsgd, scaled_sign, power_sgd, kept, qsgd_variance_bound:
                                        the per-leaf compressors
  COMPRESSORS                           the registry of compressors by name

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
from fractions import Fraction
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdl.errors import ConfigError
from jaxdl.registry import Registry

INDEX_BYTES = 4  # a sparse message's coordinate indices are int32


def kept(size: int, fraction: float) -> int:
  """k = max(1, ceil(fraction * size)), with the fraction read as the decimal written."""
  return max(1, math.ceil(Fraction(repr(float(fraction))) * size))


def _float(x: jax.Array) -> jax.Array:
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def top_k(x: jax.Array, fraction: float) -> jax.Array:
  """x with all but its k = kept(x.size, fraction) largest |x_i| set to 0.

  Stich et al. 2018; the message is the k values and their k indices.
  """
  flat = x.ravel()
  _, index = jax.lax.top_k(jnp.abs(flat), kept(flat.size, fraction))
  return jnp.zeros_like(flat).at[index].set(flat[index]).reshape(x.shape)


def random_k(x: jax.Array, key: jax.Array, fraction: float, rescale: bool = False) -> jax.Array:
  """x with all but k = kept(x.size, fraction) coordinates drawn without
  replacement set to 0; with `rescale`, the kept ones times d / k.

  Stich et al. 2018. Unscaled, C is a contraction, ||x - C(x)||^2 = (1 - k/d)
  ||x||^2 in expectation, which is what error feedback needs: a coordinate not
  drawn stays in the residual and goes out later. Scaled by d / k, C(x) is
  unbiased (what plain compressed SGD needs) but ||x - C(x)|| may exceed
  ||x||, and the residual would carry -(d/k - 1) x_i for each coordinate sent.
  """
  flat = x.ravel()
  k = kept(flat.size, fraction)
  index = jax.random.choice(key, flat.size, (k,), replace=False)
  values = flat[index] * (flat.size / k) if rescale else flat[index]
  return jnp.zeros_like(flat).at[index].set(values.astype(x.dtype)).reshape(x.shape)


def qsgd(x: jax.Array, key: jax.Array, levels: int) -> jax.Array:
  """QSGD with s = `levels` levels: ||x||_2 * sign(x_i) * xi_i / s, unbiased.

  Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD
  via Gradient Quantization and Encoding", NeurIPS 2017. xi_i rounds
  s |x_i| / ||x|| to one of its two neighbouring integers at random, up with
  probability equal to its fractional part, so E[xi_i] = s |x_i| / ||x|| and
  E[C(x)] = x. One norm per leaf (the paper's bucket is the whole leaf).
  """
  v = _float(x)
  norm = jnp.sqrt(jnp.sum(v * v))
  # s |x_i| / ||x|| <= s in exact arithmetic; the clip keeps rounding from
  # reaching level s + 1, which the message has no code for.
  level = jnp.minimum(levels * jnp.abs(v) / jnp.where(norm > 0, norm, 1), levels)
  lower = jnp.floor(level)
  xi = lower + (jax.random.uniform(key, x.shape, v.dtype) < level - lower)
  return (norm * jnp.sign(v) * xi / levels).astype(x.dtype)


def qsgd_variance_bound(size: int, levels: int) -> float:
  """omega = min(d / s^2, sqrt(d) / s): E||Q(x) - x||^2 <= omega ||x||^2 (Alistarh
  et al. 2017, Lemma 3.1).

  With omega >= 1, Q is no contraction and error feedback's residual grows
  without bound; Q / (1 + omega) is one, E||x - Q(x) / (1 + omega)||^2 <=
  (1 - 1 / (1 + omega)) ||x||^2 (Karimireddy et al. 2019), and is what the
  transformation sends with error feedback.
  """
  return min(size / levels**2, math.sqrt(size) / levels)


def scaled_sign(x: jax.Array) -> jax.Array:
  """(||x||_1 / d) * sign(x), with sign(0) = +1: one bit per coordinate.

  Karimireddy et al. 2019 (scaled sign, with error feedback: EF-SignSGD);
  Seide et al. 2014 quantize to one bit likewise. ||C(x)||_1 = ||x||_1.
  """
  v = _float(x)
  scale = jnp.sum(jnp.abs(v)) / x.size
  return (scale * jnp.where(v >= 0, 1, -1)).astype(x.dtype)


def _matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
  # flax kernels end with their output features ((in, out), (kh, kw, in, out))
  return math.prod(shape[:-1]), shape[-1]


def power_sgd_rank(shape: tuple[int, ...], rank: int) -> int:
  """The rank PowerSGD uses on a leaf: min(r, n, m); 0 for a vector (sent whole)."""
  if len(shape) < 2:
    return 0
  return min(rank, *_matrix_shape(shape))


def power_sgd(x: jax.Array, q: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
  """One PowerSGD step on a leaf: (P Q^T, the new Q), the leaf as an n x m matrix M.

  Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient
  Compression for Distributed Optimization", NeurIPS 2019:

    P = M Q,  P <- orthogonalize(P) (QR),  Q = M^T P,  M ~ P Q^T

  with Q (m x r) the previous step's (warm start: one power iteration per
  step). A leaf with fewer than 2 dimensions (`q` None) is sent whole.
  """
  if q is None:
    return x, None
  highest = jax.lax.Precision.HIGHEST  # TF32 matmuls would spoil the approximation
  m_NxM = _float(x).reshape(_matrix_shape(x.shape))
  p_NxR, _ = jnp.linalg.qr(jnp.matmul(m_NxM, q.astype(m_NxM.dtype), precision=highest))
  q_MxR = jnp.matmul(m_NxM.T, p_NxR, precision=highest)
  approx = jnp.matmul(p_NxR, q_MxR.T, precision=highest)
  # A zero M (a model difference before any step: AD-PSGD's first average)
  # gives Q = M^T P = 0; the next step would then start from QR(0)'s
  # coordinate axes instead of a random Q. The warm start is kept instead.
  q_MxR = jnp.where(jnp.any(m_NxM != 0), q_MxR, q.astype(q_MxR.dtype))
  return approx.reshape(x.shape).astype(x.dtype), q_MxR.astype(q.dtype)


@dataclasses.dataclass(frozen=True)
class Compressor:
  """A compressor by name: its per-leaf rule, memory and message size.

  compress(x, key, memory, arg, unbiased) -> (C(x), memory); `unbiased` picks
    the form for use without error feedback (E[C(x)] = x) over the contraction
  leaf_bytes(shape, itemsize, arg) -> the bytes of one leaf's message
  init_memory(shape, dtype, key, arg) -> a leaf's memory (PowerSGD's Q), or None
  arg_name: what ARG is ("FRACTION" in (0, 1], "LEVELS" or "RANK", integers
    >= 1), "" for a compressor that takes none; default: its value without ARG
  """
  name: str
  doc: str
  compress: Callable[..., tuple[jax.Array, Any]]
  leaf_bytes: Callable[[tuple[int, ...], int, Any], int]
  init_memory: Callable[..., Any] = lambda shape, dtype, key, arg: None
  arg_name: str = ""
  default: Any = None

  def usage(self) -> str:
    return f"{self.name}[:{self.arg_name}]" if self.arg_name else self.name


COMPRESSORS: Registry[Compressor] = Registry("compress")


def _sparse_bytes(shape, itemsize, fraction):
  return kept(math.prod(shape), fraction) * (itemsize + INDEX_BYTES)


def _qsgd_bytes(shape, itemsize, levels):
  # a sign bit and a level in 0..s (ceil(log2(s + 1)) = s.bit_length() bits)
  return itemsize + math.ceil(math.prod(shape) * (levels.bit_length() + 1) / 8)


def _power_sgd_bytes(shape, itemsize, rank):
  r = power_sgd_rank(shape, rank)
  return (r * sum(_matrix_shape(shape)) if r else math.prod(shape)) * itemsize


def _qsgd(x, key, memory, levels, unbiased):
  # the damping folds into the norm the message carries: no extra bytes
  damping = 1 if unbiased else 1 + qsgd_variance_bound(x.size, levels)
  return (qsgd(x, key, levels) / damping).astype(x.dtype), memory


def _power_sgd_memory(shape, dtype, key, rank):
  r = power_sgd_rank(shape, rank)
  return jax.random.normal(key, (_matrix_shape(shape)[1], r), dtype) if r else None


for _compressor in (
    Compressor("none", "no compression: every coordinate, at its dtype's size",
               lambda x, key, memory, arg, unbiased: (x, memory),
               lambda shape, itemsize, arg: math.prod(shape) * itemsize),
    Compressor("topk", "top-k: the k largest |x_i| of each leaf, values and int32 indices",
               lambda x, key, memory, fraction, unbiased: (top_k(x, fraction), memory),
               _sparse_bytes, arg_name="FRACTION", default=0.01),
    Compressor("randk", "random-k: k random coordinates of each leaf, values and int32 indices",
               lambda x, key, memory, fraction, unbiased: (
                   random_k(x, key, fraction, rescale=unbiased), memory),
               _sparse_bytes, arg_name="FRACTION", default=0.01),
    Compressor("qsgd", "QSGD: a norm per leaf, a sign and one of s levels per coordinate",
               _qsgd, _qsgd_bytes, arg_name="LEVELS", default=16),
    Compressor("sign", "scaled sign: ||x||_1 / d per leaf, one bit per coordinate",
               lambda x, key, memory, arg, unbiased: (scaled_sign(x), memory),
               lambda shape, itemsize, arg: math.ceil(math.prod(shape) / 8) + itemsize),
    Compressor("powersgd", "PowerSGD: P and Q of rank r per matrix, vectors whole",
               lambda x, key, memory, rank, unbiased: power_sgd(x, memory),
               _power_sgd_bytes, _power_sgd_memory, arg_name="RANK", default=2),
):
  COMPRESSORS.add(_compressor)


@dataclasses.dataclass(frozen=True)
class CompressSpec:
  """A compressor's name and its argument (a fraction, levels or a rank; None)."""
  name: str
  arg: float | int | None = None

  def __str__(self) -> str:
    return self.name if self.arg is None else f"{self.name}:{self.arg}"


def parse_compress(text: str) -> CompressSpec:
  """The --compress flag's "NAME[:ARG]" as a CompressSpec, or a ConfigError.

  topk:FRACTION and randk:FRACTION keep a fraction in (0, 1] of each leaf's
  coordinates; qsgd:LEVELS and powersgd:RANK take integers >= 1; sign and
  none take no argument. Without ARG, the compressor's default.
  """
  name, colon, arg = str(text).partition(":")
  if name not in COMPRESSORS:
    raise ConfigError("compress", text, "NAME[:ARG], NAME one of " +
                      ", ".join(COMPRESSORS.get(n).usage() for n in COMPRESSORS))
  compressor = COMPRESSORS.get(name)
  if not colon:
    return CompressSpec(name, compressor.default)
  if not compressor.arg_name:
    raise ConfigError("compress", text, f"{name} takes no argument")
  if compressor.arg_name == "FRACTION":
    try:
      value = float(arg)
    except ValueError:
      value = math.nan
    if not 0 < value <= 1:
      raise ConfigError("compress", text, f"{name}:FRACTION with FRACTION in (0, 1], the "
                        "share of each leaf's coordinates sent")
    return CompressSpec(name, value)
  if not re.fullmatch(r"[0-9]+", arg) or int(arg) < 1:
    raise ConfigError("compress", text,
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


def compress(spec: CompressSpec | str, tree, key: jax.Array, memory: tuple,
             unbiased: bool = False):
  """(C(tree), new memory): each leaf compressed with its own key (fold_in(key, i)).

  The compressors are contractions, E||x - C(x)||^2 <= (1 - delta) ||x||^2
  with delta > 0, as error feedback needs; `unbiased` asks for E[C(x)] = x instead, what compression
  without feedback needs: random-k scaled by d / k and QSGD undamped
  (qsgd_variance_bound). Top-k, sign and PowerSGD have one form.
  """
  spec = _spec(spec)
  compressor = COMPRESSORS.get(spec.name)
  leaves, treedef = jax.tree.flatten(tree)
  out = [compressor.compress(x, jax.random.fold_in(key, i), m, spec.arg, unbiased)
         for i, (x, m) in enumerate(zip(leaves, memory))]
  return treedef.unflatten([c for c, _ in out]), tuple(m for _, m in out)


class CompressionState(NamedTuple):
  residual: Any  # e, like the updates: what was not sent yet; None without error feedback
  memory: tuple  # per leaf: PowerSGD's Q (m x r, warm start) or None
  key: jax.Array  # uint32 raw key data (jax.random.key_data) of the next step's draws


def compression(spec: CompressSpec | str, seed: int = 0,
                error_feedback: bool = True) -> optax.GradientTransformation:
  """Compresses the updates, with error feedback: c = C(g + e), e <- g + e - c.

  Seide et al. 2014; Karimireddy et al. 2019. `spec` is a CompressSpec or the
  text of --compress ("topk:0.01", "randk:0.01", "qsgd:16", "sign",
  "powersgd:2", "none": the identity). Without `error_feedback` the updates
  are C(g), with random-k scaled by d / k and QSGD undamped to be unbiased;
  with it, QSGD is damped by 1 / (1 + omega) to be a contraction (see
  `compress`, `qsgd_variance_bound`).

  Returns:
    A transformation whose state is a CompressionState; jittable, and its
    draws a pure function of `seed` and the step.
  """
  spec = _spec(spec)
  if spec.name == "none":
    return optax.identity()

  def init_fn(params):
    key = jax.random.key_data(jax.random.fold_in(jax.random.key(seed), 1))
    residual = jax.tree.map(jnp.zeros_like, params) if error_feedback else None
    return CompressionState(residual, init_memory(spec, params, seed), key)

  def update_fn(updates, state, params=None):
    del params
    key, step_key = jax.random.split(jax.random.wrap_key_data(state.key))
    corrected = (jax.tree.map(jnp.add, updates, state.residual) if error_feedback
                 else updates)
    sent, memory = compress(spec, corrected, step_key, state.memory,
                            unbiased=not error_feedback)
    residual = jax.tree.map(jnp.subtract, corrected, sent) if error_feedback else None
    return sent, CompressionState(residual, memory, jax.random.key_data(key))

  return optax.GradientTransformation(init_fn, update_fn)


def for_worker(state, worker) -> Any:
  """`state`, a `compression(...)` transformation's, with `worker` (an int, or
  a traced int32) folded into its key: each worker draws its own coordinates
  and roundings. Another state (none's) is returned as it is."""
  if not isinstance(state, CompressionState):
    return state
  key = jax.random.fold_in(jax.random.wrap_key_data(state.key), worker)
  return state._replace(key=jax.random.key_data(key))
