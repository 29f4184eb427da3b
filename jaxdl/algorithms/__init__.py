"""The algorithm registry: one module per algorithm, found by name."""
from __future__ import annotations

from jaxdl.algorithms import ar_sgd, asp, bsp, local_sgd
from jaxdl.algorithms.base import Algorithm, Batch, Problem, TrainState
from jaxdl.algorithms.collectives import WorkerAxis
from jaxdl.errors import ConfigError
from jaxdl.registry import Registry

ALGORITHMS: Registry[Algorithm] = Registry("algorithm")
ALGORITHMS.register("sgd", "sequential SGD on one worker (any optax update rule)")(ar_sgd.SGD)
ALGORITHMS.register("bsp", "bulk synchronous parallel with a sharded parameter server")(
    bsp.ALGORITHM)
ALGORITHMS.register("ar_sgd", "synchronous all-reduce SGD, a replica per worker")(
    ar_sgd.ALGORITHM)
ALGORITHMS.register("local_sgd", "local steps, then model averaging every "
                    "--communication-period steps")(local_sgd.ALGORITHM)
ALGORITHMS.register("asp", "asynchronous parameter server: every push applied on "
                    "arrival")(asp.ASP)
ALGORITHMS.register("ssp", "stale synchronous parallel: asp with --staleness-bound")(asp.SSP)


def resolve(config) -> tuple[Algorithm, str]:
  """The algorithm that a RunConfig names, checked, and the engine that runs it."""
  cfg = config.algorithm
  algorithm = ALGORITHMS.get(cfg.algorithm)
  engine = algorithm.engines[0] if cfg.engine == "auto" else cfg.engine
  if engine not in algorithm.engines:
    raise ConfigError("engine", cfg.engine,
                      f"one of auto, {', '.join(algorithm.engines)} for {algorithm.name}")
  if algorithm.max_workers is not None and cfg.workers > algorithm.max_workers:
    raise ConfigError("workers", cfg.workers,
                      f"at most {algorithm.max_workers} for --algorithm {algorithm.name}")
  algorithm.check(config)
  return algorithm, engine


__all__ = ["ALGORITHMS", "Algorithm", "Batch", "Problem", "TrainState", "WorkerAxis",
           "resolve"]
