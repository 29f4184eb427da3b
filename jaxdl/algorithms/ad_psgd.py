"""AD-PSGD: asynchronous decentralized parallel SGD (Lian et al. 2018).

Worker m loops: take a snapshot of its x_m and compute g on it; atomically
average with one random neighbour k, x_m, x_k <- (x_m + x_k) / 2; then apply
its gradient, x_m <- x_m - lr * u(g) (its own optimizer state). Averaging
preserves the mean of the workers' models; the evaluated model is that mean
(batch-norm statistics averaged too). Real concurrent runs need a bipartite
active/passive split to avoid deadlock; a simulated schedule does not.

With --compress, the two models of an average travel as compressed
differences from references both ends of each direction hold
(jaxdl.algorithms.pairwise, after CHOCO-SGD, Koloskova et al. 2019):

    q_mk = C(x_m - r_{m->k}),   q_km = C(x_k - r_{k->m})   (each with its own draws)
    r_{m->k} <- r_{m->k} + q_mk,  r_{k->m} <- r_{k->m} + q_km   (on both ends)
    x_m <- (x_m + r_{k->m}) / 2,  x_k <- (x_k + r_{m->k}) / 2

each worker averaging its own model with its reconstruction of the other's,
the references updated first. Derivation, writing e_m = x_m - r_{m->k} for
what m's message left out (after the update):
  - with C the identity, r_{k->m} = r + (x_k - r) = x_k and r_{m->k} = x_m,
    so both get (x_m + x_k) / 2, the uncompressed average (up to the
    rounding of r + (x - r));
  - otherwise x_m <- (x_m + x_k - e_k) / 2 and x_k <- (x_m + x_k - e_m) / 2:
    the models differ by (e_m - e_k) / 2 after it, and their mean moves by
    -(e_m + e_k) / 4 (the uncompressed average preserves it). Each side's
    own e stays in its x - r, which goes in the pair's next exchanges (error
    feedback without a residual): e_m <- (x_k - x_m) / 2 + e_m - e_k / 2
    before the next compression, a factor 1 on e_m, so a contraction C
    keeps it bounded.
CHOCO-SGD's own step, x_m <- x_m + gamma (r_{k->m} - r_{m->k}) with gamma
= 1/2, preserves the mean, but multiplies e_m by 1 + gamma = 3/2 before the
next compression: measured on the mlp with 4 workers, it diverged with
randk:0.1 (the last 10 of 60 steps' loss 874), where CHOCO takes gamma of
the order of C's delta; this rule needs no such step size. Batch-norm
statistics are averaged whole. Each worker keeps 2 M references, so M is
bounded (pairwise.MAX_WORKERS); without --compress none are kept.

Versions read: `compute` reads the snapshot taken by `pull`, never the model
that averages changed since; `average` both models as they are when the
exchange completes (atomic, as the paper's lock makes it; the worker is idle
while its models travel); `apply` the worker's model after its average.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxdl.algorithms import pairwise
from jaxdl.algorithms.base import AlgorithmSpec, Problem, TrainState, mean_over_workers
from jaxdl.algorithms.shapes import Decentralized


class PeerWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  pulled: Any  # the snapshot its current gradient is computed on
  grads: Any
  links: Any = ()  # its pairwise references (--compress: pairwise.Links; () without)


def average(problem: Problem, worker: PeerWorker, peer: PeerWorker):
  """Atomic averaging of two workers' models -> (worker, peer); with
  --compress, each with its reconstruction of the other's (see the module's
  docstring)."""
  mean = lambda a, b: (a + b) / 2
  model_state = jax.tree.map(mean, worker.model_state, peer.model_state)
  if not problem.compresses:
    params = jax.tree.map(mean, worker.params, peer.params)
    return (worker._replace(params=params, model_state=model_state),
            peer._replace(params=params, model_state=model_state))
  m, k = worker.links.index, peer.links.index
  mine, q_mk = pairwise.encode(problem.compress, worker.links, worker.params, k)
  theirs, q_km = pairwise.encode(problem.compress, peer.links, peer.params, m)
  mine, x_k = pairwise.decode(mine, q_km, k)
  theirs, x_m = pairwise.decode(theirs, q_mk, m)
  return (worker._replace(params=jax.tree.map(mean, worker.params, x_k),
                          model_state=model_state, links=mine),
          peer._replace(params=jax.tree.map(mean, peer.params, x_m),
                        model_state=model_state, links=theirs))


def evaluated(workers: PeerWorker):
  return mean_over_workers(workers.params), mean_over_workers(workers.model_state)


def build(settings, problem: Problem, num_workers: int) -> Decentralized:
  del settings

  def init(key, worker) -> PeerWorker:
    state = problem.init_state(key)
    links = (pairwise.init(problem.compress, state.params, worker, num_workers, problem.seed)
             if problem.compresses else ())
    return PeerWorker(*state, state.params, jax.tree.map(jax.numpy.zeros_like, state.params),
                      links)

  def compute(worker: PeerWorker, batch):
    grads, model_state, metrics = problem.own_gradients(worker.pulled, worker.model_state, batch)
    return worker._replace(model_state=model_state, grads=grads), metrics

  def apply(worker: PeerWorker) -> PeerWorker:
    """The worker applies its (stale) gradient to its own model."""
    state = problem.apply_gradients(TrainState(*worker[:3]), worker.grads, worker.model_state)
    return worker._replace(**state._asdict())

  return Decentralized(
      init=init, pull=lambda worker: worker._replace(pulled=worker.params), compute=compute,
      average=lambda worker, peer: average(problem, worker, peer), apply=apply,
      evaluated=evaluated,
      # each iteration: a round trip of the model (compressed with --compress)
      # with one neighbour
      bytes_per_step=2.0 * num_workers * problem.message_bytes())


def check(settings, config) -> None:
  del settings
  pairwise.check(config, "ad_psgd")


SPEC = AlgorithmSpec("ad_psgd", "asynchronous decentralized: average with a random neighbour "
                     "each iteration", Decentralized, build, check=check)
