"""The local engine: one worker, the algorithm's step jitted on the default device."""
from __future__ import annotations

import functools

import jax

from jaxdl.algorithms import Algorithm, Batch, Problem
from jaxdl.data import WorkerStreams


def compile_init(init, *args):
  """Compiles an initialization function once, cheaply.

  Op-by-op, every parameter's initializer compiles on its own; under one jit
  the random-number code still dominates compile time on CPU, and it needs no
  backend optimization: it runs once.
  """
  options = {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else {}
  return jax.jit(init).lower(*args).compile(compiler_options=options)


class LocalEngine:
  """Runs a one-worker algorithm; buffers of the state are donated each step."""

  def __init__(self, algorithm: Algorithm, problem: Problem, streams: WorkerStreams,
               num_workers: int):
    self._algorithm, self._problem, self._streams = algorithm, problem, streams
    self._num_workers = num_workers
    self.jitted_step = jax.jit(lambda state, batch: algorithm.step(problem, state, batch),
                         donate_argnums=0)

  def init(self, key: jax.Array):
    init = functools.partial(self._algorithm.init, self._problem,
                             num_workers=self._num_workers)
    return compile_init(init, key)(key)

  def step(self, state, step: int):
    """Advances `state` by training step `step` (its data is a function of it)."""
    return self.jitted_step(state, Batch(*self._streams.batch(0, step)))

  def evaluated(self, state):
    return self._algorithm.evaluated(state)

  def info(self) -> dict:
    return {"engine": "local", "devices": 1, "workers_per_device": 1}
