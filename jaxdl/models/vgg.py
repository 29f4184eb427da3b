"""VGG-11 and VGG-16, with or without batch norm.

Simonyan and Zisserman, "Very Deep Convolutional Networks for Large-Scale
Image Recognition", ICLR 2015, https://arxiv.org/abs/1409.1556 (configurations
A and D). Batch norm, where used, follows torchvision's ``vgg*_bn``: after each
conv, before the ReLU, with the conv bias kept, so parameter counts match it.
"""
from __future__ import annotations

from typing import Callable

import jax
from flax import nnx

from jaxdl.errors import ConfigError
from jaxdl.models.layers import BatchNorm, BatchStats
from jaxdl.models.simple import pool_if_wider, pooled_hw

STEMS = ("cifar", "imagenet")

# Output channels of each 3x3 conv; "M" is a 2x2 max pool.
CONFIGS = {
    "A": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "D": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
          512, 512, 512, "M", 512, 512, 512, "M"),
}

# He-normal on fan-out, as torchvision initializes VGG convolutions.
_CONV_INIT = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")


class VGG(nnx.Module):
  """A VGG network: 3x3 convs and five 2x2 max pools, then a dense head.

  ``stem="imagenet"``: the feature map is brought to 7x7, flattened and fed to
  dense 4096-ReLU-4096-ReLU-classes. Where it is not already 7x7 it is resized
  with `jax.image.resize` (linear, antialiased), an approximation of
  torchvision's adaptive average pooling, not the same numbers. The paper's
  dropout in the head is left out: jaxdl models carry no dropout.

  ``stem="cifar"``: the feature map (1x1x512 for 32x32 inputs) is flattened
  and fed to one dense layer to the classes, the usual CIFAR variant.

  A max pool is skipped once the map is 1x1, so tiny inputs (8x8) work.
  """

  def __init__(self, image_shape: tuple[int, int, int], num_classes: int,
               config: str, batch_norm: bool, stem: str = "imagenet", *,
               rngs: nnx.Rngs):
    if stem not in STEMS:
      raise ConfigError("stem", stem, "one of " + ", ".join(STEMS))
    self.imagenet_head = stem == "imagenet"
    convs, bns, pool_after, cin = [], [], [], image_shape[-1]
    for item in CONFIGS[config]:
      if item == "M":
        pool_after[-1] = True
        continue
      convs.append(nnx.Conv(cin, item, (3, 3), padding=((1, 1), (1, 1)),
                            kernel_init=_CONV_INIT, rngs=rngs))
      if batch_norm:
        bns.append(BatchNorm(item, momentum=0.9, epsilon=1e-5, rngs=rngs))
      pool_after.append(False)
      cin = item
    self.convs, self.bns = nnx.List(convs), nnx.List(bns)
    self.pool_after = tuple(pool_after)
    if self.imagenet_head:
      widths = (7 * 7 * cin, 4096, 4096, num_classes)
    else:
      h, w = pooled_hw(image_shape[0], image_shape[1], sum(self.pool_after))
      widths = (h * w * cin, num_classes)
    self.head = nnx.List([nnx.Linear(a, b, rngs=rngs)
                          for a, b in zip(widths[:-1], widths[1:])])

  def __call__(self, x: jax.Array, train: bool = False,
               stats: BatchStats | None = None) -> jax.Array:
    for module, call in self.pieces():
      x = call(module, x, train, stats)
    return x

  def pieces(self) -> list[tuple[nnx.Module, Callable]]:
    """The model as a sequence (jaxdl.parallel.pipeline.model_stages): each
    convolution (with its batch norm, ReLU and pool), each dense layer of
    the head (the first flattening the map); each called as `call(module,
    x, train, stats)`."""
    def conv(i):
      def call(m, x, train=False, stats=None):
        x = m[0](x)
        if self.bns:
          x = m[1](x, train, stats)
        x = nnx.relu(x)
        return pool_if_wider(x) if self.pool_after[i] else x
      return call

    def dense(i):
      def call(m, x, train=False, stats=None):
        del train, stats  # no batch norm in the head
        if i == 0:
          if self.imagenet_head and x.shape[1:3] != (7, 7):
            x = jax.image.resize(x, (x.shape[0], 7, 7, x.shape[3]), "linear")
          x = x.reshape(x.shape[0], -1)
        x = m(x)
        return nnx.relu(x) if i < len(self.head) - 1 else x
      return call

    convs = [(nnx.List([c, self.bns[i]] if self.bns else [c]), conv(i))
             for i, c in enumerate(self.convs)]
    return [*convs, *[(layer, dense(i)) for i, layer in enumerate(self.head)]]


def vgg11(image_shape, num_classes, stem="imagenet", *, rngs) -> VGG:
  """VGG-11 (configuration A)."""
  return VGG(image_shape, num_classes, "A", False, stem, rngs=rngs)


def vgg11_bn(image_shape, num_classes, stem="imagenet", *, rngs) -> VGG:
  """VGG-11 (configuration A) with batch norm."""
  return VGG(image_shape, num_classes, "A", True, stem, rngs=rngs)


def vgg16(image_shape, num_classes, stem="imagenet", *, rngs) -> VGG:
  """VGG-16 (configuration D)."""
  return VGG(image_shape, num_classes, "D", False, stem, rngs=rngs)


def vgg16_bn(image_shape, num_classes, stem="imagenet", *, rngs) -> VGG:
  """VGG-16 (configuration D) with batch norm."""
  return VGG(image_shape, num_classes, "D", True, stem, rngs=rngs)
