"""Tensor parallelism: each worker's weights sharded over a device axis.

Megatron-style (Shoeybi et al. 2019): in a pair of dense layers the first is
sharded by columns (its outputs: kernel dim 1, bias dim 0), the second by rows
(its inputs: kernel dim 0, bias whole), so one all-reduce follows the pair;
attention's query, key and value by heads and its output projection by
rows; a convolution by its output channels, or in a residual block's last
pair of convolutions the first by its output channels and the second by its
input channels (one all-reduce before the block's sum), a batch norm by
channels as the convolution before it. The shardings are `NamedSharding`s
of the parameters (and of the optimizer state shaped like them) along
TENSOR_AXIS; XLA's partitioner inserts the collectives, so a sharding changes
where the arithmetic runs, not its result (jaxdl.engines.mesh).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

TENSOR_AXIS = "tensor"
"""The mesh axis a worker's sharded weights lie along (jaxdl.engines.mesh)."""

COLUMNS, ROWS, HEADS = "columns", "rows", "heads"
CHANNELS, IN_CHANNELS, NORM = "channels", "input channels", "norm"
TENSOR_MODELS = ("mlp", "cnn", "cnn_bn", "vit", "resnet18", "resnet34", "resnet50",
                 "vgg11", "vgg11_bn", "vgg16", "vgg16_bn")
"""The zoo models with a sharding of their layers."""

# the dimension of each parameter of a layer that each sharding cuts (others: whole)
_DIMS = {COLUMNS: {"kernel": 1, "bias": 0}, ROWS: {"kernel": 0}, HEADS: {"kernel": 1, "bias": 0},
         CHANNELS: {"kernel": 3, "bias": 0}, IN_CHANNELS: {"kernel": 2},
         NORM: {"scale": 0, "bias": 0}}


def _dense_pairs(layers: list[tuple]) -> dict[tuple, str]:
  """Dense layers in (columns, rows) pairs; one left over: whole."""
  return {layer: COLUMNS if i % 2 == 0 else ROWS
          for i, layer in enumerate(layers[:len(layers) // 2 * 2])}


def layer_shardings(model: str, params: dict) -> dict[tuple, str]:
  """Each sharded layer of the zoo model `model` (its parameters `params`, a
  pure dict): {path of the layer: how it is sharded}."""
  shardings: dict[tuple, str] = {}
  if model == "mlp":  # its dense layers in (columns, rows) pairs; one left over: whole
    shardings = _dense_pairs([("hidden", i) for i in sorted(params["hidden"])] + [("head",)])
  elif model in ("cnn", "cnn_bn"):  # convolutions (and norms) by channels; the dense pair
    for i in params["convs"]:
      shardings[("convs", i)] = CHANNELS
    for i in params.get("norms", {}):
      shardings[("norms", i)] = NORM
    shardings[("dense",)], shardings[("head",)] = COLUMNS, ROWS
  elif model.startswith("resnet"):  # a block's last two convolutions: channels, input channels
    for i in params["blocks"]:
      convs = sorted(params["blocks"][i]["convs"])
      first, second = ("blocks", i, "convs", convs[-2]), ("blocks", i, "convs", convs[-1])
      shardings[first], shardings[second] = CHANNELS, IN_CHANNELS
      shardings[("blocks", i, "bns", convs[-2])] = NORM
  elif model.startswith("vgg"):  # convolutions (and norms) by channels; the head's pairs
    for i in params["convs"]:
      shardings[("convs", i)] = CHANNELS
    for i in params.get("bns", {}):
      shardings[("bns", i)] = NORM
    shardings.update(_dense_pairs([("head", i) for i in sorted(params["head"])]))
  elif model == "vit":  # each block: attention by heads then rows, its MLP columns, rows
    for i in params["blocks"]:
      block = ("blocks", i)
      for name in ("query", "key", "value"):
        shardings[(*block, "attention", name)] = HEADS
      shardings[(*block, "attention", "out")] = ROWS
      shardings[(*block, "up")], shardings[(*block, "down")] = COLUMNS, ROWS
  else:
    raise ValueError(f"no tensor sharding for model {model!r}: one of {', '.join(TENSOR_MODELS)}")
  return shardings


def shard_dims(model: str, params: dict) -> dict[tuple, int]:
  """{path of a parameter: the dimension sharded along TENSOR_AXIS}; the
  parameters not in it are whole on every device of the axis."""
  dims = {}
  for layer, how in layer_shardings(model, params).items():
    node = params
    for key in layer:
      node = node[key]
    dims.update({(*layer, name): d for name, d in _DIMS[how].items() if name in node})
  return dims


def _keys(path) -> tuple:
  """A tree path's keys (dict keys, sequence indices, attribute names)."""
  return tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)


def _shapes(params: dict) -> dict[tuple, tuple]:
  """{path of a parameter: its shape}."""
  return {_keys(path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def leaf_dims(model: str, params: dict, state: Any) -> Any:
  """`state`'s leaves (a worker's: parameters, optimizer state, ...; `params`
  the zoo model `model`'s) mapped to the dimension sharded along TENSOR_AXIS,
  -1 for none: a leaf whose path ends with a sharded parameter's path and has
  its shape is sharded as that parameter is."""
  dims, shapes = shard_dims(model, params), _shapes(params)

  def dim(path, leaf):
    keys = _keys(path)
    return next((d for param, d in dims.items()
                 if keys[-len(param):] == param and tuple(leaf.shape) == shapes[param]), -1)
  return jax.tree_util.tree_map_with_path(dim, state)


def indivisible(model: str, params: dict, k: int) -> str | None:
  """The first sharded parameter whose sharded dimension `k` does not divide, in
  words; None if k divides them all."""
  sizes = _shapes(params)
  for path, d in shard_dims(model, params).items():
    if sizes[path][d] % k:
      return f"{'/'.join(map(str, path))} has {sizes[path][d]} along its sharded dimension {d}"
  return None


def dim_spec(dim: int) -> P:
  """The spec that shards a leaf's dimension `dim` along TENSOR_AXIS (-1:
  none, a leaf whole on every device of the axis)."""
  return P(*([None] * dim), TENSOR_AXIS) if dim >= 0 else P()


def tensor_task(task, model: str):
  """`task` (a zoo model's classification) whose loss sees its parameters
  sharded as `shard_dims` says wherever the mesh has TENSOR_AXIS (a sharding
  constraint: a no-op where they lie so already; for bsp, whose workers
  gather flat slices of them, it puts the gathered parameters' layers on the
  tensor axis before the loss's arithmetic)."""
  def loss(params, model_state, batch, key, stats=None):
    mesh = jax.sharding.get_abstract_mesh()
    if TENSOR_AXIS in getattr(mesh, "axis_names", ()):
      params = jax.tree.map(lambda x, d: jax.lax.with_sharding_constraint(x, dim_spec(d)),
                            params, leaf_dims(model, params, params))
    return task.loss(params, model_state, batch, key, stats)
  return dataclasses.replace(task, loss=loss)
