"""Residual networks, ResNet-18/34/50.

He et al., "Deep Residual Learning for Image Recognition", CVPR 2016,
https://arxiv.org/abs/1512.03385. Layout follows torchvision (stride on the
3x3 conv of a bottleneck, "v1.5"), so parameter counts match it exactly.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
from flax import nnx

from jaxdl.errors import ConfigError
from jaxdl.models.layers import BatchNorm, BatchStats
from jaxdl.models.simple import global_avg_pool

STEMS = ("cifar", "imagenet")

# He-normal on fan-out, as torchvision initializes ResNet convolutions.
_CONV_INIT = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")


def conv_bn(cin: int, cout: int, kernel: int, stride: int,
            rngs: nnx.Rngs) -> tuple[nnx.Conv, BatchNorm]:
  """A bias-free convolution (BN supplies the shift) and its batch norm."""
  # Explicit torch-style padding: SAME pads unevenly at stride 2.
  pad = kernel // 2
  conv = nnx.Conv(cin, cout, (kernel, kernel), strides=stride,
                  padding=((pad, pad), (pad, pad)), use_bias=False,
                  kernel_init=_CONV_INIT, rngs=rngs)
  bn = BatchNorm(cout, momentum=0.9, epsilon=1e-5, rngs=rngs)
  return conv, bn


class _Block(nnx.Module):
  """Shared parts of the residual blocks: conv-BN layers and the shortcut."""

  expansion = 1

  def _set_layers(self, layers: list[tuple[nnx.Conv, BatchNorm]]):
    # Two flat lists: nnx.List cannot hold tuples of modules.
    self.convs = nnx.List([conv for conv, _ in layers])
    self.bns = nnx.List([bn for _, bn in layers])

  def _shortcut_for(self, cin: int, cout: int, stride: int, rngs: nnx.Rngs):
    # A 1x1 projection only where the identity would not fit.
    if stride != 1 or cin != cout:
      self.proj_conv, self.proj_bn = conv_bn(cin, cout, 1, stride, rngs)
    else:
      self.proj_conv = self.proj_bn = None

  def _shortcut(self, x: jax.Array, train: bool,
                stats: BatchStats | None) -> jax.Array:
    if self.proj_conv is None:
      return x
    return self.proj_bn(self.proj_conv(x), train, stats)

  def __call__(self, x: jax.Array, train: bool = False,
               stats: BatchStats | None = None) -> jax.Array:
    y = x
    last = len(self.convs) - 1
    for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
      y = bn(conv(y), train, stats)
      if i < last:
        y = nnx.relu(y)
    return nnx.relu(y + self._shortcut(x, train, stats))


class BasicBlock(_Block):
  """Two 3x3 conv-BN layers plus the shortcut (ResNet-18/34)."""

  expansion = 1

  def __init__(self, cin: int, width: int, stride: int, *, rngs: nnx.Rngs):
    self._set_layers([conv_bn(cin, width, 3, stride, rngs),
                      conv_bn(width, width, 3, 1, rngs)])
    self._shortcut_for(cin, width, stride, rngs)


class Bottleneck(_Block):
  """1x1 reduce, 3x3 (strided), 1x1 expand by 4, plus the shortcut (ResNet-50)."""

  expansion = 4

  def __init__(self, cin: int, width: int, stride: int, *, rngs: nnx.Rngs):
    cout = width * self.expansion
    self._set_layers([conv_bn(cin, width, 1, 1, rngs),
                      conv_bn(width, width, 3, stride, rngs),
                      conv_bn(width, cout, 1, 1, rngs)])
    self._shortcut_for(cin, cout, stride, rngs)


class ResNet(nnx.Module):
  """A ResNet: stem, four stages of residual blocks, global average pool, dense.

  ``stem="imagenet"``: 7x7 conv stride 2, BN, ReLU, 3x3 max pool stride 2 (for
  224x224 inputs). ``stem="cifar"``: one 3x3 conv stride 1, BN, ReLU and no
  pool, which keeps the resolution small images need. Tiny inputs work: strided
  layers on a 1x1 map leave it 1x1.
  """

  def __init__(self, image_shape: tuple[int, int, int], num_classes: int,
               stage_sizes: Sequence[int], block: type[_Block],
               stem: str = "imagenet", *, rngs: nnx.Rngs):
    if stem not in STEMS:
      raise ConfigError("stem", stem, "one of " + ", ".join(STEMS))
    self.imagenet_stem = stem == "imagenet"
    kernel, stride = (7, 2) if self.imagenet_stem else (3, 1)
    self.stem_conv, self.stem_bn = conv_bn(image_shape[-1], 64, kernel, stride, rngs)
    blocks, cin = [], 64
    for i, num_blocks in enumerate(stage_sizes):
      width = 64 * 2**i
      for j in range(num_blocks):
        stride = 2 if i > 0 and j == 0 else 1
        blocks.append(block(cin, width, stride, rngs=rngs))
        cin = width * block.expansion
    self.blocks = nnx.List(blocks)
    self.head = nnx.Linear(cin, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array, train: bool = False,
               stats: BatchStats | None = None) -> jax.Array:
    x = nnx.relu(self.stem_bn(self.stem_conv(x), train, stats))
    if self.imagenet_stem:
      x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for block in self.blocks:
      x = block(x, train=train, stats=stats)
    return self.head(global_avg_pool(x))

  def pieces(self) -> list[tuple[nnx.Module, Callable]]:
    """The model as a sequence (jaxdl.parallel.pipeline.model_stages): the
    stem, each residual block, the pooled head; each called as
    `call(module, x, train, stats)`."""
    def stem(m, x, train=False, stats=None):
      x = nnx.relu(m[1](m[0](x), train, stats))
      if self.imagenet_stem:
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
      return x
    block = lambda m, x, train=False, stats=None: m(x, train=train, stats=stats)
    head = lambda m, x, train=False, stats=None: m(global_avg_pool(x))
    return [(nnx.List([self.stem_conv, self.stem_bn]), stem),
            *[(b, block) for b in self.blocks], (self.head, head)]


def resnet18(image_shape, num_classes, stem="imagenet", *, rngs) -> ResNet:
  """ResNet-18: BasicBlock, stages (2, 2, 2, 2)."""
  return ResNet(image_shape, num_classes, (2, 2, 2, 2), BasicBlock, stem, rngs=rngs)


def resnet34(image_shape, num_classes, stem="imagenet", *, rngs) -> ResNet:
  """ResNet-34: BasicBlock, stages (3, 4, 6, 3)."""
  return ResNet(image_shape, num_classes, (3, 4, 6, 3), BasicBlock, stem, rngs=rngs)


def resnet50(image_shape, num_classes, stem="imagenet", *, rngs) -> ResNet:
  """ResNet-50: Bottleneck, stages (3, 4, 6, 3)."""
  return ResNet(image_shape, num_classes, (3, 4, 6, 3), Bottleneck, stem, rngs=rngs)
