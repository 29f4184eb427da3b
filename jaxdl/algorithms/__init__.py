"""The algorithm registry: one module per algorithm, found by name."""
from __future__ import annotations

from jaxdl.algorithms import (ad_psgd, ar_sgd, asp, async_bn, bsp, dc_asgd, easgd, gosgd,
                              lc_asgd, local_sgd)
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
ALGORITHMS.register("dc_asgd", "asp with delay compensation (--dc-lambda, "
                    "--dc-adaptive)")(dc_asgd.ALGORITHM)
ALGORITHMS.register("lc_asgd", "asp with loss-prediction compensation (--lc-lambda), "
                    "step and loss predictors")(lc_asgd.ALGORITHM)
ALGORITHMS.register("easgd", "elastic averaging with a center every "
                    "--communication-period local steps")(easgd.ALGORITHM)
ALGORITHMS.register("gosgd", "gossip: push to a random peer with "
                    "--gossip-probability")(gosgd.ALGORITHM)
ALGORITHMS.register("ad_psgd", "asynchronous decentralized: average with a random "
                    "neighbour each iteration")(ad_psgd.ALGORITHM)


def resolve(config) -> tuple[Algorithm, str]:
  """The algorithm that a RunConfig names, checked, and the engine that runs it."""
  cfg = config.algorithm
  algorithm = ALGORITHMS.get(cfg.algorithm)
  if cfg.engine != "auto":
    engine = cfg.engine
  elif config.output.dry_run and "sim" in algorithm.engines:
    engine = "sim"  # a dry run is a simulated schedule
  else:
    engine = algorithm.engines[0]
  if engine not in algorithm.engines:
    raise ConfigError("engine", cfg.engine,
                      f"one of auto, {', '.join(algorithm.engines)} for {algorithm.name}")
  if algorithm.max_workers is not None and cfg.workers > algorithm.max_workers:
    raise ConfigError("workers", cfg.workers,
                      f"at most {algorithm.max_workers} for --algorithm {algorithm.name}")
  algorithm.check(config)
  if cfg.async_bn:
    algorithm = async_bn.wrap(algorithm)
  return algorithm, engine


__all__ = ["ALGORITHMS", "Algorithm", "Batch", "Problem", "TrainState", "WorkerAxis",
           "resolve"]
