"""AD-PSGD: asynchronous decentralized parallel SGD (Lian et al. 2018).

Worker m loops: take a snapshot of its x_m and compute g on it; atomically
average with one random neighbour k, x_m, x_k <- (x_m + x_k) / 2; then apply
its gradient, x_m <- x_m - lr * u(g) (its own optimizer state). Averaging
preserves the mean of the workers' models; the evaluated model is that mean
(batch-norm statistics averaged too). Real concurrent runs need a bipartite
active/passive split to avoid deadlock; a simulated schedule does not.

With --compress, the two models of an average travel as compressed
differences from references both ends of each direction hold
(jaxdl.algorithms.pairwise), and the average is CHOCO-SGD's consensus step
(Koloskova, Stich, Jaggi, "Decentralized Stochastic Optimization and Gossip
Algorithms with Compressed Communication", ICML 2019, Algorithm 1's
x_i <- x_i + gamma sum_j w_ij (x^_j - x^_i), here on one pair with w = 1):

    q_mk = C(x_m - r_{m->k}),   q_km = C(x_k - r_{k->m})   (each with its own draws)
    r_{m->k} <- r_{m->k} + q_mk,  r_{k->m} <- r_{k->m} + q_km   (on both ends)
    x_m <- x_m + gamma (r_{k->m} - r_{m->k}),  x_k <- x_k + gamma (r_{m->k} - r_{k->m})

with gamma = --consensus-step, the references updated first. Derivation,
writing e_m = x_m - r_{m->k} for what m's message left out (after the
update):
  - what m gains k loses: x_m + x_k, hence the workers' mean (the evaluated
    model), is unchanged whatever C left out, up to float rounding (both
    ends hold both references bit for bit, and a - b = -(b - a));
  - with C the identity, r_{k->m} = x_k and r_{m->k} = x_m, so x_m <- x_m
    + gamma (x_k - x_m): at gamma = 1/2 both get (x_m + x_k) / 2, the
    uncompressed average (up to the rounding of r + (x - r));
  - otherwise x_m <- x_m + gamma (x_k - x_m) - gamma (e_k - e_m), and what
    m sends k next starts from e_m <- (1 + gamma) e_m - gamma e_k + gamma
    (x_k - x_m): the left-out part grows by 1 + gamma at each exchange
    before C contracts it by (1 - delta) (E||x - C(x)||^2 <= (1 - delta)
    ||x||^2). It stays bounded only for (1 + gamma)^2 (1 - delta) < 1,
    gamma < 1/sqrt(1 - delta) - 1, about delta / 2 (random-k: delta = the
    fraction, 0.054 for randk:0.1), hence a small gamma, as CHOCO's
    analysis takes it.
Measured on the gossip grid's task (mlp on digits, 10 epochs, 4 workers,
docs/results.md): gamma = 0.25 diverged with randk:0.1, qsgd:16 and
powersgd:2, gamma = 0.5 with topk:0.01; gamma = 0.05 (the default) trained
with all six compressors tried, at 4 and 8 workers. The earlier rule,
x_m <- (x_m + r_{k->m}) / 2, moved the mean by -(e_m + e_k) / 4 at each
average and ended far lower (0.9435 at 4 workers and 0.8509 at 8 with
topk:0.01, against 0.988 whole). Batch-norm statistics are averaged whole.
Each worker keeps 2 M references, so M is bounded (pairwise.MAX_WORKERS);
without --compress none are kept, and the average is (x_m + x_k) / 2
whatever gamma is.

Versions read: `compute` reads the snapshot taken by `pull`, never the model
that averages changed since; `average` both models as they are when the
exchange completes (atomic, as the paper's lock makes it; the worker is idle
while its models travel); `apply` the worker's model after its average.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax

from jaxdl.algorithms import pairwise
from jaxdl.algorithms.base import AlgorithmSpec, Problem, TrainState, mean_over_workers
from jaxdl.algorithms.shapes import Decentralized
from jaxdl.settings import Settings, require, setting


class PeerWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  pulled: Any  # the snapshot its current gradient is computed on
  grads: Any
  links: Any = ()  # its pairwise references (--compress: pairwise.Links; () without)


@dataclasses.dataclass(frozen=True)
class ADPSGDSettings(Settings):
  consensus_step: float = setting(0.05, symbol="gamma")
  """With --compress: CHOCO-SGD's consensus step gamma in (0, 1], x_m <- x_m + gamma (r_{k->m} - r_{m->k}) (and k the opposite), which keeps the pair's mean. The default 0.05 trained with topk:0.01, topk:0.1, randk:0.1, qsgd:16, sign and powersgd:2 at 4 and 8 workers (docs/results.md); 0.25 diverged with randk:0.1, qsgd:16 and powersgd:2. 0.5 with topk:1 is the uncompressed average. Without --compress the average is exact, (x_m + x_k) / 2, whatever this is."""

  def validate(self) -> None:
    gamma = self.consensus_step
    require("consensus_step", gamma, 0 < gamma <= 1, "a step size in (0, 1]")


def average(problem: Problem, worker: PeerWorker, peer: PeerWorker,
            gamma: float = ADPSGDSettings.consensus_step):
  """Atomic averaging of two workers' models -> (worker, peer); with
  --compress, CHOCO-SGD's consensus step `gamma` between the pair's
  references (see the module's docstring)."""
  mean = lambda a, b: (a + b) / 2
  model_state = jax.tree.map(mean, worker.model_state, peer.model_state)
  if not problem.compresses:
    params = jax.tree.map(mean, worker.params, peer.params)
    return (worker._replace(params=params, model_state=model_state),
            peer._replace(params=params, model_state=model_state))
  m, k = worker.links.index, peer.links.index
  mine, q_mk = pairwise.encode(problem.compress, worker.links, worker.params, k)
  theirs, q_km = pairwise.encode(problem.compress, peer.links, peer.params, m)
  mine, x_k = pairwise.decode(problem.compress, mine, q_km, k)
  theirs, x_m = pairwise.decode(problem.compress, theirs, q_mk, m)
  # r_{k->m} - r_{m->k}: both ends hold both references, bit for bit, and
  # a - b = -(b - a) in floating point: what m gains, k loses
  step = jax.tree.map(lambda r_km, r_mk: gamma * (r_km - r_mk), x_k, x_m)
  return (worker._replace(params=jax.tree.map(jax.numpy.add, worker.params, step),
                          model_state=model_state, links=mine),
          peer._replace(params=jax.tree.map(jax.numpy.subtract, peer.params, step),
                        model_state=model_state, links=theirs))


def evaluated(workers: PeerWorker):
  return mean_over_workers(workers.params), mean_over_workers(workers.model_state)


def build(settings: ADPSGDSettings, problem: Problem, num_workers: int) -> Decentralized:
  gamma = settings.consensus_step

  def init(key, worker) -> PeerWorker:
    state = problem.init_state(key)
    links = pairwise.of_worker(problem, state.params, worker, num_workers)
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
      average=lambda worker, peer: average(problem, worker, peer, gamma), apply=apply,
      evaluated=evaluated,
      # each iteration: a round trip of the model (compressed with --compress)
      # with one neighbour
      bytes_per_step=2.0 * num_workers * problem.message_bytes())


def check(settings, config) -> None:
  del settings
  pairwise.check(config, "ad_psgd")


SPEC = AlgorithmSpec("ad_psgd", "asynchronous decentralized: average with a random neighbour "
                     "each iteration", Decentralized, build, ADPSGDSettings, check=check)
