"""The model zoo: models found by name, built as pure init/apply `Model`s."""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax

from jaxdl.errors import ConfigError
from jaxdl.models import resnet, simple, transformer, vgg, vit
from jaxdl.models.base import Model, from_nnx, with_compute_dtype
from jaxdl.registry import Registry

__all__ = ["COMPUTE_DTYPES", "MODELS", "TEXT_MODELS", "Model", "build_model",
           "check_compute_dtype", "check_model", "count_params", "with_compute_dtype"]

# An entry builds an NNX module: entry(image_shape, num_classes, stem, rngs=...).
Builder = Callable[..., Any]
MODELS: Registry[Builder] = Registry("model")

# An entry builds an NNX language model: entry(vocab_size, context, rngs=...),
# called on tokens (B, T) for logits (B, T, vocab_size).
TEXT_MODELS: Registry[Builder] = Registry("model")
TEXT_MODELS.register("transformer", "Character-level transformer: 2 pre-norm blocks, "
                     "width 64, 4 heads, learned positions (text datasets).")(
    transformer.CharTransformer)

STEMS = ("auto", "cifar", "imagenet")
COMPUTE_DTYPES = ("float32", "bfloat16")
_IMAGENET_MIN_SIDE = 128  # "auto" picks the ImageNet stem from this side up


def _stemless(cls) -> Builder:
  def build(image_shape, num_classes, stem, *, rngs):
    del stem  # one layout for every image size
    return cls(image_shape, num_classes, rngs=rngs)
  return build


MODELS.register("mlp", "Multilayer perceptron, hidden layers 256 and 128.")(
    _stemless(simple.MLP))
MODELS.register("cnn", "Small CNN: two 3x3 convs (32, 64), dense 128.")(
    _stemless(simple.CNN))
MODELS.register("cnn_bn", "The small CNN with batch norm after each conv.")(
    _stemless(functools.partial(simple.CNN, batch_norm=True)))
MODELS.register("resnet18", "ResNet-18, basic blocks (He et al. 2016).")(
    resnet.resnet18)
MODELS.register("resnet34", "ResNet-34, basic blocks (He et al. 2016).")(
    resnet.resnet34)
MODELS.register("resnet50", "ResNet-50, bottleneck blocks (He et al. 2016).")(
    resnet.resnet50)
MODELS.register("vgg11", "VGG-11, configuration A (Simonyan & Zisserman 2015).")(
    vgg.vgg11)
MODELS.register("vgg11_bn", "VGG-11 with batch norm after each conv.")(
    vgg.vgg11_bn)
MODELS.register("vgg16", "VGG-16, configuration D (Simonyan & Zisserman 2015).")(
    vgg.vgg16)
MODELS.register("vgg16_bn", "VGG-16 with batch norm after each conv.")(
    vgg.vgg16_bn)
MODELS.register("vit", "Vision transformer (Dosovitskiy et al. 2021), small: patches of 4 "
                "px (images below 128 px) or 16 px, width 64, 4 pre-norm blocks of 4 heads, "
                "mean-pooled tokens.")(_stemless(vit.ViT))


def resolve_stem(stem: str, image_shape: tuple[int, int, int]) -> str:
  """Turns "auto" into "imagenet" for images at least 128 on a side, else "cifar"."""
  if stem not in STEMS:
    raise ConfigError("stem", stem, "one of " + ", ".join(STEMS))
  if stem != "auto":
    return stem
  return "imagenet" if min(image_shape[:2]) >= _IMAGENET_MIN_SIDE else "cifar"


def check_model(name: str) -> None:
  """Raises the ConfigError for a name that is neither an image nor a text model."""
  if name not in MODELS and name not in TEXT_MODELS:
    raise ConfigError("model", name, "one of " + ", ".join(MODELS.names() + TEXT_MODELS.names()))


def check_compute_dtype(dtype: str, model: str | None = None) -> None:
  """Raises the ConfigError for a dtype the models do not compute in, or for
  bfloat16 with a text model (`model`)."""
  if dtype not in COMPUTE_DTYPES:
    raise ConfigError("compute_dtype", dtype, "one of " + ", ".join(COMPUTE_DTYPES))
  if dtype != "float32" and model in TEXT_MODELS:
    raise ConfigError("compute_dtype", dtype, "float32 for a text model "
                      "(bfloat16 is for the zoo's image models)")


def build_model(name: str, num_classes: int, image_shape: tuple[int, int, int],
                stem: str = "auto", compute_dtype: str = "float32") -> Model:
  """Builds the registered model ``name`` for HxWxC images and ``num_classes``,
  computing in ``compute_dtype`` (`with_compute_dtype`)."""
  check_compute_dtype(compute_dtype)
  entry = MODELS.get(name)
  image_shape = tuple(int(d) for d in image_shape)
  if image_shape[:2] == (1, 1) and name != "mlp":
    raise ConfigError("model", name, "mlp: the data are N x D feature vectors, "
                      "which the image models cannot take")
  stem = resolve_stem(stem, image_shape)
  build = functools.partial(entry, image_shape, num_classes, stem)
  return with_compute_dtype(from_nnx(name, lambda rngs: build(rngs=rngs), num_classes,
                                     image_shape), compute_dtype)


def count_params(model: Model | Callable) -> int:
  """Trainable parameters of a model (or of an init function ``key ->
  (params, model_state)``), from shapes alone: nothing is allocated."""
  params, _ = jax.eval_shape(getattr(model, "init", model), jax.random.key(0))
  return sum(math.prod(p.shape) for p in jax.tree.leaves(params))
