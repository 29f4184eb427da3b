"""What a run builds from its config before any engine: the task, data
streams, algorithm and update rule. The runner adds the engine; each process
of a real engine builds these parts itself."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from jaxdl import algorithms
from jaxdl.algorithms import AlgorithmSpec, Centralized, Problem, Family
from jaxdl.config import TASK_PREFIX, RunConfig
from jaxdl.data import Streams, TextDataset, check_workers, load_dataset, make_streams
from jaxdl.engines import base as engines_base
from jaxdl.errors import ConfigError, TaskError
from jaxdl.models import MODELS, TEXT_MODELS, build_model
from jaxdl.optim import make_optimizer
from jaxdl.parallel.pipeline import pipeline_task
from jaxdl.parallel.tensor import tensor_task
from jaxdl.task import Task, classification, language_model, registered, task_names
from jaxdl.validation import INT_LIMIT, Plan, check_target, validate

if TYPE_CHECKING:
  from jaxdl.engines import Engine


@dataclasses.dataclass
class Setup:
  """Everything a run builds from its config before training starts."""
  config: RunConfig
  task: Task
  streams: Streams
  spec: AlgorithmSpec
  algorithm: Family
  problem: Problem
  engine: Engine | None  # None from `prepare`: the parts a process of a real engine needs
  total_steps: int
  global_batch: int
  engine_name: str


def build_task(config: RunConfig) -> Task:
  """The task of the config's --dataset and --model: image classification,
  or a language model on a text dataset."""
  data, name = config.data, config.model.model
  dataset = load_dataset(data.dataset, data_dir=data.data_dir, image_size=data.image_size)
  text = isinstance(dataset, TextDataset)
  if text != (name in TEXT_MODELS):
    kind, names = ("a text model", TEXT_MODELS.names()) if text else ("an image model",
                                                                       MODELS.names())
    raise ConfigError("model", name, f"{kind} for --dataset {data.dataset}: "
                      + ", ".join(names))
  if text:
    return language_model(dataset, name)
  if config.model.parallelism == "pipeline":
    m = config.model
    return pipeline_task(name, dataset, m.stem, m.stages, m.microbatches, m.pipeline_schedule)
  model = build_model(name, dataset.num_classes, dataset.image_shape, config.model.stem,
                      config.model.compute_dtype)
  if config.model.parallelism == "tensor":
    return tensor_task(classification(model, dataset), name)
  return classification(model, dataset)


TASK_FIELDS = ("dataset", "data_dir", "image_size", "model", "stem", "compute_dtype")
"""Config fields that a script's task replaces: they stay unset with one."""


def resolve_task(config: RunConfig, task: Task | None) -> tuple[RunConfig, Task | None]:
  """(config, task): a script's own `task`, or the registered one that
  --dataset task:NAME names, with --dataset and --model naming it; `task`
  None for a dataset and model of the zoo. A ConfigError for an unknown
  task:NAME, or a task with a field it replaces set."""
  dataset = config.data.dataset
  if task is None and dataset.startswith(TASK_PREFIX):
    if dataset[len(TASK_PREFIX):] not in task_names():
      raise ConfigError("dataset", dataset, "a name from `jaxdl list`: task:NAME is a "
                        "script's own task, which only its script can run (jaxdl.run(config, "
                        "task=...)), unless registered (jaxdl.task.TASKS)")
    task = registered(dataset[len(TASK_PREFIX):])
  if task is None:
    return config, None
  name = TASK_PREFIX + task.name
  defaults, flat = RunConfig().flat(), config.flat()
  for field in TASK_FIELDS:
    if flat[field] not in (defaults[field], name):
      raise ConfigError(field, flat[field], f"left unset: task {task.name!r} brings its own "
                        "data and model")
  return config.replace(dataset=name, model=name), task


def prepare(config: RunConfig, streams: Streams | None = None,
            task: Task | None = None) -> Setup:
  """`setup` without the engine: what each process of a real engine builds
  for itself from the config (and a script's task).

  Args:
    config: the run's config (validated here).
    streams: every worker's data stream, in place of the task's (tests).
    task: a script's own task, in place of --dataset and --model.

  Returns:
    The Setup, its `engine` None.
  """
  config, task = resolve_task(config, task)
  return assemble(validate(config), task, streams)


def assemble(plan: Plan, task: Task | None = None, streams: Streams | None = None) -> Setup:
  """The Setup of a validated config (`plan`, of a config whose task is
  resolved: `resolve_task`), its `engine` None."""
  config, spec = plan.config, plan.spec
  task = task or build_task(config)
  check_target(config.train.target_accuracy, task.target_metric, "target_accuracy")
  sliced = config.cluster.partition != "static"  # the split of B changes during the run
  if streams is None:
    check_workers(task.train, config.algorithm.workers)
  streams = streams or make_streams(task.train, plan.batch_sizes, config.train.seed,
                                    task.name, sliced)
  if (len(set(streams.batch_sizes)) > 1 or sliced) and not task.weighted:
    raise TaskError(task.name, "loss", "a weighted loss (Task(weighted=True), reading "
                    f"batch['weight']) for unequal batch sizes {list(streams.batch_sizes)} "
                    f"(--partition {config.cluster.partition}): smaller batches are padded")
  if (config.algorithm.sync_bn or config.algorithm.async_bn) and not task.batch_stats:
    flag = "sync_bn" if config.algorithm.sync_bn else "async_bn"
    raise ConfigError(flag, True, f"left unset: task {task.name!r} has no batch norm that "
                      "takes stats (Task(batch_stats=True))")
  # Epochs count the samples of all workers together: an epoch is the number
  # of steps in which the workers, each through its own shard, see the
  # training set once.
  total = config.train.steps or max(1, round(config.train.epochs * streams.steps_per_epoch))
  if total >= INT_LIMIT:
    raise ConfigError("epochs", config.train.epochs, f"fewer than {INT_LIMIT:,} steps of "
                      f"{streams.steps_per_epoch} an epoch (JAX counts them in int32)")
  # A parameter server's optimizer updates once per push, M times a step
  # (exactly, with equal batch sizes; a step is B samples, jaxdl.trace).
  m = config.algorithm.workers
  per_step = m if spec.family is Centralized else 1
  optimizer = make_optimizer(plan.optim, total, streams.steps_per_epoch, per_step)
  problem = Problem(task, optimizer, sync_bn=config.algorithm.sync_bn,
                    async_bn=config.algorithm.async_bn, seed=config.train.seed,
                    compress=config.algorithm.compress,
                    compress_pull=config.algorithm.compress_pull)
  problem.check_task(streams)
  algorithm = algorithms.build(spec, config.settings(), problem, config.algorithm.workers,
                               config.algorithm.bn_decay if config.algorithm.async_bn else None)
  return Setup(config, task, streams, spec, algorithm, problem, None, total,
               sum(streams.batch_sizes), plan.engine)


engines_base.set_setup_builder(prepare)  # for the processes a real engine starts
