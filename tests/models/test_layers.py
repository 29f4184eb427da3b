"""Batch norm with masked and worker-summed statistics."""
from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdl.models import build_model, resnet
from jaxdl.models.base import from_nnx
from jaxdl.models.layers import BatchNorm, BatchStats
from tests import marks

TOL = dict(rtol=1e-5, atol=1e-5)
_PSUM = BatchStats(psum=lambda t: jax.lax.psum(t, "w"))


def _normal(shape, seed=0):
  return np.random.default_rng(seed).normal(1.0, 2.0, size=shape).astype(np.float32)


def _assert_close(a, b):
  chex.assert_trees_all_close(a, b, **TOL)


def _bn_model(features=5):
  # The layer alone as a Model: from_nnx calls it as module(x, train=, stats=).
  return from_nnx("bn", lambda rngs: BatchNorm(features, rngs=rngs), 0, (1, 1, 1))


def _small_resnet():
  # Two stages of one bottleneck each: stem, block and projection batch norms.
  build = functools.partial(resnet.ResNet, (8, 8, 1), 10, (1, 1),
                            resnet.Bottleneck, "cifar")
  return from_nnx("resnet", lambda rngs: build(rngs=rngs), 10, (8, 8, 1))


def _model(name):
  return build_model(name, 10, (8, 8, 1)) if name == "vgg11_bn" else _small_resnet()


def _pad(x, real_rows, fill):
  """x's rows at ``real_rows`` of a bigger batch, ``fill`` elsewhere, and the mask."""
  size = max(real_rows) + 2
  padded = np.full((size, *x.shape[1:]), fill, np.float32)
  padded[real_rows] = x
  mask = np.zeros(size, np.float32)
  mask[real_rows] = 1.0
  return padded, mask


@pytest.mark.parametrize("shape", [marks.slow((6, 5)), (4, 3, 2, 5)])
def test_matches_nnx_batchnorm(shape):
  ours = BatchNorm(5, rngs=nnx.Rngs(0))
  ref = nnx.BatchNorm(5, momentum=0.9, epsilon=1e-5, use_fast_variance=False,
                      rngs=nnx.Rngs(0))
  assert (jax.tree.structure(nnx.to_pure_dict(nnx.state(ours))) ==
          jax.tree.structure(nnx.to_pure_dict(nnx.state(ref))))
  for layer in (ours, ref):  # a scale and shift that show up in the output
    layer.scale[...] = jnp.linspace(0.5, 2.0, 5)
    layer.bias[...] = jnp.linspace(-1.0, 1.0, 5)
  for step in range(2):
    x = _normal(shape, seed=step)
    _assert_close(ours(x, train=True), ref(x, use_running_average=False))
    _assert_close((ours.mean[...], ours.var[...]), (ref.mean[...], ref.var[...]))
  _assert_close(ours(x, train=False), ref(x, use_running_average=True))


@pytest.mark.parametrize("shape", [marks.slow((6, 5)), (6, 3, 2, 5)])
def test_layer_mask_and_psum(shape):
  model = _bn_model()
  params, state = model.init(jax.random.key(0))
  x = _normal(shape)
  want, want_state = model.apply(params, state, x, True)
  # Padding in the middle and at the end, holding garbage that would swamp
  # (1e6) or poison (inf, NaN) the statistics if it entered them.
  padded, mask = _pad(x, [0, 1, 3, 4, 5, 7], 1e6)
  padded[2], padded[8] = np.inf, np.nan
  got, got_state = model.apply(params, state, padded, True, BatchStats(mask=mask))
  _assert_close((got[mask == 1], got_state), (want, want_state))
  # Two workers with 4 and 2 real examples, synced: the whole batch's numbers.
  workers = np.stack([padded[:4], padded[4:8]])
  masks = np.stack([mask[:4], mask[4:8]])
  def worker(xw, mw):
    return model.apply(params, state, xw, True, BatchStats(mw, _PSUM.psum))
  got, got_state = jax.vmap(worker, axis_name="w")(workers, masks)
  _assert_close((got[masks == 1], got_state),
                (want, jax.tree.map(lambda s: np.stack([s, s]), want_state)))


def test_layer_all_padding_and_eval():
  model = _bn_model()
  params, state = model.init(jax.random.key(0))
  state = jax.tree.map(lambda s: s + 0.5, state)
  x = _normal((4, 5))
  # No real example: no statistics, the running ones stay, nothing is NaN.
  out, new_state = model.apply(params, state, x, True, BatchStats(mask=np.zeros(4)))
  chex.assert_tree_all_finite(out)
  _assert_close(new_state, state)
  # Evaluation uses the running statistics whatever stats says.
  want = model.apply(params, state, x, False)
  _assert_close(model.apply(params, state, x, False, BatchStats(np.zeros(4))), want)


@pytest.mark.parametrize("name", [marks.slow("vgg11_bn"), "resnet"])
def test_model_padding_and_sync(name):
  # One test for both, so each model compiles three programs, not five.
  model = _model(name)
  params, state = jax.jit(model.init)(jax.random.key(0, impl="rbg"))
  apply = jax.jit(model.apply, static_argnums=3)
  x = _normal((6, 8, 8, 1))
  want = apply(params, state, x, True)
  # Padding, 1e6 in every pixel, changes neither real logits nor statistics.
  padded, mask = _pad(x, [0, 1, 2, 3, 5, 6], 1e6)
  logits, new_state = apply(params, state, padded, True, BatchStats(mask=mask))
  _assert_close((logits[mask == 1], new_state), want)
  # Two workers with 4 and 2 real examples, synced: the whole batch's numbers
  # on each worker.
  def worker(xw, mw):
    return model.apply(params, state, xw, True, BatchStats(mw, _PSUM.psum))
  sync = jax.jit(jax.vmap(worker, axis_name="w"))
  logits, new_state = sync(padded.reshape(2, 4, 8, 8, 1), mask.reshape(2, 4))
  _assert_close(logits.reshape(8, 10)[mask == 1], want[0])
  for w in range(2):
    _assert_close(jax.tree.map(lambda s: s[w], new_state), want[1])
