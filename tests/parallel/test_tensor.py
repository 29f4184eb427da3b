"""Tensor parallelism (jaxdl.parallel.tensor): each worker's weights sharded
over devices, Megatron-style; the same losses as the whole model's."""
import jax
import numpy as np
import pytest

from jaxdl.config import RunConfig
from jaxdl.parallel.tensor import TENSOR_AXIS, leaf_dims, shard_dims
from tests import marks
from tests.helpers import make_engine, train


def _params(model, stem="auto"):
  from jaxdl.models import build_model
  return jax.eval_shape(build_model(model, 10, (8, 8, 1), stem).init, jax.random.key(0))[0]


def test_dense_layers_sharded_in_column_row_pairs_and_attention_by_heads():
  """The MLP's two hidden layers by columns then rows, its head (left over
  from the pairs) whole;
  a ViT block's query, key and value by heads (their (in, heads, head
  dim) kernels' dim 1), its output projection and second dense layer by
  rows, its first by columns; a row-sharded layer's bias whole."""
  mlp = shard_dims("mlp", _params("mlp"))
  assert mlp == {("hidden", 0, "kernel"): 1, ("hidden", 0, "bias"): 0,
                 ("hidden", 1, "kernel"): 0}
  one = shard_dims("mlp", {"hidden": {0: {"kernel": 0, "bias": 0}}, "head": {"kernel": 0}})
  assert one == {("hidden", 0, "kernel"): 1, ("hidden", 0, "bias"): 0, ("head", "kernel"): 0}
  vit = shard_dims("vit", _params("vit"))
  block = lambda *key: vit.get(("blocks", 2, *key))
  assert [block("attention", n, "kernel") for n in ("query", "key", "value", "out")] == \
      [1, 1, 1, 0]
  assert block("attention", "query", "bias") == 0 and block("attention", "out", "bias") is None
  assert (block("up", "kernel"), block("up", "bias"), block("down", "kernel")) == (1, 0, 0)
  assert block("down", "bias") is None and ("head", "kernel") not in vit
  cnn = shard_dims("cnn", _params("cnn"))
  assert cnn[("convs", 1, "kernel")] == 3 and cnn[("convs", 1, "bias")] == 0


def test_convolutions_sharded_by_channels_and_batch_norm_with_them():
  """A residual block's last two convolutions by output channels, then input
  channels (the batch norm between by channels), its other layers, the
  shortcut's projection and the blocks' sum whole; VGG's and the cnn's
  convolutions and batch norms by channels, VGG's dense head in pairs."""
  resnet = shard_dims("resnet18", _params("resnet18"))
  block = lambda *key: resnet.get(("blocks", 2, *key))
  assert (block("convs", 0, "kernel"), block("convs", 1, "kernel")) == (3, 2)
  assert (block("bns", 0, "scale"), block("bns", 0, "bias")) == (0, 0)
  assert block("bns", 1, "scale") is None and block("proj_conv", "kernel") is None
  bottleneck = shard_dims("resnet50", _params("resnet50"))
  assert [bottleneck.get(("blocks", 0, "convs", i, "kernel")) for i in range(3)] == \
      [None, 3, 2]
  vgg = shard_dims("vgg11_bn", _params("vgg11_bn", stem="imagenet"))
  assert vgg[("convs", 4, "kernel")] == 3 and vgg[("bns", 4, "scale")] == 0
  assert [vgg.get(("head", i, "kernel")) for i in range(3)] == [1, 0, None]
  cnn_bn = shard_dims("cnn_bn", _params("cnn_bn"))
  assert cnn_bn[("norms", 1, "bias")] == 0 and ("convs", 1, "bias") not in cnn_bn


@pytest.mark.parametrize("algorithm, model, workers, k", [
    ("ar_sgd", "mlp", 2, 2),  # (by default: the rest with the slow ones)
    marks.slow("sgd", "vit", 1, 4),
    marks.slow("local_sgd", "mlp", 2, 2),
    marks.slow("ar_sgd", "cnn", 2, 4),
    marks.slow("bsp", "mlp", 2, 2),
    marks.slow("ar_sgd", "cnn_bn", 2, 2),                        # batch norm by channels
    marks.slow("sgd", "resnet18", 1, 4),
    marks.slow("diloco", "mlp", 2, 2),
])
def test_a_tensor_parallel_run_trains_as_the_data_parallel_one(algorithm, model, workers, k):
  """--parallelism tensor inside a synchronous algorithm (each worker's
  weights over a row of k devices): the same losses step by step and the
  same evaluation as the whole model on a device per worker; the sharded
  parameters and their optimizer state lie along the tensor axis, so a
  device holds less of them (bsp's server keeps flat slices: the layers it
  gathers are split for the loss). (With momentum SGD: Adam would turn float
  noise in a gradient that is zero in exact arithmetic, attention's key
  bias's, into updates of +-lr.)"""
  # (ResNet-18: one step; batch norm over 1x1 maps of 16 examples, on 8x8
  # digits, makes rounding errors grow: initial parameters 1e-7 apart end
  # 5e-6 apart after a step, 4e-2 after two, of a leaf's largest value)
  steps = 1 if model == "resnet18" else 5
  base = dict(algorithm=algorithm, workers=workers, model=model, batch_size=16,
              schedule="constant", optimizer="sgd", lr=0.05, momentum=0.9,
              **{"local_sgd": {"communication_period": 2},
                 "diloco": {"inner_steps": 2}}.get(algorithm, {}))
  sharded = make_engine(RunConfig.make(**base, parallelism="tensor", tensor_parallel=k))
  assert sharded.mesh.devices.shape == (workers, k) and sharded.mesh.axis_names[1] == TENSOR_AXIS
  whole = make_engine(RunConfig.make(**base))
  (state, history), (expected_state, expected) = train(sharded, steps), train(whole, steps)
  np.testing.assert_allclose([h["loss"] for h in history], [h["loss"] for h in expected],
                             rtol=1e-5)
  got, want = sharded.evaluated(state), whole.evaluated(expected_state)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    if model == "resnet18":  # to a leaf's largest value (measured: 4e-6)
      assert np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(b)), (a, b)
    else:
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
  if algorithm == "bsp":  # flat server slices: the loss splits the gathered layers
    count = lambda e: e._compiled.as_text().count("all-reduce")
    assert count(sharded) > count(whole)  # the tensor axis's, which XLA added
    return
  dims = leaf_dims(model, _params(model), sharded._worker_shapes)
  leaves = jax.tree.leaves(state.workers)
  sharded_leaves = [x for x, d in zip(leaves, jax.tree.leaves(dims)) if d >= 0]
  # every sharded parameter, and its momentum as well (local_sgd: the reference
  # its averages are differences from; diloco: theta and its outer momentum)
  copies = {"local_sgd": 3, "diloco": 4}.get(algorithm, 2)
  assert len(sharded_leaves) == copies * len(shard_dims(model, _params(model)))
  assert all(TENSOR_AXIS in str(x.sharding.spec) for x in sharded_leaves)
  memory = [e.figures()["memory_per_device_bytes"]["arguments"] for e in (sharded, whole)]
  assert memory[0] < memory[1], memory


def test_a_tensor_parallel_run_resumes_bit_for_bit(tmp_path):
  """Killed after its checkpoint at step 3 (the last one removed), a tensor
  parallel run resumes with its state sharded as before: the same final
  parameters, bit for bit, as the run that was not stopped."""
  import shutil

  import jaxdl
  flags = dict(algorithm="ar_sgd", workers=2, model="mlp", parallelism="tensor",
               tensor_parallel=2, steps=6, checkpoint_every=3, progress=False)
  whole = jaxdl.run(RunConfig.make(**flags, out=str(tmp_path / "a")))
  assert whole["tensor_parallel"] == 2 and whole["devices"] == 4
  shutil.rmtree(tmp_path / "a" / "checkpoints" / "6")
  resumed = jaxdl.run(RunConfig.make(**flags, out=str(tmp_path / "a"), resume=True))
  assert resumed["params_fingerprint"] == whole["params_fingerprint"]
