"""Gradient compression with error feedback: each compressor against numpy or
a hand-worked value, the residual's bookkeeping, QSGD's unbiasedness,
convergence in an optax chain, jit, the flag's errors and the message sizes."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.algorithms.compression import (COMPRESSORS, CompressSpec, LowRank, compress,
                                          compression, decode, encode, encoded, init_memory, kept,
                                          message_bytes, parse_compress, qsgd,
                                          qsgd_variance_bound, random_k, scaled_sign, top_k)
from jaxdl.errors import ConfigError
from tests import marks

RNG = np.random.default_rng(0)
# a dense kernel, a conv kernel (3 x 3 x 2 -> 4: an 18 x 4 matrix) and a bias
PARAMS = {"w": np.zeros((6, 5), np.float32), "conv": np.zeros((3, 3, 2, 4), np.float32),
          "b": np.zeros(5, np.float32)}
LOSSY = ["topk:0.1", "randk:0.1", "qsgd:2", "qsgd:16", "sign", "powersgd:1"]


def _grads(steps, scale=1.0):
  return [jax.tree.map(lambda p: (scale * RNG.normal(size=p.shape)).astype(np.float32), PARAMS)
          for _ in range(steps)]


def _run(tx, grads):
  state, sent = tx.init(grads[0]), []
  for g in grads:
    c, state = tx.update(g, state)
    sent.append(c)
  return sent, state


def _np_top_k(x, k):
  keep = np.argsort(-np.abs(x.ravel()))[:k]
  out = np.zeros(x.size, x.dtype)
  out[keep] = x.ravel()[keep]
  return out.reshape(x.shape)


# -- compressors against values worked out by hand or in numpy ----------------

def test_kept_reads_the_fraction_as_written():
  assert [kept(100, 0.07), kept(100, 0.071), kept(1000, 0.001), kept(10, 1e-9), kept(7, 1.0)] \
      == [7, 8, 1, 1, 7]  # 0.07 * 100 is 7.000000000000001 in floats


def test_each_compressor_on_a_hand_worked_leaf():
  x = jnp.array([0.5, -3.0, 2.0, 0.0])
  np.testing.assert_array_equal(top_k(x, 0.5), [0.0, -3.0, 2.0, 0.0])
  # ||x||_1 / d = 5.5 / 4, and sign(0) = +1 (one bit has no code for 0)
  np.testing.assert_allclose(scaled_sign(x), [1.375, -1.375, 1.375, 1.375], rtol=1e-7)
  # s |x_i| / ||x|| = 5 * (3, 4) / 5 are integers: QSGD has nothing to round
  np.testing.assert_array_equal(qsgd(jnp.array([3.0, -4.0]), jax.random.key(1), 5), [3.0, -4.0])
  np.testing.assert_array_equal(qsgd(jnp.zeros(3), jax.random.key(1), 5), [0, 0, 0])


def test_scaled_sign_keeps_the_l1_norm_and_the_signs():
  x = RNG.normal(size=(7, 9)).astype(np.float32)
  c = np.asarray(scaled_sign(x))
  np.testing.assert_allclose(np.abs(c).sum(), np.abs(x).sum(), rtol=1e-6)
  np.testing.assert_array_equal(np.sign(c), np.sign(x))
  np.testing.assert_allclose(np.abs(c), np.abs(x).mean(), rtol=1e-6)


@pytest.mark.parametrize("rescale", [False, True])
def test_random_k_keeps_exactly_k_coordinates(rescale):
  x = RNG.uniform(1, 2, size=(40, 25)).astype(np.float32)  # no zero to hide a kept one
  c = np.asarray(random_k(x, jax.random.key(3), 0.013, rescale))
  k = 13  # ceil(0.013 * 1000)
  kept_at = np.nonzero(c)
  assert len(kept_at[0]) == k
  np.testing.assert_allclose(c[kept_at], x[kept_at] * (1000 / k if rescale else 1), rtol=1e-6)
  other = np.asarray(random_k(x, jax.random.key(4), 0.013, rescale))
  assert set(zip(*np.nonzero(other))) != set(zip(*kept_at))  # the key draws them


def test_the_key_advances_each_step_and_the_seed_replays():
  g = _grads(1)[0]
  first, _ = _run(compression("randk:0.1", error_feedback=False), [g, g])
  again, _ = _run(compression("randk:0.1", error_feedback=False), [g, g])
  assert np.any(first[0]["conv"] != first[1]["conv"])  # step 2 draws anew
  jax.tree.map(np.testing.assert_array_equal, first, again)


def test_top_k_with_error_feedback_follows_numpy_over_three_steps():
  grads = _grads(3)
  sent, state = _run(optax.chain(compression("topk:0.1"), optax.sgd(0.5)), grads)
  k = {"w": 3, "conv": 8, "b": 1}  # ceil(0.1 * 30), ceil(0.1 * 72), ceil(0.1 * 5)
  for name in PARAMS:
    e = np.zeros_like(PARAMS[name])
    for g, c in zip(grads, sent):
      x = g[name] + e
      expected = _np_top_k(x, k[name])
      e = x - expected
      np.testing.assert_array_equal(c[name], -0.5 * expected)
    np.testing.assert_array_equal(state[0].residual[name], e)


def test_top_k_without_error_feedback_sends_each_gradient_alone():
  grads = _grads(2)
  sent, state = _run(compression("topk:0.1", error_feedback=False), grads)
  assert state.residual is None
  np.testing.assert_array_equal(sent[1]["w"], _np_top_k(grads[1]["w"], 3))


def _np_power_sgd(m, q):
  p, _ = np.linalg.qr(m @ q)
  q = m.T @ p
  return p @ q.T, q


def test_power_sgd_with_error_feedback_follows_numpy_over_three_steps():
  grads = _grads(3)
  tx = compression("powersgd:2", seed=5)
  state = tx.init(PARAMS)
  q = {"w": np.asarray(state.memory[2], np.float64),      # leaves in key order: b, conv, w
       "conv": np.asarray(state.memory[1], np.float64)}
  assert state.memory[0] is None and q["w"].shape == (5, 2) and q["conv"].shape == (4, 2)
  e = {"w": np.zeros((6, 5)), "conv": np.zeros((18, 4))}
  for g in grads:
    c, state = tx.update(g, state)
    for name, shape in (("w", (6, 5)), ("conv", (18, 4))):
      x = g[name].astype(np.float64).reshape(shape) + e[name]
      approx, q[name] = _np_power_sgd(x, q[name])  # P Q^T: the same whatever QR's signs
      e[name] = x - approx
      np.testing.assert_allclose(np.asarray(c[name]).reshape(shape), approx, atol=1e-5)
    np.testing.assert_array_equal(c["b"], g["b"])  # a vector goes whole
  for name in ("w", "conv"):
    np.testing.assert_allclose(np.asarray(state.residual[name]).reshape(e[name].shape), e[name],
                               atol=1e-5)
  assert np.abs(e["w"]).max() > 0.1  # rank 2 of 5 drops something


# -- no compression where nothing is dropped ----------------------------------

def test_top_k_keeping_everything_is_no_compression():
  grads = _grads(3)
  sent, state = _run(compression("topk:1"), grads)
  for g, c in zip(grads, sent):
    jax.tree.map(np.testing.assert_array_equal, c, g)
  jax.tree.map(lambda e: np.testing.assert_array_equal(e, 0), state.residual)


def test_full_rank_power_sgd_is_no_compression():
  grads = _grads(3)
  sent, state = _run(compression("powersgd:5"), grads)  # min(n, m) is 5 and 4
  assert [None if q is None else q.shape for q in state.memory] == [None, (4, 4), (5, 5)]
  for g, c in zip(grads, sent):
    jax.tree.map(lambda c, g: np.testing.assert_allclose(c, g, atol=2e-5), c, g)
  jax.tree.map(lambda e: np.testing.assert_allclose(e, 0, atol=2e-5), state.residual)


def test_power_sgd_recovers_from_a_zero_gradient():
  # Q = M^T P is 0 after a zero M; QR of P = 0 still gives an orthonormal P
  # (coordinate axes), so the next step's approximation is not stuck at 0.
  zero, g = jax.tree.map(np.zeros_like, PARAMS), _grads(1)[0]
  sent, _ = _run(compression("powersgd:1", error_feedback=False), [zero, g, g])
  assert np.abs(sent[0]["w"]).max() == 0
  assert np.abs(sent[2]["w"]).max() > 0.1


# -- error feedback: nothing lost ---------------------------------------------

@pytest.mark.parametrize("spec", [marks.slow(s) if s == "qsgd:2" else s for s in LOSSY])
def test_the_residual_accounts_for_every_dropped_coordinate(spec):
  grads = _grads(6)
  sent, state = _run(compression(spec, seed=2), grads)
  for name in PARAMS:
    total = sum(np.asarray(g[name], np.float64) for g in grads)
    sent_total = sum(np.asarray(c[name], np.float64) for c in sent)
    residual = np.asarray(state.residual[name], np.float64)
    np.testing.assert_allclose(sent_total + residual, total, atol=1e-5)
    if name == "w":  # something was dropped: the check is not 0 + 0 == 0
      assert np.abs(residual).max() > 0.05


@pytest.mark.parametrize("unbiased,grows", [marks.slow(True, True), (False, False)])
def test_qsgd_is_damped_into_a_contraction_under_error_feedback(unbiased, grows):
  # e <- x - C(x), x = g + e. Undamped QSGD with 2 levels on 1,000 coordinates
  # has E||x - Q(x)||^2 up to omega ||x||^2, omega = sqrt(d) / s ~ 16: the
  # residual grows a thousandfold in 20 steps (and on). Damped by
  # 1 / (1 + omega) it stays within a few ||g||.
  d, s = 1000, 2
  assert qsgd_variance_bound(d, s) == pytest.approx(math.sqrt(d) / s)
  spec, tree = CompressSpec("qsgd", s), {"x": jnp.zeros(d)}
  e, key = jnp.zeros(d), jax.random.key(0)
  for t in range(20):
    g = jax.random.normal(jax.random.fold_in(key, 100 + t), (d,))
    c, _ = compress(spec, {"x": g + e}, jax.random.fold_in(key, t), init_memory(spec, tree),
                    unbiased=unbiased)
    e = g + e - c["x"]
  ratio = float(jnp.linalg.norm(e) / jnp.sqrt(d))  # ||e|| / ||g||
  assert (ratio > 100) if grows else (ratio < 10)


# -- unbiasedness --------------------------------------------------------------

def _within_standard_errors(samples, x, variance, z=5.0):
  """max |mean - x| / standard error <= z, the error from the exact variance."""
  mean = np.asarray(samples, np.float64).mean(axis=0)
  error = np.sqrt(variance / len(samples))
  return np.max(np.abs(mean - x) / np.maximum(error, 1e-12)) <= z


def test_qsgd_is_unbiased():
  n, s = 4000, 4
  x = RNG.normal(size=64).astype(np.float32)
  samples = jax.vmap(lambda k: qsgd(jnp.asarray(x), k, s))(
      jax.random.split(jax.random.key(7), n))
  norm = np.linalg.norm(x.astype(np.float64))
  level = s * np.abs(x) / norm
  fraction = level - np.floor(level)
  # each coordinate is one of two neighbouring levels ...
  on_level = np.asarray(samples, np.float64) * s / norm * np.sign(x)
  assert np.all(np.isin(np.round(on_level), [np.floor(level), np.floor(level) + 1]))
  # ... up with probability its fractional part: variance (||x|| / s)^2 p (1 - p)
  variance = (norm / s) ** 2 * fraction * (1 - fraction)
  assert _within_standard_errors(samples, x, variance)
  # the bound has power: rounding to the nearest level (biased) fails it
  nearest = np.broadcast_to(norm / s * np.sign(x) * np.round(level), samples.shape)
  assert not _within_standard_errors(nearest, x, variance)


def test_random_k_scaled_by_d_over_k_is_unbiased():
  n, d, k = 4000, 50, 5
  x = RNG.normal(size=d).astype(np.float32)
  samples = jax.vmap(lambda key: random_k(jnp.asarray(x), key, k / d, rescale=True))(
      jax.random.split(jax.random.key(8), n))
  variance = x.astype(np.float64) ** 2 * (d / k - 1)  # (d/k) x w.p. k/d, else 0
  assert _within_standard_errors(samples, x, variance)
  unscaled = jax.vmap(lambda key: random_k(jnp.asarray(x), key, k / d))(
      jax.random.split(jax.random.key(8), n))
  assert not _within_standard_errors(unscaled, x, variance)  # E = (k/d) x


# -- in an optax chain ----------------------------------------------------------

X = RNG.normal(size=(128, 50)).astype(np.float32)
Y = X @ RNG.normal(size=(50, 4)).astype(np.float32) + RNG.normal(size=4).astype(np.float32)


def _least_squares(spec, error_feedback=True, steps=2500, lr=0.005):
  def loss(p):
    return 0.5 * jnp.mean(jnp.sum((X @ p["w"] + p["b"] - Y) ** 2, axis=1))

  tx = optax.chain(compression(spec, error_feedback=error_feedback), optax.sgd(lr))

  def step(carry, _):
    params, state = carry
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    return (optax.apply_updates(params, updates), state), None

  params = {"w": jnp.zeros((50, 4)), "b": jnp.zeros(4)}
  (params, _), _ = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), None, steps))(params)
  return float(loss(params))  # 100.3 at the start, 0.0135 with plain SGD


@pytest.mark.parametrize("spec", ["topk:0.01", marks.slow("randk:0.01"), marks.slow("qsgd:2"),
                                  "sign", "powersgd:1"])
def test_a_chain_with_sgd_solves_least_squares(spec):
  assert _least_squares(spec) < 0.05


def test_error_feedback_is_what_makes_top_k_one_percent_converge():
  assert _least_squares("topk:0.01", error_feedback=False) > 10  # 2 of 200, 1 of 4 per step


@pytest.mark.parametrize("spec", LOSSY)
def test_before_or_after_sgd_at_a_constant_rate_is_the_same(spec):
  # the residual in gradient units times the rate is the residual in step units
  grads = _grads(4)
  before, _ = _run(optax.chain(compression(spec, seed=1), optax.sgd(0.3)), grads)
  after, _ = _run(optax.chain(optax.sgd(0.3), compression(spec, seed=1)), grads)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               before, after)


# topk and sign by default; the seed's draws: test_the_key_advances_each_step_and_the_seed_replays
@pytest.mark.parametrize("spec", marks.default_only(LOSSY, ("topk:0.1", "sign")))
def test_jitted_update_matches_eager_compiles_once_and_replays(spec):
  tx, traces = compression(spec, seed=3), []

  def update(g, state):
    traces.append(1)
    return tx.update(g, state)

  jitted, grads = jax.jit(update), _grads(3)
  eager, _ = _run(tx, grads)
  for replay in range(2):
    state = tx.init(PARAMS)
    for g, expected in zip(grads, eager):
      c, state = jitted(g, state)
      jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                   c, expected)
  assert len(traces) == 1
  if spec.startswith(("randk", "qsgd")):  # the seed draws
    other, _ = _run(compression(spec, seed=4), grads)
    assert any(np.any(a != b) for a, b in zip(jax.tree.leaves(other), jax.tree.leaves(eager)))


# -- the flag --------------------------------------------------------------------

@pytest.mark.parametrize("text,spec", [
    ("none", CompressSpec("none")), ("sign", CompressSpec("sign")),
    ("topk:0.01", CompressSpec("topk", 0.01)), ("topk:1", CompressSpec("topk", 1.0)),
    ("randk:0.5", CompressSpec("randk", 0.5)), ("qsgd:16", CompressSpec("qsgd", 16)),
    ("powersgd:2", CompressSpec("powersgd", 2)), ("topk", CompressSpec("topk", 0.01)),
    ("qsgd", CompressSpec("qsgd", 16)), ("powersgd", CompressSpec("powersgd", 2))])
def test_parse_compress(text, spec):
  assert parse_compress(text) == spec
  assert parse_compress(str(spec)) == spec


@pytest.mark.parametrize("text,allowed", [
    ("topk:0", "topk:FRACTION with FRACTION in (0, 1]"),
    ("topk:1.5", "topk:FRACTION with FRACTION in (0, 1]"),
    ("topk:-0.1", "topk:FRACTION with FRACTION in (0, 1]"),
    ("topk:", "topk:FRACTION with FRACTION in (0, 1]"),
    ("topk:nan", "topk:FRACTION with FRACTION in (0, 1]"),
    ("randk:0", "randk:FRACTION with FRACTION in (0, 1]"),
    ("randk:2", "randk:FRACTION with FRACTION in (0, 1]"),
    ("qsgd:0", "qsgd:LEVELS with LEVELS an integer >= 1"),
    ("qsgd:2.5", "qsgd:LEVELS with LEVELS an integer >= 1"),
    ("qsgd:-4", "qsgd:LEVELS with LEVELS an integer >= 1"),
    ("powersgd:0", "powersgd:RANK with RANK an integer >= 1"),
    ("powersgd:1.0", "powersgd:RANK with RANK an integer >= 1"),
    ("sign:1", "sign takes no argument"),
    ("none:0", "none takes no argument"),
    ("top-k:0.1", "NAME[:ARG], NAME one of none, topk[:FRACTION], randk[:FRACTION], "
                  "qsgd[:LEVELS], sign, powersgd[:RANK]"),
])
def test_bad_settings_name_the_flag_in_one_line(text, allowed):
  for call in (parse_compress, compression, lambda t: message_bytes(t, PARAMS)):
    with pytest.raises(ConfigError) as error:
      call(text)
    assert (error.value.field, error.value.value) == ("compress", text)
    assert str(error.value).startswith(f"--compress={text!r} is not valid: {allowed}")
    assert "\n" not in str(error.value)


def test_a_spec_built_by_hand_is_checked_too():
  with pytest.raises(ConfigError):
    compression(CompressSpec("topk", 0.0))


# -- message sizes -----------------------------------------------------------------

@pytest.mark.parametrize("spec,expected", [
    # w: 6 x 5 = 30, conv: 3 x 3 x 2 x 4 = 72 (an 18 x 4 matrix), b: 5; float32
    ("none", (30 + 72 + 5) * 4),                              # 428
    ("topk:0.1", (3 + 8 + 1) * (4 + 4)),                      # k = 3, 8, 1: 96
    ("randk:0.1", (3 + 8 + 1) * (4 + 4)),                     # the indices travel too
    ("topk:1", (30 + 72 + 5) * 8),                            # 856: more than none
    ("qsgd:16", (4 + 23) + (4 + 54) + (4 + 4)),               # 6 bits: 180, 432, 30 bits: 93
    ("qsgd:1", (4 + 8) + (4 + 18) + (4 + 2)),                 # 2 bits: 60, 144, 10 bits: 40
    ("qsgd:3", (4 + 12) + (4 + 27) + (4 + 2)),                # 3 bits (levels 0..3): 53
    ("sign", (4 + 4) + (4 + 9) + (4 + 1)),                    # 30, 72, 5 bits: 26
    ("powersgd:2", 2 * (6 + 5) * 4 + 2 * (18 + 4) * 4 + 5 * 4),   # 284
    ("powersgd:9", 5 * (6 + 5) * 4 + 4 * (18 + 4) * 4 + 5 * 4),   # rank min(9, n, m): 592
])
def test_message_bytes_by_hand(spec, expected):
  assert message_bytes(spec, PARAMS) == expected


def test_message_bytes_read_shapes_and_dtypes():
  shapes = {"h": jax.ShapeDtypeStruct((10,), jnp.bfloat16), "s": jnp.zeros((), jnp.float32)}
  assert message_bytes("none", shapes) == 10 * 2 + 4
  assert message_bytes("topk:0.5", shapes) == 5 * (2 + 4) + 1 * (4 + 4)
  assert message_bytes("sign", shapes) == (2 + 2) + (1 + 4)


@pytest.mark.parametrize("spec", ["topk:0.1", "randk:0.1"])
def test_sparse_message_size_counts_what_is_sent(spec):
  x = {"w": RNG.uniform(1, 2, size=(6, 5)).astype(np.float32)}  # no zero coordinate
  c, _ = _run(compression(spec, error_feedback=False), [x])
  assert np.count_nonzero(c[0]["w"]) * 8 == message_bytes(spec, x)


# -- messages as they travel: payloads --------------------------------------------

def _bits(tree):
  """The leaves' bits (-0.0 is not 0.0)."""
  return [np.asarray(x).view(np.uint8) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("spec", ["none", *LOSSY, "qsgd:300"])
def test_a_payload_is_the_message_byte_for_byte_and_decodes_apart_to_the_same_bits(spec):
  """What travels is the payload: its arrays hold exactly `message_bytes`
  (qsgd:300 packs 10 bits a coordinate), and decoded in a program of its
  own (a receiver's) it gives the bits `compress` gives in one (a sender's),
  -0.0 included."""
  g = _grads(1)[0]
  g["w"][0, :3] = -0.0
  key, memory = jax.random.key(3), init_memory(spec, PARAMS, 1)
  payload, _ = jax.jit(lambda g: encode(spec, g, key, memory))(g)
  assert sum(np.asarray(x).nbytes for x in jax.tree.leaves(payload)) == message_bytes(spec, PARAMS)
  apart = jax.jit(lambda p: decode(spec, p, PARAMS))(payload)
  together, _ = jax.jit(lambda g: compress(spec, g, key, memory))(g)
  for a, b in zip(_bits(apart), _bits(together)):
    np.testing.assert_array_equal(a, b)


def test_each_payload_by_hand():
  x = jnp.array([0.5, -3.0, 2.0, 0.0])
  memory = (None,)
  sparse = encode("topk:0.5", [x], jax.random.key(0), memory)[0][0]
  np.testing.assert_array_equal(sparse.values, [-3.0, 2.0])
  np.testing.assert_array_equal(sparse.indices, [1, 2])
  # a scale, then one bit a coordinate (set where negative), 8 to a byte
  signs = encode("sign", [x], jax.random.key(0), memory)[0][0]
  assert float(signs.scale) == 1.375 and signs.negative.tolist() == [0b01000000]
  # 5 levels: 3 bits a level and a sign bit; 5 (3, 4) / 5 are exact levels
  quantized = encode("qsgd:5", [jnp.array([3.0, -4.0])], jax.random.key(0), memory,
                     unbiased=True)[0][0]
  assert float(quantized.norm) == 5.0 and quantized.codes.tolist() == [0b0011_1100]
  low_rank, _ = encode("powersgd:2", {"w": PARAMS["w"] + 1}, jax.random.key(0),
                       init_memory("powersgd:2", {"w": PARAMS["w"]}))
  assert isinstance(low_rank["w"], LowRank)
  assert (low_rank["w"].p.shape, low_rank["w"].q.shape) == ((6, 2), (5, 2))


@pytest.mark.parametrize("spec", ["topk:0.1", "powersgd:1"])
def test_encoded_is_the_transformations_step_as_it_travels(spec):
  """`encoded`'s payload decodes to the transformation's updates, bit for
  bit, and leaves the same state (residual, memory, key)."""
  tx, grads = compression(spec, seed=2), _grads(2)
  state = payload_state = tx.init(PARAMS)
  for g in grads:
    sent, state = tx.update(g, state)
    payload, payload_state = encoded(spec, g, payload_state)
    for a, b in zip(_bits(decode(spec, payload, g)), _bits(sent)):
      np.testing.assert_array_equal(a, b)
  for a, b in zip(_bits(payload_state), _bits(state)):
    np.testing.assert_array_equal(a, b)


def test_every_compressor_is_tested_here():
  assert set(COMPRESSORS) == {"none", "topk", "randk", "qsgd", "sign", "powersgd"}
