"""AD-PSGD: asynchronous decentralized parallel SGD (Lian et al. 2018).

Worker m loops: take a snapshot of its x_m and compute g on it; atomically
average with one random neighbour k, x_m, x_k <- (x_m + x_k) / 2; then apply
its gradient, x_m <- x_m - lr * u(g) (its own optimizer state). Averaging
preserves the mean of the workers' models; the evaluated model is that mean
(batch-norm statistics averaged too). Real concurrent runs need a bipartite
active/passive split to avoid deadlock; a simulated schedule does not.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxdl import sim
from jaxdl.algorithms.base import Algorithm, Problem, TrainState, mean_over_workers


class PeerWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  pulled: Any  # the snapshot its current gradient is computed on
  grads: Any


def init(problem: Problem, cfg, key, worker, num_workers) -> PeerWorker:
  del cfg, worker, num_workers
  state = problem.init_state(key)
  return PeerWorker(*state, state.params, jax.tree.map(jax.numpy.zeros_like, state.params))


def pull(problem: Problem, cfg, server, worker: PeerWorker) -> PeerWorker:
  del problem, cfg, server
  return worker._replace(pulled=worker.params)


def compute(problem: Problem, cfg, worker: PeerWorker, batch, axis):
  del cfg, axis
  grads, model_state, metrics = problem.own_gradients(worker.pulled, worker.model_state, batch)
  return worker._replace(model_state=model_state, grads=grads), metrics


def pair(problem: Problem, cfg, worker: PeerWorker, peer: PeerWorker):
  """Atomic averaging of two workers' models -> (worker, peer)."""
  del problem, cfg
  mean = lambda a, b: (a + b) / 2
  params = jax.tree.map(mean, worker.params, peer.params)
  model_state = jax.tree.map(mean, worker.model_state, peer.model_state)
  return (worker._replace(params=params, model_state=model_state),
          peer._replace(params=params, model_state=model_state))


def apply(problem: Problem, cfg, server, worker: PeerWorker):
  """The worker applies its (stale) gradient to its own model -> (server, worker)."""
  del cfg
  state = problem.apply_gradients(TrainState(*worker[:3]), worker.grads, worker.model_state)
  return server, worker._replace(params=state.params, opt_state=state.opt_state)


def evaluated(problem: Problem, cfg, server, workers: PeerWorker):
  del problem, cfg, server
  return mean_over_workers(workers.params), mean_over_workers(workers.model_state)


ALGORITHM = Algorithm(
    name="ad_psgd", shape="decentralized", init=init, init_server=lambda problem, cfg, key: (),
    pull=pull, compute=compute, pair=pair, apply=apply, evaluated=evaluated,
    engines=("sim",),
    # each iteration: a round trip of the model with one neighbour
    bytes_per_step=lambda cfg, b, m: 2.0 * m * b,
    schedule=lambda cost, iterations, cfg: sim.decentralized(cost, iterations))
