"""The compressors, leaf by leaf: each leaf's message as it travels (its
payload), what it decodes to, its size and its memory.

A message is its payload, not the dense array it stands for: top-k and
random-k send k values and k int32 indices (`Sparse`), QSGD a norm and a
sign bit and level per coordinate packed into bytes (`Quantized`), scaled
sign a scale and a bit per coordinate (`Signs`), PowerSGD the factors P
and Q of each matrix (`LowRank`) and each vector whole. `encode` and
`decode` are pure functions, so an engine ships the payload and the
receiver decodes the same dense values the sender's algorithm used.

`jaxdl.algorithms.compression` composes them over pytrees, with error
feedback, and parses --compress; it re-exports the names here.
"""
from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxdl.registry import Registry

INDEX_BYTES = 4  # a sparse message's coordinate indices are int32


def kept(size: int, fraction: float) -> int:
  """k = max(1, ceil(fraction * size)), with the fraction read as the decimal written."""
  return max(1, math.ceil(Fraction(repr(float(fraction))) * size))


def _float(x: jax.Array) -> jax.Array:
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


class Sparse(NamedTuple):
  """Top-k's and random-k's message of a leaf: k values and where they go."""
  values: jax.Array   # (k,), the leaf's dtype
  indices: jax.Array  # (k,) int32, into the flattened leaf


class Quantized(NamedTuple):
  """QSGD's message of a leaf of d coordinates at s levels."""
  norm: jax.Array   # (), float32 (the leaf's dtype promoted to it): ||x||_2
  codes: jax.Array  # (ceil(d (b + 1) / 8),) uint8: per coordinate a sign bit and its
  #                   level in b = s.bit_length() bits, packed


class Signs(NamedTuple):
  """Scaled sign's message of a leaf of d coordinates."""
  scale: jax.Array     # (), the leaf's dtype: ||x||_1 / d
  negative: jax.Array  # (ceil(d / 8),) uint8: a bit per coordinate, set where it is negative


class LowRank(NamedTuple):
  """PowerSGD's message of a matrix leaf M ~ P Q^T (a vector travels whole)."""
  p: jax.Array  # (n, r), float32: orthonormal columns
  q: jax.Array  # (m, r), float32: M^T P


def _scatter(payload: Sparse, shape, dtype) -> jax.Array:
  flat = jnp.zeros(math.prod(shape), dtype)
  return flat.at[payload.indices].set(payload.values).reshape(shape)


def _top_k(x, key, memory, fraction, unbiased):
  del key, unbiased
  flat = x.ravel()
  _, index = jax.lax.top_k(jnp.abs(flat), kept(flat.size, fraction))
  return Sparse(flat[index], index), memory


def top_k(x: jax.Array, fraction: float) -> jax.Array:
  """x with all but its k = kept(x.size, fraction) largest |x_i| set to 0.

  Stich et al. 2018; the message is the k values and their k indices.
  """
  return _scatter(_top_k(x, None, None, fraction, False)[0], x.shape, x.dtype)


def _random_k(x, key, memory, fraction, unbiased):
  flat = x.ravel()
  k = kept(flat.size, fraction)
  index = jax.random.choice(key, flat.size, (k,), replace=False).astype(jnp.int32)
  values = flat[index] * (flat.size / k) if unbiased else flat[index]
  return Sparse(values.astype(x.dtype), index), memory


def random_k(x: jax.Array, key: jax.Array, fraction: float, rescale: bool = False) -> jax.Array:
  """x with all but k = kept(x.size, fraction) coordinates drawn without
  replacement set to 0; with `rescale`, the kept ones times d / k.

  Stich et al. 2018. Unscaled, C is a contraction, ||x - C(x)||^2 = (1 - k/d)
  ||x||^2 in expectation, which is what error feedback needs: a coordinate not
  drawn stays in the residual and goes out later. Scaled by d / k, C(x) is
  unbiased (what plain compressed SGD needs) but ||x - C(x)|| may exceed
  ||x||, and the residual would carry -(d/k - 1) x_i for each coordinate sent.
  """
  return _scatter(_random_k(x, key, None, fraction, rescale)[0], x.shape, x.dtype)


def _pack(codes, bits: int) -> jax.Array:
  """Non-negative integers `codes` of `bits` bits each, most significant
  first, packed 8 to a byte: ceil(codes.size * bits / 8) uint8."""
  shifts = jnp.arange(bits - 1, -1, -1, dtype=jnp.uint32)
  return jnp.packbits(((codes.ravel().astype(jnp.uint32)[:, None] >> shifts) & 1).ravel())


def _unpack(packed: jax.Array, count: int, bits: int) -> jax.Array:
  """The `count` integers of `bits` bits each that `_pack` packed, uint32."""
  bits_CxB = jnp.unpackbits(packed, count=count * bits).reshape(count, bits)
  shifts = jnp.arange(bits - 1, -1, -1, dtype=jnp.uint32)
  return jnp.sum(bits_CxB.astype(jnp.uint32) << shifts, axis=1, dtype=jnp.uint32)


def _qsgd_encode(x, key, memory, levels, unbiased):
  del unbiased  # the damping is a function of (d, s): the receiver applies it
  v = _float(x)
  norm = jnp.sqrt(jnp.sum(v * v))
  # s |x_i| / ||x|| <= s in exact arithmetic; the clip keeps rounding from
  # reaching level s + 1, which the message has no code for.
  level = jnp.minimum(levels * jnp.abs(v) / jnp.where(norm > 0, norm, 1), levels)
  lower = jnp.floor(level)
  xi = lower + (jax.random.uniform(key, x.shape, v.dtype) < level - lower)
  bits = levels.bit_length()
  # the sign bit of -0.0 too: the value decoded is -0.0, as norm * sign(x_i) * 0 is
  code = (jnp.signbit(v).astype(jnp.uint32) << bits) | xi.astype(jnp.uint32)
  return Quantized(norm, _pack(code, bits + 1)), memory


def _qsgd_decode(payload: Quantized, shape, dtype, levels, unbiased):
  bits = levels.bit_length()
  code = _unpack(payload.codes, math.prod(shape), bits + 1).reshape(shape)
  norm = payload.norm
  sign = jnp.where(code >> bits, -1, 1).astype(norm.dtype)
  xi = (code & ((1 << bits) - 1)).astype(norm.dtype)
  x = (norm * sign * xi / levels).astype(dtype)
  # under error feedback, Q / (1 + omega), a contraction (qsgd_variance_bound):
  # a function of d and s, so no extra bytes
  damping = 1 if unbiased else 1 + qsgd_variance_bound(math.prod(shape), levels)
  return (x / damping).astype(dtype)


def qsgd(x: jax.Array, key: jax.Array, levels: int) -> jax.Array:
  """QSGD with s = `levels` levels: ||x||_2 * sign(x_i) * xi_i / s, unbiased.

  Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD
  via Gradient Quantization and Encoding", NeurIPS 2017. xi_i rounds
  s |x_i| / ||x|| to one of its two neighbouring integers at random, up with
  probability equal to its fractional part, so E[xi_i] = s |x_i| / ||x|| and
  E[C(x)] = x. One norm per leaf (the paper's bucket is the whole leaf).
  """
  payload, _ = _qsgd_encode(x, key, None, levels, True)
  return _qsgd_decode(payload, x.shape, x.dtype, levels, True)


def qsgd_variance_bound(size: int, levels: int) -> float:
  """omega = min(d / s^2, sqrt(d) / s): E||Q(x) - x||^2 <= omega ||x||^2 (Alistarh
  et al. 2017, Lemma 3.1).

  With omega >= 1, Q is no contraction and error feedback's residual grows
  without bound; Q / (1 + omega) is one, E||x - Q(x) / (1 + omega)||^2 <=
  (1 - 1 / (1 + omega)) ||x||^2 (Karimireddy et al. 2019), and is what the
  transformation sends with error feedback.
  """
  return min(size / levels**2, math.sqrt(size) / levels)


def _sign_encode(x, key, memory, arg, unbiased):
  del key, arg, unbiased
  v = _float(x)
  # (the scale at the leaf's dtype: scale * (+-1) rounds to it as the scale does)
  scale = (jnp.sum(jnp.abs(v)) / x.size).astype(x.dtype)
  return Signs(scale, jnp.packbits(~(v >= 0))), memory


def _sign_decode(payload: Signs, shape, dtype, arg, unbiased):
  negative = jnp.unpackbits(payload.negative, count=math.prod(shape)).reshape(shape)
  return (payload.scale * jnp.where(negative, -1, 1)).astype(dtype)


def scaled_sign(x: jax.Array) -> jax.Array:
  """(||x||_1 / d) * sign(x), with sign(0) = +1: one bit per coordinate.

  Karimireddy et al. 2019 (scaled sign, with error feedback: EF-SignSGD);
  Seide et al. 2014 quantize to one bit likewise. ||C(x)||_1 = ||x||_1.
  """
  return _sign_decode(_sign_encode(x, None, None, None, False)[0], x.shape, x.dtype, None,
                      False)


def _matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
  # flax kernels end with their output features ((in, out), (kh, kw, in, out))
  return math.prod(shape[:-1]), shape[-1]


def power_sgd_rank(shape: tuple[int, ...], rank: int) -> int:
  """The rank PowerSGD uses on a leaf: min(r, n, m); 0 for a vector (sent whole)."""
  if len(shape) < 2:
    return 0
  return min(rank, *_matrix_shape(shape))


_HIGHEST = jax.lax.Precision.HIGHEST  # TF32 matmuls would spoil the approximation


def _power_sgd_encode(x, key, q, rank, unbiased):
  del key, rank, unbiased
  if q is None:
    return x, None
  m_NxM = _float(x).reshape(_matrix_shape(x.shape))
  p_NxR, _ = jnp.linalg.qr(jnp.matmul(m_NxM, q.astype(m_NxM.dtype), precision=_HIGHEST))
  q_MxR = jnp.matmul(m_NxM.T, p_NxR, precision=_HIGHEST)
  # A zero M (a model difference before any step: AD-PSGD's first average)
  # gives Q = M^T P = 0; the next step would then start from QR(0)'s
  # coordinate axes instead of a random Q. The warm start is kept instead.
  memory = jnp.where(jnp.any(m_NxM != 0), q_MxR, q.astype(q_MxR.dtype))
  return LowRank(p_NxR, q_MxR), memory.astype(q.dtype)


def _power_sgd_decode(payload, shape, dtype, rank, unbiased):
  if not isinstance(payload, LowRank):
    return payload
  return jnp.matmul(payload.p, payload.q.T, precision=_HIGHEST).reshape(shape).astype(dtype)


def power_sgd(x: jax.Array, q: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
  """One PowerSGD step on a leaf: (P Q^T, the new Q), the leaf as an n x m matrix M.

  Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient
  Compression for Distributed Optimization", NeurIPS 2019:

    P = M Q,  P <- orthogonalize(P) (QR),  Q = M^T P,  M ~ P Q^T

  with Q (m x r) the previous step's (warm start: one power iteration per
  step). A leaf with fewer than 2 dimensions (`q` None) is sent whole.
  """
  payload, q = _power_sgd_encode(x, None, q, None, False)
  return _power_sgd_decode(payload, x.shape, x.dtype, None, False), q


@dataclasses.dataclass(frozen=True)
class Compressor:
  """A compressor by name: its per-leaf message, memory and message size.

  encode(x, key, memory, arg, unbiased) -> (payload, memory): the message of
    leaf x as it travels (a Sparse, Quantized, Signs or LowRank; the array
    itself where it goes whole); `unbiased` picks the form for use without
    error feedback (E[C(x)] = x) over the contraction
  decode(payload, shape, dtype, arg, unbiased) -> C(x), the leaf the message stands for
  leaf_bytes(shape, itemsize, arg) -> the bytes of one leaf's message (its payload's)
  init_memory(shape, dtype, key, arg) -> a leaf's memory (PowerSGD's Q), or None
  arg_name: what ARG is ("FRACTION" in (0, 1], "LEVELS" or "RANK", integers
    >= 1), "" for a compressor that takes none; default: its value without ARG
  """
  name: str
  doc: str
  encode: Callable[..., tuple[Any, Any]]
  decode: Callable[..., jax.Array]
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
  # the norm (at least float32) and, per coordinate, a sign bit and a level in
  # 0..s (ceil(log2(s + 1)) = s.bit_length() bits)
  return max(itemsize, 4) + math.ceil(math.prod(shape) * (levels.bit_length() + 1) / 8)


def _power_sgd_bytes(shape, itemsize, rank):
  r = power_sgd_rank(shape, rank)  # the factors at least float32
  return r * sum(_matrix_shape(shape)) * max(itemsize, 4) if r else math.prod(shape) * itemsize


def _power_sgd_memory(shape, dtype, key, rank):
  r = power_sgd_rank(shape, rank)
  return jax.random.normal(key, (_matrix_shape(shape)[1], r), dtype) if r else None


for _compressor in (
    Compressor("none", "no compression: every coordinate, at its dtype's size",
               lambda x, key, memory, arg, unbiased: (x, memory),
               lambda payload, shape, dtype, arg, unbiased: payload,
               lambda shape, itemsize, arg: math.prod(shape) * itemsize),
    Compressor("topk", "top-k: the k largest |x_i| of each leaf, values and int32 indices",
               _top_k, lambda payload, shape, dtype, arg, unbiased: _scatter(
                   payload, shape, dtype), _sparse_bytes, arg_name="FRACTION", default=0.01),
    Compressor("randk", "random-k: k random coordinates of each leaf, values and int32 indices",
               _random_k, lambda payload, shape, dtype, arg, unbiased: _scatter(
                   payload, shape, dtype), _sparse_bytes, arg_name="FRACTION", default=0.01),
    Compressor("qsgd", "QSGD: a norm per leaf, a sign and one of s levels per coordinate",
               _qsgd_encode, _qsgd_decode, _qsgd_bytes, arg_name="LEVELS", default=16),
    Compressor("sign", "scaled sign: ||x||_1 / d per leaf, one bit per coordinate",
               _sign_encode, _sign_decode,
               lambda shape, itemsize, arg: math.ceil(math.prod(shape) / 8) + itemsize),
    Compressor("powersgd", "PowerSGD: P and Q of rank r per matrix, vectors whole",
               _power_sgd_encode, _power_sgd_decode, _power_sgd_bytes, _power_sgd_memory,
               arg_name="RANK", default=2),
):
  COMPRESSORS.add(_compressor)
