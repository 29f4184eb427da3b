"""The model zoo: standard sizes, shapes, batch-norm state, determinism."""
from __future__ import annotations

import functools

import chex
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.errors import ConfigError
from jaxdl.models import MODELS, Model, build_model, count_params
from jaxdl.models import resnet
from jaxdl.models.base import from_nnx
from tests import marks

ALL = MODELS.names()
BATCH = 4


def _abstract_init(model: Model):
  return jax.eval_shape(model.init, jax.random.key(0))


def _images(shape, seed=0):
  return np.random.default_rng(seed).normal(size=(BATCH, *shape)).astype(np.float32)


def _assert_nested_dicts(tree, leaf_type):
  assert isinstance(tree, dict)
  for value in tree.values():
    if isinstance(value, dict):
      _assert_nested_dicts(value, leaf_type)
    else:
      assert isinstance(value, leaf_type), type(value)


def _assert_differ(a, b):
  """Some leaf of `a` differs from `b`'s (chex compares on the host: no compiles)."""
  with pytest.raises(AssertionError):
    chex.assert_trees_all_equal(a, b)


def test_registry_names_and_docs():
  assert ALL == ["mlp", "cnn", "cnn_bn", "resnet18", "resnet34", "resnet50",
                 "vgg11", "vgg11_bn", "vgg16", "vgg16_bn", "vit"]
  for name in ALL:
    assert MODELS.doc(name)


@pytest.mark.parametrize("name, image_shape, classes, expected", [
    # The three sizes every framework quotes.
    marks.slow("resnet50", (224, 224, 3), 1000, 25_557_032),  # (Bottleneck runs by default)
    ("resnet18", (32, 32, 3), 10, 11_173_962),
    ("vgg16", (224, 224, 3), 1000, 138_357_544),
    # torchvision's counts for the rest of the ImageNet models.
    ("resnet18", (224, 224, 3), 1000, 11_689_512),
    ("resnet34", (224, 224, 3), 1000, 21_797_672),
    ("vgg11", (224, 224, 3), 1000, 132_863_336),
    ("vgg11_bn", (224, 224, 3), 1000, 132_868_840),
    ("vgg16_bn", (224, 224, 3), 1000, 138_365_992),
    # the ViT by hand, CIFAR-shaped: patch embedding 4*4*3*64 + 64, 64 positions
    # x 64, 4 blocks of (2 layer norms 2*128, attention 4*(64*64 + 64), MLP
    # 64*256 + 256 + 256*64 + 64), final layer norm 128, head 64*10 + 10
    ("vit", (32, 32, 3), 10, 3136 + 4096 + 4 * (256 + 16_640 + 33_088) + 128 + 650),
])
def test_standard_parameter_counts(name, image_shape, classes, expected):
  assert count_params(build_model(name, classes, image_shape)) == expected


def test_small_model_sizes():
  assert 30_000 <= count_params(build_model("cnn", 10, (8, 8, 1))) <= 100_000
  # 64*256+256 + 256*128+128 + 128*10+10
  assert count_params(build_model("mlp", 10, (8, 8, 1))) == 50_826


_STEM_CASES = [("cifar", (8, 8, 1)), ("cifar", (32, 32, 3)), ("imagenet", (64, 48, 3))]


# By default one model of each family: the mlp and the cnn on every stem case,
# ResNet-18, VGG-11 with batch norm and the ViT on the ImageNet one (VGG's
# resize, ResNet's pool); the rest with the slow ones.
_LOGITS_DEFAULT = {"mlp": (0, 1, 2), "cnn": (0, 1, 2), "resnet18": (2,), "vgg11_bn": (2,),
                   "vit": (2,)}


@pytest.mark.parametrize("name, stem, image_shape", [
    pytest.param(name, stem, image_shape, id=f"{name}-{stem}-image_shape{i}",
                 marks=() if i in _LOGITS_DEFAULT.get(name, ()) else pytest.mark.slow)
    for name in ALL for i, (stem, image_shape) in enumerate(_STEM_CASES)])
def test_logits_shape(name, stem, image_shape):
  # Shapes only: tracing the jitted apply checks them without compiling. The
  # 64x48 ImageNet case has VGG resize a 2x1 map and ResNet pool a 2x2 one.
  model = build_model(name, 10, image_shape, stem=stem)
  params, state = _abstract_init(model)
  _assert_nested_dicts(params, jax.ShapeDtypeStruct)
  _assert_nested_dicts(state, jax.ShapeDtypeStruct)
  apply = jax.jit(model.apply, static_argnums=3)
  images = jax.ShapeDtypeStruct((BATCH, *image_shape), jnp.float32)
  for train in (True, False):
    logits, new_state = jax.eval_shape(apply, params, state, images, train)
    chex.assert_shape(logits, (BATCH, 10))
    chex.assert_trees_all_equal_structs(new_state, state)


def test_vgg_imagenet_head_on_224_needs_no_resize():
  model = build_model("vgg11", 1000, (224, 224, 3))
  params, state = _abstract_init(model)
  chex.assert_shape(params["head"][0]["kernel"], (7 * 7 * 512, 4096))
  images = jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.float32)
  apply = functools.partial(model.apply, train=False)
  logits, _ = jax.eval_shape(apply, params, state, images)
  chex.assert_shape(logits, (2, 1000))


def test_stem_auto_and_errors():
  def stem_kernel(shape):
    params, _ = _abstract_init(build_model("resnet18", 10, shape))
    return params["stem_conv"]["kernel"].shape[:2]
  assert stem_kernel((32, 32, 3)) == (3, 3)
  assert stem_kernel((127, 500, 3)) == (3, 3)
  assert stem_kernel((128, 128, 3)) == (7, 7)
  with pytest.raises(ConfigError, match="--model="):
    build_model("resnet19", 10, (32, 32, 3))
  with pytest.raises(ConfigError, match="one of auto, cifar, imagenet"):
    build_model("resnet18", 10, (32, 32, 3), stem="tiny")


def _small_resnet(block) -> Model:
  # Two stages of one block each: the block's batch norms and projection
  # shortcut, compiled in a fraction of ResNet-18/50's time.
  build = functools.partial(resnet.ResNet, (8, 8, 1), 10, (1, 1), block, "cifar")
  return from_nnx(block.__name__, lambda rngs: build(rngs=rngs), 10, (8, 8, 1))


# Real computation, so small models: on CPU, compiling the random initializer
# costs about 0.3 s per parameter shape with threefry keys and less with rbg.
# resnet34, resnet50 and vgg16_bn share their code with the models run here.
@pytest.mark.parametrize("name, key_impl", [
    ("mlp", None), ("cnn", None), ("vit", None), marks.slow("vgg11_bn", "rbg"),
    marks.slow("BasicBlock", "rbg"), ("Bottleneck", "rbg")])
def test_run_train_and_eval(name, key_impl):
  if name in MODELS:
    model = build_model(name, 10, (8, 8, 1))
  else:
    model = _small_resnet(getattr(resnet, name))
  key = functools.partial(jax.random.key, impl=key_impl)
  init = jax.jit(model.init)  # compiled once, run for three keys
  params, state = init(key(0))
  _assert_nested_dicts(params, jax.Array)
  _assert_nested_dicts(state, jax.Array)
  chex.assert_trees_all_equal((params, state), init(key(0)))
  _assert_differ(params, init(key(1))[0])

  apply = jax.jit(model.apply, static_argnums=3)
  images = _images((8, 8, 1))
  logits, eval_state = apply(params, state, images, False)
  chex.assert_shape(logits, (BATCH, 10))
  chex.assert_tree_all_finite(logits)
  chex.assert_trees_all_equal(eval_state, state)
  chex.assert_trees_all_equal(logits, apply(params, state, images, False)[0])

  train_logits, train_state = apply(params, state, images, True)
  chex.assert_shape(train_logits, (BATCH, 10))
  chex.assert_trees_all_equal_structs(train_state, state)
  has_bn = bool(jax.tree.leaves(state))
  assert has_bn == (name not in ("mlp", "cnn", "vit"))
  if has_bn:
    # Every running mean and variance moves towards the batch's statistics.
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), state, train_state)
    assert all(jax.tree.leaves(moved))
    # Batch statistics, not running ones, are used in training.
    _assert_differ(train_logits, logits)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cnn", "mlp", "vit"])
def test_learns_digits(name):
  optax = pytest.importorskip("optax")
  datasets = pytest.importorskip("sklearn.datasets")
  x, y = datasets.load_digits(return_X_y=True)
  x = (x.reshape(-1, 8, 8, 1).astype(np.float32) / 8.0 - 1.0)
  perm = np.random.default_rng(0).permutation(len(x))
  x, y = x[perm], y[perm]
  x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
  model = build_model(name, 10, (8, 8, 1))
  params, state = model.init(jax.random.key(0))
  opt = optax.adam(1e-3)
  opt_state = opt.init(params)

  @jax.jit
  def step(params, opt_state, xb, yb):
    def loss(p):
      logits, _ = model.apply(p, state, xb, True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
    grads = jax.grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  for epoch in range(10):
    order = np.random.default_rng(epoch).permutation(len(x_train))
    for i in range(0, len(order) - 63, 64):
      b = order[i:i + 64]
      params, opt_state = step(params, opt_state, x_train[b], y_train[b])
  logits, _ = model.apply(params, state, x_test, False)
  assert float(jnp.mean(jnp.argmax(logits, -1) == y_test)) >= 0.95


@pytest.mark.slow  # 40 ViT steps on 32 x 32 x 3; tfds reading and the ViT are default tests
def test_vit_trains_on_cifar_shaped_tfds_data(tmp_path):
  """The ViT through a whole run on tfds's CIFAR-10 (mocked: 32 x 32 x 3,
  random images and labels): 64 tokens of 4 x 4 patches, and the training
  loss of the same 64 examples falls as it learns them."""
  import json

  import jaxdl
  from jaxdl.config import RunConfig
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=64):
    summary = jaxdl.run(RunConfig.make(
        algorithm="sgd", dataset="tfds:cifar10", data_dir=str(tmp_path / "data"), model="vit",
        batch_size=32, steps=40, optimizer="adam", lr=3e-3, schedule="constant", log_every=1,
        eval_every=40, progress=False, out=str(tmp_path / "run")))
  assert summary["status"] == "completed"
  losses = [json.loads(line)["train_loss"] for line in
            (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
            if "train_loss" in line]
  assert len(losses) == 40 and np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4]), losses


def _ops_dtypes(fn, *args) -> dict[str, set[str]]:
  """The output dtypes of each convolution and matrix product in fn's jaxpr."""
  found: dict[str, set[str]] = {"conv_general_dilated": set(), "dot_general": set()}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name in found:
        found[eqn.primitive.name].update(str(v.aval.dtype) for v in eqn.outvars)
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def test_bfloat16_computes_in_bfloat16_with_float32_parameters_gradients_and_statistics():
  images, labels = jnp.asarray(_images((8, 8, 1))), jnp.arange(BATCH) % 10
  f32 = build_model("cnn_bn", 10, (8, 8, 1))
  params, state = f32.init(jax.random.key(0))

  def loss(model, params):
    logits, new_state = model.apply(params, state, images, True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), (
        logits, new_state)

  results = {}
  for dtype in ("float32", "bfloat16"):
    model = build_model("cnn_bn", 10, (8, 8, 1), compute_dtype=dtype)
    fn = jax.value_and_grad(functools.partial(loss, model), has_aux=True)
    ops = _ops_dtypes(fn, params)
    assert ops["conv_general_dilated"] == {dtype} and ops["dot_general"] == {dtype}, ops
    (value, (logits, new_state)), grads = jax.jit(fn)(params)
    for tree in (logits, new_state, grads):
      assert {x.dtype for x in jax.tree.leaves(tree)} == {jnp.dtype(jnp.float32)}
    results[dtype] = value, grads
  (l32, g32), (l16, g16) = results["float32"], results["bfloat16"]
  # bfloat16 keeps 8 bits of mantissa: the loss and gradients move by about
  # 2^-8 of their size, neither exactly nor more.
  flat32, flat16 = (jnp.concatenate([x.ravel() for x in jax.tree.leaves(g)]) for g in (g32, g16))
  relative = float(jnp.linalg.norm(flat16 - flat32) / jnp.linalg.norm(flat32))
  assert 1e-4 < relative < 5e-2, relative
  assert 0 < abs(float(l16) - float(l32)) < 2e-2
