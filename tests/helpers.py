"""Building blocks shared by the algorithm and engine tests."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Sequence

import chex
import jax
import numpy as np
import optax

from jaxdl import algorithms
from jaxdl.config import RunConfig
from jaxdl.data import Streams, WorkerStreams, load_dataset
from jaxdl.models import build_model
from jaxdl.runner import Setup, prepare, setup, with_engine

DIGITS = load_dataset("digits")


class OneWorkerStreams(Streams):
  """A one-worker stream whose batch at each step is rows of another
  stream's training split; any engine takes it (jaxdl.data.Streams).

  `rows(step)` gives the training-set indices of the step's batch; each of
  them weighs 1 / (the batch size): one worker's batch is the global batch.
  """

  def __init__(self, inner: WorkerStreams, batch_size: int, steps_per_epoch: int):
    self.inner, self.split, self.seed = inner, inner.split, inner.seed
    self.in_memory = inner.in_memory
    self.batch_sizes, self.steps_per_epoch = (int(batch_size),), int(steps_per_epoch)

  def rows(self, step: int) -> np.ndarray:
    raise NotImplementedError

  def indices(self, worker: int, step: int) -> np.ndarray:
    self._check_position(worker, step)
    return self.rows(step)

  def batch(self, worker: int, step: int) -> dict[str, np.ndarray]:
    return self.split.gather(self.indices(worker, step))


class ConcatenatedStreams(OneWorkerStreams):
  """One worker whose batch at each step is all of `streams`' workers' batches."""

  def __init__(self, streams: WorkerStreams):
    super().__init__(streams, sum(streams.batch_sizes), streams.steps_per_epoch)

  def rows(self, step):
    return np.concatenate([self.inner.indices(w, step) for w in range(self.inner.num_workers)])


class RoundRobinStreams(OneWorkerStreams):
  """One worker whose step t is worker (t mod M)'s iteration t // M."""

  def __init__(self, streams: WorkerStreams):
    assert len(set(streams.batch_sizes)) == 1, streams.batch_sizes
    super().__init__(streams, streams.batch_sizes[0],
                     streams.steps_per_epoch * streams.num_workers)

  def rows(self, step):
    m = self.inner.num_workers
    return self.inner.indices(step % m, step // m)


class WorkerOfStreams(OneWorkerStreams):
  """Worker `w`'s own batches, as a one-worker stream."""

  def __init__(self, streams: WorkerStreams, w: int):
    super().__init__(streams, streams.batch_sizes[w], streams.steps_per_epoch)
    self.w = w

  def rows(self, step):
    return self.inner.indices(self.w, step)


def zoo_model(run: Setup):
  """The zoo model a run of a config trains, on digits (its own copy)."""
  return build_model(run.config.model.model, DIGITS.num_classes, DIGITS.image_shape)


def make_setup(config: RunConfig, streams=None, total_steps: int = 60) -> Setup:
  """Everything a run of `config` builds, on its data (digits by default),
  for `total_steps` steps unless the config sets --steps."""
  if config.train.steps is None:
    config = config.replace(steps=total_steps)
  return setup(config, streams)


def make_engine(config: RunConfig, streams=None, total_steps: int = 60):
  """The engine `config` names, on its data (digits by default), built as a
  run builds it, for `total_steps` steps unless the config sets --steps."""
  return make_setup(config, streams, total_steps).engine


FIRST_LAYER = "['hidden'][0]"  # the mlp's first dense layer, as jax.tree_util.keystr names it


def frozen_layer_engine(config: RunConfig, layer: str = FIRST_LAYER, total_steps: int = 60):
  """The engine `config` names, its optimizer leaving the parameters under
  `layer` (a prefix of their jax.tree_util.keystr) as they are, as a
  fine-tuning run freezes a layer: optax.multi_transform with set_to_zero
  over them. No worker ever moves them."""
  if config.train.steps is None:
    config = config.replace(steps=total_steps)
  built = prepare(config)
  labels = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, _: "frozen" if jax.tree_util.keystr(path).startswith(layer) else "trained",
      params)
  optimizer = optax.multi_transform({"trained": built.problem.optimizer,
                                     "frozen": optax.set_to_zero()}, labels)
  problem = dataclasses.replace(built.problem, optimizer=optimizer)
  algorithm = algorithms.build(built.spec, built.config.settings(), problem,
                               built.config.algorithm.workers)
  return with_engine(dataclasses.replace(built, algorithm=algorithm, problem=problem)).engine


def frozen_part(params, layer: str = FIRST_LAYER) -> np.ndarray:
  """The parameters under `layer` (see frozen_layer_engine), raveled into one vector."""
  return np.concatenate([np.ravel(x) for path, x in jax.tree_util.tree_leaves_with_path(params)
                         if jax.tree_util.keystr(path).startswith(layer)])


def train(engine, steps: int, key: int = 0, state=None, start: int = 0):
  """(final state, list of per-step metrics as floats): `steps` steps from
  `state` at step `start` (the engine's initial state from `key` unless given)."""
  state = engine.init(jax.random.key(key)) if state is None else state
  history = []
  for t in range(start, start + steps):
    state, metrics = engine.step(state, t)
    history.append({k: float(v) for k, v in jax.device_get(metrics).items()})
  return state, history


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


OPTIMIZERS = {"momentum": dict(optimizer="sgd", lr=0.05, momentum=0.9),
              "adam": dict(optimizer="adam", lr=1e-3),
              "adamw": dict(optimizer="adamw", lr=1e-3, weight_decay=0.1)}


def assert_m_workers_equal_one(algorithm: str, sizes, optimizer: str, model: str = "mlp",
                               steps: int = 20, atol: float = 1e-6, **extra):
  """M workers with batches `sizes` train as one worker on their concatenated
  batches (a synchronous algorithm's defining property); returns the M-worker
  engine."""
  config = RunConfig.make(algorithm=algorithm, workers=len(sizes), batch_sizes=tuple(sizes),
                          model=model, schedule="constant", **OPTIMIZERS[optimizer], **extra)
  many = make_engine(config)
  single = make_engine(config.replace(algorithm="sgd", workers=1, batch_sizes=None, servers=1),
                       streams=ConcatenatedStreams(many.streams))
  a = many.evaluated(train(many, steps)[0])
  b = single.evaluated(train(single, steps)[0])
  chex.assert_trees_all_close(a, b, rtol=1e-5, atol=atol)
  return many


def snapshot(path: Path):
  """What a file holds, or each file's size and mtime under a directory; None if absent."""
  if not path.exists():
    return None
  if path.is_file():
    return path.read_bytes()
  return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(path.rglob("*"))}


def jaxdl_command(*args: str) -> list[str]:
  """The argv of `python -m jaxdl ARGS` that a test may interrupt with SIGINT.

  A process started in the background by a non-interactive shell (as a CI
  script may start the tests) inherits SIGINT ignored, and Python then
  installs no Ctrl-C handler: the command restores it first.
  """
  return [sys.executable, "-c", "import runpy, signal, sys; "
          "signal.signal(signal.SIGINT, signal.default_int_handler); "
          "sys.argv[0] = 'jaxdl'; runpy.run_module('jaxdl', run_name='__main__')", *args]
