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
from jaxdl.algorithms.families import Decentralized
from jaxdl.settings import Settings, between, setting


class PeerWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  pulled: Any  # the snapshot its current gradient is computed on
  grads: Any
  links: Any = ()  # its pairwise references (--compress: pairwise.Links; () without)


@dataclasses.dataclass(frozen=True)
class ADPSGDSettings(Settings):
  consensus_step: float = setting(0.05, symbol="gamma",
                                 allowed=between(0, 1, low_open=True, noun="a step size"))
  """With --compress: CHOCO-SGD's consensus step gamma in (0, 1], x_m <- x_m + gamma (r_{k->m} - r_{m->k}) (and k the opposite), which keeps the pair's mean. The default 0.05 trained with topk:0.01, topk:0.1, randk:0.1, qsgd:16, sign and powersgd:2 at 4 and 8 workers (docs/results.md); 0.25 diverged with randk:0.1, qsgd:16 and powersgd:2. 0.5 with topk:1 is the uncompressed average. Without --compress the average is exact, (x_m + x_k) / 2, whatever this is."""


class Offer(NamedTuple):
  """What worker m sends the neighbour k it averages with."""
  params: Any       # x_m; with --compress, q_mk = C(x_m - r_{m->k}) (its payload)
  model_state: Any  # m's batch-norm statistics
  sender: Any = ()  # m, int32 (--compress: the reference k updates; () without)


class Answer(NamedTuple):
  """What k sends back."""
  params: Any       # (x_m + x_k) / 2; with --compress, q_km (its payload)
  model_state: Any  # the pair's mean statistics
  sender: Any = ()  # k, int32 (--compress)


def _mean(a, b):
  return jax.tree.map(lambda x, y: (x + y) / 2, a, b)


def _toward(gamma: float, r_km, r_mk):
  """gamma (r_{k->m} - r_{m->k}): what m gains and k loses. Each end
  computes it from its own copies of both references, which hold the same
  bits, and a - b = -(b - a) in floating point."""
  return jax.tree.map(lambda a, b: gamma * (a - b), r_km, r_mk)


def offer(problem: Problem, worker: PeerWorker, peer) -> tuple[PeerWorker, Offer]:
  """Worker m's part of an average with worker `peer` (k): what it sends, and
  with --compress its links with r_{m->k} updated."""
  if not problem.compresses:
    return worker, Offer(worker.params, worker.model_state)
  links, q = pairwise.encode(problem.compress, worker.links, worker.params, peer)
  return worker._replace(links=links), Offer(q, worker.model_state, links.index)


def answer(problem: Problem, gamma: float, peer: PeerWorker,
           message: Offer) -> tuple[PeerWorker, Answer]:
  """k's part, on m's offer's arrival: k averaged, and what it sends back."""
  model_state = _mean(message.model_state, peer.model_state)
  if not problem.compresses:
    params = _mean(message.params, peer.params)
    return peer._replace(params=params, model_state=model_state), Answer(params, model_state)
  m = message.sender
  links, q = pairwise.encode(problem.compress, peer.links, peer.params, m)
  links, r_mk = pairwise.decode(problem.compress, links, message.params, m)
  step = _toward(gamma, pairwise.sent_to(links, m), r_mk)
  return (peer._replace(params=jax.tree.map(jax.numpy.subtract, peer.params, step),
                        model_state=model_state, links=links),
          Answer(q, model_state, links.index))


def accept(problem: Problem, gamma: float, worker: PeerWorker, reply: Answer) -> PeerWorker:
  """m's part once k's answer arrives (`worker`: as its offer left it)."""
  if not problem.compresses:
    return worker._replace(params=reply.params, model_state=reply.model_state)
  k = reply.sender
  links, r_km = pairwise.decode(problem.compress, worker.links, reply.params, k)
  step = _toward(gamma, r_km, pairwise.sent_to(links, k))
  return worker._replace(params=jax.tree.map(jax.numpy.add, worker.params, step),
                         model_state=reply.model_state, links=links)


def average(problem: Problem, worker: PeerWorker, peer: PeerWorker,
            gamma: float = ADPSGDSettings.consensus_step):
  """Atomic averaging of two workers' models -> (worker, peer): m's offer,
  k's answer, m's acceptance; with --compress, CHOCO-SGD's consensus step
  `gamma` between the pair's references (see the module's docstring)."""
  k = peer.links.index if problem.compresses else 0
  worker, message = offer(problem, worker, k)
  peer, reply = answer(problem, gamma, peer, message)
  return accept(problem, gamma, worker, reply), peer


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
      evaluated=evaluated, offer=lambda worker, peer: offer(problem, worker, peer),
      answer=lambda peer, message: answer(problem, gamma, peer, message),
      accept=lambda worker, reply: accept(problem, gamma, worker, reply),
      # each iteration: a round trip of the model (compressed with --compress)
      # with one neighbour
      bytes_per_step=2.0 * num_workers * problem.message_bytes())


def check(settings, config) -> None:
  del settings
  pairwise.check(config, "ad_psgd")


SPEC = AlgorithmSpec("ad_psgd", "asynchronous decentralized: average with a random neighbour "
                     "each iteration", Decentralized, build, ADPSGDSettings, check=check)
