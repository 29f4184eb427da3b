"""Asynchronous batch norm (LC-ASGD's Async-BN, `--async-bn`) for any algorithm
with a server.

Workers train on their batches' own statistics and report them (their
batch-norm state holds the last batch's mean and variance: `Problem(async_bn=
True)`); on every report (an "apply", or EASGD's "exchange") the server
updates, per batch-norm layer z,
  E_z <- (1 - d) E_z + d * mean_z,   Var_z <- (1 - d) Var_z + d * var_z
(d = --bn-decay; E starts at 0 and Var at 1), and the model is evaluated with
these statistics instead of the workers' mean running statistics.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax

from jaxdl.algorithms.base import Algorithm, Problem
from jaxdl.errors import ConfigError


class ServerState(NamedTuple):
  inner: Any  # the algorithm's own server state
  stats: Any  # the server's batch-norm statistics (a model state)


def moving_average(stats, reported, decay: float):
  """E <- (1 - d) E + d * reported, leaf by leaf."""
  return jax.tree.map(lambda e, r: (1 - decay) * e + decay * r, stats, reported)


def wrap(algorithm: Algorithm) -> Algorithm:
  """`algorithm` with Async-BN; a ConfigError if it has no server to keep them."""
  receive = {"centralized": "apply", "elastic": "exchange"}.get(algorithm.shape)
  if receive is None:
    raise ConfigError("async_bn", True, "only for asynchronous algorithms with a server "
                      f"(asp, ssp, easgd, dc_asgd, lc_asgd); {algorithm.name} has none")

  def init_server(problem: Problem, cfg, key) -> ServerState:
    return ServerState(algorithm.init_server(problem, cfg, key), problem.model.init(key)[1])

  def received(problem: Problem, cfg, server: ServerState, worker, *timing):
    inner, updated = getattr(algorithm, receive)(problem, cfg, server.inner, worker, *timing)
    stats = moving_average(server.stats, worker.model_state, cfg.algorithm.bn_decay)
    return ServerState(inner, stats), updated

  def evaluated(problem: Problem, cfg, server: ServerState, workers):
    params, _ = algorithm.evaluated(problem, cfg, server.inner, workers)
    return params, server.stats

  def inner(fn):
    return fn and (lambda problem, cfg, server, *args: fn(problem, cfg, server.inner, *args))

  report = algorithm.report and (
      lambda problem, cfg, server: algorithm.report(problem, cfg, server.inner))
  return dataclasses.replace(algorithm, init_server=init_server, evaluated=evaluated,
                             pull=inner(algorithm.pull), report=report,
                             **{receive: received})
