"""Building blocks shared by the algorithm and engine tests."""
from __future__ import annotations

import jax
import numpy as np

from jaxdl.algorithms import Problem, resolve
from jaxdl.config import RunConfig, batch_sizes
from jaxdl.data import WorkerStreams, load_dataset
from jaxdl.engines import ENGINES
from jaxdl.models import build_model
from jaxdl.optim import make_optimizer

DIGITS = load_dataset("digits")


class ConcatenatedStreams:
  """One worker whose batch at each step is all of `streams`' workers' batches."""

  def __init__(self, streams: WorkerStreams):
    self.inner = streams
    self.num_workers, self.batch_sizes = 1, (sum(streams.batch_sizes),)

  def stacked_batch(self, step, workers=None):
    images, labels, weights = self.inner.stacked_batch(step)
    real = weights > 0
    return images[real][None], labels[real][None], weights[real][None]


def make_engine(config: RunConfig, streams=None, total_steps: int = 60):
  """The engine `config` names, on digits, ready for `total_steps` steps."""
  streams = streams or WorkerStreams(DIGITS.train, batch_sizes(config), config.train.seed)
  model = build_model(config.model.model, DIGITS.num_classes, DIGITS.image_shape)
  problem = Problem(model, make_optimizer(config.optim, 1000, 40), config.algorithm.sync_bn)
  algorithm, engine = resolve(config)
  return ENGINES.get(engine)(algorithm, problem, streams, config, total_steps)


def train(engine, steps: int, key: int = 0):
  """(final state, list of per-step metrics as floats)."""
  state = engine.init(jax.random.key(key))
  history = []
  for t in range(steps):
    state, metrics = engine.step(state, t)
    history.append({k: float(v) for k, v in jax.device_get(metrics).items()})
  return state, history


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]
