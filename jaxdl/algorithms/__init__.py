"""The algorithm registry: one module per algorithm, found by name."""
from __future__ import annotations

from jaxdl.algorithms import sgd
from jaxdl.algorithms.base import Algorithm, Batch, Problem, TrainState
from jaxdl.errors import ConfigError
from jaxdl.registry import Registry

ALGORITHMS: Registry[Algorithm] = Registry("algorithm")
ALGORITHMS.register("sgd", "sequential SGD on one worker (any optax update rule)")(sgd.ALGORITHM)


def resolve(cfg) -> tuple[Algorithm, str]:
  """The algorithm that an AlgorithmConfig names and the engine that runs it."""
  algorithm = ALGORITHMS.get(cfg.algorithm)
  engine = algorithm.engines[0] if cfg.engine == "auto" else cfg.engine
  if engine not in algorithm.engines:
    raise ConfigError("engine", cfg.engine,
                      f"one of auto, {', '.join(algorithm.engines)} for {algorithm.name}")
  if algorithm.max_workers is not None and cfg.workers > algorithm.max_workers:
    raise ConfigError("workers", cfg.workers,
                      f"at most {algorithm.max_workers} for --algorithm {algorithm.name}")
  return algorithm, engine


__all__ = ["ALGORITHMS", "Algorithm", "Batch", "Problem", "TrainState", "resolve"]
