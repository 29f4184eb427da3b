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

from jaxdl.algorithms.base import Problem
from jaxdl.algorithms.families import Centralized, Elastic, exchange_parts
from jaxdl.errors import ConfigError


class ServerState(NamedTuple):
  inner: Any  # the algorithm's own server state
  stats: Any  # the server's batch-norm statistics (a model state)


def moving_average(stats, reported, decay: float):
  """E <- (1 - d) E + d * reported, leaf by leaf."""
  return jax.tree.map(lambda e, r: (1 - decay) * e + decay * r, stats, reported)


# The families whose server keeps the statistics, and the handler that receives a report.
RECEIVER = {Centralized: "apply", Elastic: "exchange"}


def check(family: type, name: str, these: str = "") -> None:
  """A ConfigError unless algorithms of `family` (here `name`) have a server
  (`these`: the registered algorithms that do, for the message)."""
  if family not in RECEIVER:
    raise ConfigError("async_bn", True, "only for asynchronous algorithms with a server"
                      f"{f' ({these})' if these else ''}; {name} has none")


def wrap(algorithm: Centralized | Elastic, problem: Problem, decay: float,
         name: str) -> Centralized | Elastic:
  """`algorithm` (called `name`) with Async-BN."""
  check(type(algorithm), name)
  receive = RECEIVER[type(algorithm)]
  received_by = getattr(algorithm, receive)

  def init_server(key) -> ServerState:
    return ServerState(algorithm.init_server(key), problem.init_model(key)[1])

  def received(server: ServerState, worker, *timing):
    inner, updated = received_by(server.inner, worker, *timing)
    return ServerState(inner, moving_average(server.stats, worker.model_state, decay)), updated

  def evaluated(server: ServerState, workers):
    params, _ = algorithm.evaluated(server.inner, workers)
    return params, server.stats

  changes = dict(init_server=init_server, evaluated=evaluated,
                 report=lambda server: algorithm.report(server.inner), **{receive: received})
  if isinstance(algorithm, Centralized):
    changes["pull"] = lambda server, worker, seconds: algorithm.pull(server.inner, worker,
                                                                     seconds)
  else:  # the exchange's messages: the worker's report travels with its own
    meet, take = exchange_parts(algorithm)

    def met(worker, center: ServerState):
      worker_after, message = meet(worker, center.inner)
      return worker_after, (message, worker.model_state)

    def taken(center: ServerState, message) -> ServerState:
      message, reported = message
      return ServerState(take(center.inner, message),
                         moving_average(center.stats, reported, decay))
    changes.update(meet=met, take=taken)
  return dataclasses.replace(algorithm, **changes)
