"""DC-ASGD: ASP with a delay-compensated server update (Zheng et al., ICML 2017).

The server applies a gradient g computed on the w_bak that worker m pulled as
  w <- w - lr * u(g + lambda * g * g * (w - w_bak))
i.e. its update rule is `optax.chain(delay_compensation(...), <the run's
optax rule>)`, with w_bak (the worker's entry in the staleness buffer) as the
chain's extra argument. --dc-lambda (0.04: DC-ASGD-c), --dc-adaptive
(DC-ASGD-a: lambda0 / sqrt(v)), --dc-beta. Schedule, workers and evaluated
model are ASP's.
"""
from __future__ import annotations

import dataclasses

import optax

from jaxdl.algorithms import asp
from jaxdl.algorithms.base import Problem
from jaxdl.algorithms.compensation import delay_compensation


def optimizer(problem: Problem, cfg) -> optax.GradientTransformationExtraArgs:
  a = cfg.algorithm
  return optax.chain(delay_compensation(a.dc_lambda, a.dc_adaptive, a.dc_beta),
                     problem.optimizer)


def init_server(problem: Problem, cfg, key) -> asp.ServerState:
  return asp.init_server(problem, cfg, key, optimizer(problem, cfg))


def apply(problem: Problem, cfg, server: asp.ServerState, worker: asp.WorkerState):
  """The compensated update, w_bak = the parameters the worker pulled."""
  return asp.update(server, worker.grads, optimizer(problem, cfg), w_bak=worker.pulled), worker


ALGORITHM = dataclasses.replace(asp.ASP, name="dc_asgd", init_server=init_server, apply=apply)
