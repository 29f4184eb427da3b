"""Building blocks shared by the algorithm and engine tests."""
from __future__ import annotations

import jax
import numpy as np

from jaxdl.config import RunConfig
from jaxdl.data import WorkerStreams, load_dataset
from jaxdl.runner import setup

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
  """The engine `config` names, on its data (digits by default), built as a
  run builds it, for `total_steps` steps unless the config sets --steps."""
  if config.train.steps is None:
    config = config.replace(steps=total_steps)
  return setup(config, streams).engine


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
