"""AD-PSGD: asynchronous decentralized parallel SGD (Lian et al. 2018).

Worker m loops: take a snapshot of its x_m and compute g on it; atomically
average with one random neighbour k, x_m, x_k <- (x_m + x_k) / 2; then apply
its gradient, x_m <- x_m - lr * u(g) (its own optimizer state). Averaging
preserves the mean of the workers' models; the evaluated model is that mean
(batch-norm statistics averaged too). Real concurrent runs need a bipartite
active/passive split to avoid deadlock; a simulated schedule does not.

--compress is refused: an averaging swaps the two workers' whole models with
a random neighbour, and (x_m + x_k) / 2 of a compressed model is no average.
Compressing the difference x_m - x_k needs a model both hold, and a random
neighbour each time means a copy of every other worker's model per worker
(CHOCO-SGD's public copies), which AD-PSGD does not keep.

Versions read: `compute` reads the snapshot taken by `pull`, never the model
that averages changed since; `average` both models as they are when the
exchange completes (atomic, as the paper's lock makes it; the worker is idle
while its models travel); `apply` the worker's model after its average.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxdl.algorithms.base import AlgorithmSpec, Problem, TrainState, mean_over_workers
from jaxdl.algorithms import compression
from jaxdl.algorithms.shapes import Decentralized


class PeerWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  pulled: Any  # the snapshot its current gradient is computed on
  grads: Any


def average(worker: PeerWorker, peer: PeerWorker):
  """Atomic averaging of two workers' models -> (worker, peer)."""
  mean = lambda a, b: (a + b) / 2
  params = jax.tree.map(mean, worker.params, peer.params)
  model_state = jax.tree.map(mean, worker.model_state, peer.model_state)
  return (worker._replace(params=params, model_state=model_state),
          peer._replace(params=params, model_state=model_state))


def evaluated(workers: PeerWorker):
  return mean_over_workers(workers.params), mean_over_workers(workers.model_state)


def build(settings, problem: Problem, num_workers: int) -> Decentralized:
  del settings

  def init(key, worker) -> PeerWorker:
    state = problem.init_state(key)
    return PeerWorker(*state, state.params, jax.tree.map(jax.numpy.zeros_like, state.params))

  def compute(worker: PeerWorker, batch):
    grads, model_state, metrics = problem.own_gradients(worker.pulled, worker.model_state, batch)
    return worker._replace(model_state=model_state, grads=grads), metrics

  def apply(worker: PeerWorker) -> PeerWorker:
    """The worker applies its (stale) gradient to its own model."""
    state = problem.apply_gradients(TrainState(*worker[:3]), worker.grads, worker.model_state)
    return worker._replace(**state._asdict())

  return Decentralized(
      init=init, pull=lambda worker: worker._replace(pulled=worker.params), compute=compute,
      average=average, apply=apply, evaluated=evaluated,
      # each iteration: a round trip of the model with one neighbour
      bytes_per_step=2.0 * num_workers * problem.model_bytes())


def check(settings, config) -> None:
  del settings
  compression.refuse(config.algorithm.compress, "ad_psgd",
                     "its averaging swaps whole models with a random neighbour, with no "
                     "reference both hold to take a compressed difference from")


SPEC = AlgorithmSpec("ad_psgd", "asynchronous decentralized: average with a random neighbour "
                     "each iteration", Decentralized, build, check=check)
