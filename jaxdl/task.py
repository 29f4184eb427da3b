"""What is trained: a task is a model's initialisation, a loss, data and an
evaluation, as a value a script builds and passes to ``jaxdl.run(task=...)``.

Image classification on a named dataset and model (`classification`, what
``--dataset`` and ``--model`` choose) is one task among others. A script's own
task needs no registration::

    task = jaxdl.Task(init=init, loss=loss, train={"x": x, "y": y},
                      test={"x": x_test, "y": y_test}, name="regression")
    jaxdl.run(task=task, algorithm="asp", workers=4, steps=200)

Every algorithm calls the task's loss on a worker's batch, a dict of the
data's fields; with `weighted` it also reads ``batch["weight"]``. Flax
modules become `init`/`apply` pairs with `from_linen` and `from_nnx`.
"""
from __future__ import annotations

import dataclasses
import functools
from importlib import metadata
from typing import Any, Callable, Hashable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdl.data.fields import Data, FunctionData, ImageFields, IterableData, to_data
from jaxdl.errors import TaskError
from jaxdl.models import TEXT_MODELS
from jaxdl.models.base import nnx_functions
from jaxdl.registry import Registry

__all__ = ["TASKS", "Data", "FunctionData", "IterableData", "Task", "classification",
           "from_linen", "from_nnx", "language_model", "registered", "task_names"]

Fields = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Task:
  """A training task.

  Attributes:
    init: ``key -> (params, model_state)``; model_state holds what is not
      trained (batch-norm statistics), ``{}`` if nothing. Both are pytrees.
    loss: ``(params, model_state, batch, key) -> (loss, (model_state,
      metrics))``: the mean loss over the batch's examples (a scalar), the
      model state after the batch, and named scalar means (may be ``{}``).
      ``batch`` is a dict of the data's fields, one row per example; ``key``
      is a PRNG key of this worker and batch (dropout), the same on every
      engine and after a resume.
    train: the training data: a dict of arrays with one leading example axis
      (each worker reads its own shard, reshuffled each epoch); a
      `FunctionData` (a function of worker, step and seed); or an
      `IterableData` (global batches in order, e.g. a ``tf.data`` dataset or
      a grain loader), which a bare iterable is taken as. None: the task
      computes on batches given otherwise (a benchmark's).
    test: the test data, a dict of arrays (None: no evaluation).
    evaluate: ``(params, model_state, batch) -> metrics``, named scalar means
      over the batch; the summary reports each as ``test_<name>``. None: the
      loss, as ``test_loss``.
    target: the evaluated metric that time to target is measured on.
    higher_is_better: whether a larger `target` is better (accuracy) or a
      smaller one (a loss).
    name: how the run directory, summary and compare tables name the task.
    weighted: the loss reads ``batch["weight"]``, each example's weight in
      the global batch (1/B for a real example, 0 for padding), and returns
      the weighted sum: its share of the global batch's mean loss; metrics
      are shares too. Needed for unequal batch sizes (``--batch-sizes``,
      ``--worker-speeds``), whose smaller batches are padded.
    batch_stats: the loss takes ``stats=``, a `jaxdl.models.layers.BatchStats`
      (``--sync-bn``, ``--async-bn``).
    info: figures of the task for the summary (e.g. a baseline).
    derived: further test metrics from the averaged ones, e.g. perplexity
      from nats per character (a mean of exponentials is not one).
  """
  init: Callable[[jax.Array], tuple[Any, Any]]
  loss: Callable[..., tuple[jax.Array, tuple[Any, Metrics]]]
  train: Any = None
  test: Any = None
  evaluate: Callable[[Any, Any, Fields], Metrics] | None = None
  target: str = "loss"
  higher_is_better: bool = False
  name: str = "custom"
  weighted: bool = False
  batch_stats: bool = False
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  derived: Callable[[dict[str, float]], dict[str, float]] | None = None

  def __post_init__(self):
    for field in ("init", "loss"):
      if not callable(getattr(self, field)):
        raise TaskError(self.name, field, f"a function; it is "
                        f"{type(getattr(self, field)).__name__}")
    if self.train is not None:
      object.__setattr__(self, "train", to_data(self.train, self.name, "train data"))
    if self.test is not None:
      test = to_data(self.test, self.name, "test data")
      if not hasattr(test, "gather"):
        raise TaskError(self.name, "test data", "a dict of arrays (evaluation reads it "
                        f"in order); got {type(self.test).__name__}")
      object.__setattr__(self, "test", test)

  def init_shapes(self):
    """``init``'s (params, model_state) as shapes and dtypes (nothing
    allocated): traced once per initializer, however many parts of a run
    ask (tracing builds the model: tens of ms even for the mlp)."""
    if not isinstance(self.init, Hashable):  # e.g. an instance of a mutable dataclass
      return jax.eval_shape(self.init, jax.random.key(0))
    return _abstract(self.init)

  def evaluation(self, params, model_state, batch: Fields) -> Metrics:
    """The evaluated metrics of one test batch (means over its examples)."""
    if self.evaluate is not None:
      return dict(self.evaluate(params, model_state, batch))
    batch = dict(batch)
    if self.weighted:
      size = jax.tree.leaves(batch)[0].shape[0]
      batch["weight"] = jnp.full((size,), 1.0 / size, jnp.float32)
    loss, _ = self.loss(params, model_state, batch, jax.random.key(0))
    return {"loss": loss}

  @property
  def target_metric(self) -> str:
    """The summary's name of the target metric."""
    return f"test_{self.target}"


@functools.lru_cache(maxsize=8)
def _abstract(init):
  return jax.eval_shape(init, jax.random.key(0))


def weighted_cross_entropy(logits_BxK, labels_B, weights_B) -> jax.Array:
  """Each example's softmax cross-entropy, weighted and summed: a batch's
  share of the global batch's mean loss."""
  losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxK, labels_B)
  return jnp.sum(losses_B * weights_B)


def classification(model, dataset=None) -> Task:
  """Image classification: softmax cross-entropy of a zoo `Model` on a `Dataset`
  (None: on batches given otherwise), evaluated by accuracy (and loss)."""
  def loss(params, model_state, batch, key, stats=None):
    del key  # the zoo's models are deterministic
    logits_BxK, model_state = model.apply(params, model_state, batch["image"], True, stats)
    # Only the loss: accuracy comes from evaluation, and an argmax in every
    # step costs small models ~10% (bench/ar_sgd_step.py).
    return weighted_cross_entropy(logits_BxK, batch["label"], batch["weight"]), (model_state, {})

  def evaluate(params, model_state, batch):
    logits_BxK, _ = model.apply(params, model_state, batch["image"], False)
    losses_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxK, batch["label"])
    return {"accuracy": jnp.mean(jnp.argmax(logits_BxK, -1) == batch["label"]),
            "loss": jnp.mean(losses_B)}

  data = dataset and (ImageFields(dataset.train), ImageFields(dataset.test))
  return Task(init=model.init, loss=loss, train=data and data[0], test=data and data[1],
              evaluate=evaluate, target="accuracy", higher_is_better=True,
              name=f"{dataset.name if dataset else 'images'}/{model.name}", weighted=True,
              batch_stats=True)


def language_model(dataset, model: str = "transformer") -> Task:
  """Next-character prediction on a `TextDataset` with a text model
  (jaxdl.models.TEXT_MODELS), reported in nats per character and perplexity,
  with the unigram baseline in the summary."""
  build = TEXT_MODELS.get(model)
  init, apply = from_nnx(lambda rngs: build(len(dataset.vocab), dataset.context, rngs=rngs))

  def nats(params, model_state, tokens):
    logits, model_state = apply(params, model_state, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]), model_state

  def loss(params, model_state, batch, key):
    del key  # no dropout
    nats_BxT, model_state = nats(params, model_state, batch["tokens"])
    return jnp.sum(nats_BxT.mean(-1) * batch["weight"]), (model_state, {})

  def evaluate(params, model_state, batch):
    return {"nats_per_char": jnp.mean(nats(params, model_state, batch["tokens"])[0])}

  unigram = dataset.unigram_nats_per_char
  return Task(init=init, loss=loss, evaluate=evaluate, train=dataset.train, test=dataset.test,
              target="nats_per_char", higher_is_better=False, name=f"{dataset.name}/{model}",
              weighted=True, info={"unigram_nats_per_char": unigram,
                                   "unigram_perplexity": float(np.exp(unigram))},
              derived=lambda m: {"perplexity": float(np.exp(m["nats_per_char"]))})


def from_linen(module, *example, **kwargs) -> tuple[Callable, Callable]:
  """A Flax Linen module as ``(init, apply)``.

  ``init(key) -> (params, model_state)`` calls ``module.init`` on `example`
  (arrays of one batch: only their shapes matter); model_state holds the
  collections other than "params" (e.g. "batch_stats"). ``apply(params,
  model_state, *args, **kwargs) -> (output, model_state)`` calls
  ``module.apply``, the other collections mutable; a `train`-style keyword
  is the caller's to pass.
  """
  def init(key):
    variables = dict(module.init(key, *example, **kwargs))
    params = variables.pop("params", {})
    return params, variables

  def apply(params, model_state, *args, **call_kwargs):
    variables = {"params": params, **model_state}
    if not model_state:
      return module.apply(variables, *args, **call_kwargs), model_state
    out, updated = module.apply(variables, *args, mutable=list(model_state), **call_kwargs)
    return out, {**model_state, **updated}

  return init, apply


def from_nnx(build: Callable[..., Any]) -> tuple[Callable, Callable]:
  """A Flax NNX module as ``(init, apply)``; ``build(rngs)`` makes the module.

  ``init(key) -> (params, model_state)``: the module's ``nnx.Param``
  variables and the rest of its state, as pure dicts. ``apply(params,
  model_state, *args, **kwargs) -> (output, model_state)`` calls the module
  on a copy rebuilt from them and returns the state it leaves.
  """
  return nnx_functions(build)


TASKS: Registry[Callable[[], Task]] = Registry("dataset")
"""Tasks that the command line runs by name (``--dataset task:NAME``): each a
factory of no arguments that returns the `Task`. A module registers its own
(``TASKS.register("regression")(make_task)``); an installed package adds its
through the entry-point group "jaxdl.tasks" (``NAME = "package.module:make_task"``)."""
ENTRY_POINTS = "jaxdl.tasks"


def task_names() -> list[str]:
  """The registered tasks' names and those of installed packages (not imported)."""
  installed = [e.name for e in metadata.entry_points(group=ENTRY_POINTS)]
  return list(dict.fromkeys(TASKS.names() + installed))


def registered(name: str) -> Task:
  """The registered task `name` (one of `task_names()`), built; an installed
  package's is imported now."""
  if name not in TASKS:
    for entry in metadata.entry_points(group=ENTRY_POINTS, name=name):
      TASKS.register(name)(entry.load())
  task = TASKS.get(name)()
  if not isinstance(task, Task) or task.name != name:
    raise TaskError(name, "factory", f"a function that returns a Task named {name!r}")
  return task
