"""DC-ASGD: ASP with a delay-compensated server update (Zheng et al., ICML 2017).

The server applies a gradient g computed on the w_bak that worker m pulled as
  w <- w - lr * u(g + lambda * g * g * (w - w_bak))
i.e. its update rule is `optax.chain(delay_compensation(...), <the run's
optax rule>)`, with w_bak (the worker's entry in the staleness buffer) as the
chain's extra argument. Schedule, workers and evaluated model are ASP's;
`apply` reads the server as it is on arrival and the w_bak the worker pulled
(with --compress-pull, the server's ledger of the worker's copy: the bits
its gradient was computed on).
"""
from __future__ import annotations

import dataclasses

import optax

from jaxdl.algorithms import asp
from jaxdl.algorithms.base import AlgorithmSpec, Problem
from jaxdl.algorithms.compensation import delay_compensation
from jaxdl.algorithms.families import Centralized
from jaxdl.settings import Settings, at_least, between, setting


@dataclasses.dataclass(frozen=True)
class DCSettings(Settings):
  dc_lambda: float = setting(0.04, allowed=at_least(0))
  """DC-ASGD's lambda (constant, DC-ASGD-c), or lambda0 with --dc-adaptive."""
  dc_adaptive: bool = False
  """DC-ASGD-a: lambda_t = dc_lambda / sqrt(v_t), v_t a moving mean square of the gradients (the paper: lambda0 2)."""
  dc_beta: float = setting(0.95, allowed=between(0, 1, high_open=True, noun="a decay"))
  """DC-ASGD-a's decay of the gradients' moving mean square."""


def build(settings: DCSettings, problem: Problem, num_workers: int) -> Centralized:
  optimizer = optax.chain(
      delay_compensation(settings.dc_lambda, settings.dc_adaptive, settings.dc_beta),
      problem.optimizer)
  ps = asp.parameter_server(problem, num_workers, optimizer=optimizer)

  def apply(server: asp.ServerState, worker: asp.WorkerState, seconds):
    """The compensated update, w_bak = the parameters the worker pulled."""
    del seconds
    grads = problem.decode_message(worker.grads, server.params)
    return asp.update(server, grads, optimizer, w_bak=asp.computed_on(problem, worker)), worker

  return dataclasses.replace(ps, apply=apply)


SPEC = AlgorithmSpec("dc_asgd", "asp with delay compensation (--dc-lambda, --dc-adaptive)",
                     Centralized, build, DCSettings, **asp.STALENESS_DEFAULTS)
