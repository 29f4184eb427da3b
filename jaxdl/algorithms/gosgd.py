"""GoSGD: gossip SGD, asynchronous and decentralized (Blot et al. 2016).

Worker m keeps x_m and a weight a_m (1/M at the start). After each local step,
with probability p = --gossip-probability it pushes to one random peer k:
    a_m <- a_m / 2;  x_k <- (a_k x_k + a_m x_m) / (a_k + a_m);  a_k <- a_k + a_m
The weights always sum to 1 and sum_m a_m x_m is unchanged by a gossip. The
evaluated model is that weighted average, sum_m a_m x_m (batch-norm
statistics averaged the same way). The receiver merges the sender's model as
it is when the message arrives.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxdl import sim
from jaxdl.algorithms.base import Algorithm, Problem, TrainState
from jaxdl.algorithms.easgd import local as _local
from jaxdl.errors import ConfigError


class GossipWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  weight: jax.Array  # a_m, float32


def init(problem: Problem, cfg, key, worker, num_workers) -> GossipWorker:
  del cfg, worker
  state = problem.init_state(key)
  return GossipWorker(*state, jnp.float32(1.0 / num_workers))


def local(problem: Problem, cfg, worker: GossipWorker, batch, axis):
  state, metrics = _local(problem, cfg, TrainState(*worker[:3]), batch, axis)
  return GossipWorker(*state, worker.weight), metrics


def pair(problem: Problem, cfg, sender: GossipWorker, receiver: GossipWorker):
  """The sender pushes half its weight and its model -> (sender, receiver)."""
  del problem, cfg
  a = sender.weight / 2
  total = receiver.weight + a
  merge = lambda xk, xm: (receiver.weight * xk + a * xm) / total
  return (sender._replace(weight=a),
          receiver._replace(params=jax.tree.map(merge, receiver.params, sender.params),
                            model_state=jax.tree.map(merge, receiver.model_state,
                                                     sender.model_state),
                            weight=total))


def evaluated(problem: Problem, cfg, server, workers: GossipWorker):
  del problem, cfg, server
  a = workers.weight / workers.weight.sum()
  average = lambda x: jnp.tensordot(a, x, axes=1)
  return jax.tree.map(average, workers.params), jax.tree.map(average, workers.model_state)


def check(cfg) -> None:
  p = cfg.algorithm.gossip_probability
  if not 0 <= p <= 1:
    raise ConfigError("gossip_probability", p, "a probability in [0, 1]")


ALGORITHM = Algorithm(
    name="gosgd", shape="gossip", init=init, init_server=lambda problem, cfg, key: (),
    local=local, pair=pair, evaluated=evaluated, engines=("sim",), check=check,
    bytes_per_step=lambda cfg, b, m: m * b * cfg.algorithm.gossip_probability,
    schedule=lambda cost, iterations, cfg: sim.gossip(
        cost, iterations, cfg.algorithm.gossip_probability))
