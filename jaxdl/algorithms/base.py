"""What every algorithm trains (`Problem`), on what (`Batch`), and its registry entry."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from jaxdl.algorithms import compression
from jaxdl.algorithms.collectives import WorkerAxis
from jaxdl.algorithms.families import Centralized, Elastic
from jaxdl.errors import TaskError
from jaxdl.models.layers import BatchStats
from jaxdl.settings import Settings
from jaxdl.task import Task

Metrics = dict[str, jax.Array]


class Batch(NamedTuple):
  """One worker's batch, padded to the largest worker's batch size."""
  fields: dict[str, jax.Array]  # the task's data, each B x ...
  weights: jax.Array  # B, float32: 1/B_global for real examples, 0 for padding
  ids: jax.Array      # (2,) int32: (worker, the worker's step), which the loss's key is of

  @property
  def mask(self) -> jax.Array:
    return (self.weights > 0).astype(jnp.float32)


class TrainState(NamedTuple):
  """One model's training state."""
  params: Any
  model_state: Any      # e.g. batch-norm statistics
  opt_state: optax.OptState


class _Given(NamedTuple):
  key: Any            # the key being traced
  tasks: list[Task]   # the tasks whose model from that key was asked for
  models: Sequence    # models[i]: tasks[i]'s (params, model_state) from that key, if given


_GIVEN: contextvars.ContextVar[_Given | None] = contextvars.ContextVar("given", default=None)


@contextlib.contextmanager
def models_given(key, tasks: list[Task], models: Sequence = ()):
  """While a function of `key` is traced: `Problem.init_model(key)` (and
  `init_state(key)`) returns ``models[i]`` for ``tasks[i]`` instead of
  tracing the task's initializer; a task without a model given is traced as
  usual and appended to `tasks`. A key derived from `key` is another key:
  its model is traced."""
  token = _GIVEN.set(_Given(key, tasks, models))
  try:
    yield
  finally:
    _GIVEN.reset(token)


@dataclasses.dataclass(frozen=True)
class Problem:
  """What every algorithm trains: a task with an optax update rule.

  Losses are weighted sums: a worker's loss counts as its share b_m / B of
  the global batch, so summing gradients over workers gives the gradient of
  the global batch's mean loss (Choi's weighted aggregation), and padded
  examples (weight 0) count for nothing. A task's loss is its batch's mean
  times the share, or, for a `weighted` task, its own weighted sum.

  Attributes:
    task: the model, loss, data and evaluation (jaxdl.task.Task).
    optimizer: the run's optax rule, which every algorithm's update applies.
    sync_bn: batch-norm statistics over all workers' batches (a collective
      algorithm's).
    async_bn: a worker's batch-norm state holds its last batch's statistics,
      which a server averages (Async-BN).
    seed: the loss's keys derive from it.
    compress: NAME[:ARG] of what a worker's outgoing message goes through,
      with error feedback ("none": nothing).
    compress_pull: NAME[:ARG] of what a parameter server's reply goes
      through, with the server's own error feedback.
  """
  task: Task
  optimizer: optax.GradientTransformation
  sync_bn: bool = False  # batch-norm statistics over all workers' batches
  # Async-BN: a worker's batch-norm state holds its last batch's statistics
  # (momentum 0), which the server averages (jaxdl.algorithms.async_bn).
  async_bn: bool = False
  seed: int = 0          # the loss's keys derive from it
  # --compress: what a worker's outgoing message (a gradient or a model
  # difference) goes through, with error feedback (jaxdl.algorithms.compression)
  compress: str = "none"
  # --compress-pull: what a parameter server's reply goes through, with its
  # own error feedback (jaxdl.algorithms.asp)
  compress_pull: str = "none"

  def init_model(self, key: jax.Array):
    """(params, model_state) of a fresh model: ``task.init(key)``, or, while
    an engine compiles its initial state (`models_given`), that model as
    computed by a program of its own."""
    given = _GIVEN.get()
    if given is None or key is not given.key:
      return self.task.init(key)
    i = next((i for i, t in enumerate(given.tasks) if t is self.task), len(given.tasks))
    if i < len(given.models):
      return given.models[i]
    if i == len(given.tasks):
      given.tasks.append(self.task)
    return self.task.init(key)

  def model_bytes(self) -> int:
    """Bytes of one copy of the parameters (what a push or a pull moves)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self._param_shapes()))

  def _param_shapes(self):
    return self.task.init_shapes()[0]

  @property
  def compresses(self) -> bool:
    """Whether a worker's messages are compressed (--compress other than none)."""
    return compression.parse_compress(self.compress).name != "none"

  def message_bytes(self) -> int:
    """Bytes of one worker's message shaped like the parameters, compressed by
    --compress (values plus indices, norms, scales: `compression.message_bytes`);
    the model's bytes with none."""
    return compression.message_bytes(self.compress, self._param_shapes())

  def init_outbox(self, params, worker) -> Any:
    """Worker `worker`'s compression state for messages shaped like `params`:
    its error-feedback residual, PowerSGD's Q and its key (the worker's own
    draws); an empty state with --compress none. It is part of the worker's
    state, so it is checkpointed and resumed with it."""
    state = compression.compression(self.compress, seed=self.seed).init(params)
    return compression.for_worker(state, worker)

  def compress_message(self, message, outbox) -> tuple[Any, Any]:
    """(what the worker sends, its new outbox): C(message + e), keeping
    e <- message + e - C(message + e); the message itself with none."""
    return compression.compression(self.compress, seed=self.seed).update(message, outbox)

  def encode_message(self, message, outbox) -> tuple[Any, Any]:
    """`compress_message`'s step as the message travels: (its payload, the
    new outbox); `decode_message` gives what `compress_message` sends, bit
    for bit. The message itself with none."""
    return compression.encoded(self.compress, message, outbox)

  def decode_message(self, payload, like):
    """The values a payload of `encode_message` stands for, shaped like `like`."""
    return compression.decode(self.compress, payload, like)

  @property
  def compresses_pull(self) -> bool:
    """Whether a parameter server's replies are compressed (--compress-pull)."""
    return compression.parse_compress(self.compress_pull, "compress_pull").name != "none"

  def pull_bytes(self) -> int:
    """Bytes of a parameter server's reply: compressed by --compress-pull, or
    the model's."""
    return compression.message_bytes(self.compress_pull, self._param_shapes())

  def init_inbox(self, params, worker) -> Any:
    """The compression state of the server's replies to worker `worker`
    (--compress-pull): PowerSGD's Q and the key of its draws (its own, not
    those of the worker's pushes); no residual (jaxdl.algorithms.asp: what
    a reply left out stays in the difference from the worker's copy)."""
    state = compression.compression(self.compress_pull, seed=self.seed,
                                    error_feedback=False).init(params)
    if not isinstance(state, compression.CompressionState):
      return state
    key = jax.random.fold_in(jax.random.fold_in(jax.random.wrap_key_data(state.key), worker), 1)
    return state._replace(key=jax.random.key_data(key))

  def init_state(self, key: jax.Array) -> TrainState:
    params, model_state = self.init_model(key)
    return TrainState(params, model_state, self.optimizer.init(params))

  def batch_key(self, ids: jax.Array) -> jax.Array:
    """The loss's key for a worker's step: a function of (seed, worker, step)."""
    key = jax.random.fold_in(jax.random.key(self.seed), 1)  # 0: initialisation
    return jax.random.fold_in(jax.random.fold_in(key, ids[0]), ids[1])

  def task_loss(self, params, model_state, batch: Batch, axis: WorkerAxis):
    """The task's own loss on the batch: (loss, (model state, metrics))."""
    fields = dict(batch.fields)
    kwargs = {}
    if self.task.weighted:
      fields["weight"] = batch.weights
    if self.task.batch_stats:
      kwargs["stats"] = BatchStats(mask=batch.mask,
                                   psum=axis.psum if self.sync_bn else None,
                                   momentum=0.0 if self.async_bn else None)
    return self.task.loss(params, model_state, fields, self.batch_key(batch.ids), **kwargs)

  def check_task(self, streams) -> None:
    """Traces the task's loss on a batch of its data (abstractly: nothing
    runs) and raises a TaskError for a loss that reads a field the data do
    not have, or does not return ``(scalar, (model_state, metrics))`` with
    scalar metrics."""
    task = self.task
    fields, weights, ids = streams.stacked_batches([(0, 0)])
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype),
                         Batch(fields, weights, ids))
    params, model_state = task.init_shapes()
    try:
      out = jax.eval_shape(lambda p, s, b: self.task_loss(p, s, b, WorkerAxis(1)), params,
                           model_state, batch)
    except KeyError as e:
      have = sorted(fields) + (["weight"] if task.weighted else [])
      raise TaskError(task.name, "loss", f"a loss that reads only the batch's fields "
                      f"({', '.join(have)}); it read {e}") from None
    ok = (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], tuple)
          and len(out[1]) == 2 and isinstance(out[1][1], Mapping))
    if not ok:
      raise TaskError(task.name, "loss", "a loss that returns (loss, (model_state, "
                      f"metrics)); it returned {jax.tree.structure(out)}")
    shape = lambda x: getattr(x, "shape", type(x).__name__)
    if shape(out[0]) != ():
      raise TaskError(task.name, "loss", "a loss that returns a scalar, the batch's mean; "
                      f"it returned shape {shape(out[0])}")
    for name, value in out[1][1].items():
      if shape(value) != ():
        raise TaskError(task.name, "loss", f"scalar metrics; metric {name!r} has shape "
                        f"{shape(value)}")

  def _loss(self, params, model_state, batch: Batch, axis: WorkerAxis, share: bool):
    loss, (model_state, metrics) = self.task_loss(params, model_state, batch, axis)
    metrics = {**metrics, "loss": loss}
    if share and not self.task.weighted:  # the mean times this worker's share
      weight = batch.weights.sum()
      loss, metrics = loss * weight, {k: v * weight for k, v in metrics.items()}
    return loss, (model_state, metrics)

  def gradients(self, params, model_state, batch: Batch, axis: WorkerAxis):
    """This worker's share of the global gradient -> (grads, model state, metrics).

    Metrics are shares too: their sum over workers is the global batch's mean.
    """
    grad_fn = jax.grad(self._loss, has_aux=True)
    grads, (model_state, metrics) = grad_fn(params, model_state, batch, axis, True)
    return grads, model_state, metrics

  def own_gradients(self, params, model_state, batch: Batch):
    """A lone worker's mean gradient on its own batch -> (grads, model state,
    metric shares). Asynchronous workers share no collective."""
    if not self.task.weighted:
      grad_fn = jax.grad(self._loss, has_aux=True)
      grads, (model_state, metrics) = grad_fn(params, model_state, batch, WorkerAxis(1), False)
      share = batch.weights.sum()
      return grads, model_state, {k: v * share for k, v in metrics.items()}
    grads, model_state, metrics = self.gradients(params, model_state, batch, WorkerAxis(1))
    share = batch.weights.sum()  # b_m / B
    return jax.tree.map(lambda g: g / share, grads), model_state, metrics

  def apply_gradients(self, state: TrainState, grads, model_state) -> TrainState:
    """`state` one optimizer step on; a state with more fields than a
    TrainState's (a worker's outbox) keeps them."""
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    return state._replace(params=optax.apply_updates(state.params, updates),
                          model_state=model_state, opt_state=opt_state)


def mean_over_workers(stacked, weights: jax.Array | None = None):
  """The mean of a pytree stacked over workers (leading axis M), weighted by
  `weights` (M, summing to 1; None: equally), taken as worker 0's leaf plus
  the mean of the differences from it: where every worker holds the same
  value, the mean is that value bit for bit. (A plain mean is not: the
  jnp.mean of three equal float32 values is another value for 32% of them.)"""
  def mean(x):
    differences = x - x[0]
    if weights is None:
      return x[0] + jnp.mean(differences, axis=0)
    return x[0] + jnp.tensordot(weights, differences, axes=1)
  return jax.tree.map(mean, stacked)


def server_evaluated(server, workers):
  """The evaluated model of a server-based algorithm: the server's parameters
  with the workers' mean batch-norm statistics."""
  return server.params, mean_over_workers(workers.model_state)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """A registry entry: an algorithm's name, settings and factory.

  `build(settings, problem, num_workers)` returns the algorithm's family record (a
  `jaxdl.algorithms.families` record of pure functions closed over the
  settings). `settings` is a `jaxdl.settings.Settings` dataclass: its fields
  become flat `jaxdl run` flags, `jaxdl list` rows and compare labels.
  `check(settings, config)` raises a ConfigError for settings of other
  sections that the algorithm cannot run with (e.g. bsp's server shards).
  `optim_defaults(num_workers)` gives values for the optimizer section's
  fields the user leaves unset (optimizer, lr, momentum, weight_decay;
  jaxdl.optim.with_defaults: a recipe that names an optimizer holds only
  for it), with `optim_rule` saying how, for `jaxdl list` and the docs.
  `server` says whether it keeps a parameter server that --servers shards
  (unset: a centralized or elastic family does). `reduces_to` names the
  algorithm whose run it is, bit for bit, when its staleness bound never
  binds (ssp: asp): the report names the cells where that happened.
  The engines that can run it are those that declare its family.

  Attributes:
    name: the --algorithm name.
    doc: one line for `jaxdl list`.
    family: the record `build` returns (Collective, Centralized, ...).
    build: ``(settings, problem, num_workers) -> family record``.
    settings: its Settings dataclass (each field a flag, with its range).
    max_workers: the most workers it runs (None: no limit).
    check: ``(settings, config) -> None``, raising a ConfigError.
    optim_defaults: ``num_workers -> {field: value}`` for the unset
      optimizer fields (None: jaxdl.optim's defaults).
    optim_rule: how `optim_defaults` chooses, in words.
    server: whether --servers shards it (None: by its family).
    reduces_to: the algorithm it runs as when its staleness bound never
      binds (None: it has no such bound).
  """
  name: str
  doc: str
  family: type
  build: Callable[[Any, Problem, int], Any]
  settings: type = Settings
  max_workers: int | None = None
  check: Callable[[Any, Any], None] | None = None
  optim_defaults: Callable[[int], dict] | None = None
  optim_rule: str = ""
  server: bool | None = None
  reduces_to: str | None = None

  @property
  def has_server(self) -> bool:
    return self.server if self.server is not None else self.family in (Centralized, Elastic)
