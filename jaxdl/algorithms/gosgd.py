"""GoSGD: gossip SGD, asynchronous and decentralized (Blot et al. 2016).

Worker m keeps x_m and a weight a_m (1/M at the start). After each local step,
with probability p = --gossip-probability it pushes to one random peer k:
    a_m <- a_m / 2, and it sends (x_m, a_m);
    on arrival:  x_k <- (a_k x_k + a_m x_m) / (a_k + a_m);  a_k <- a_k + a_m
                 (as x_k + a_m / (a_k + a_m) (x_m - x_k), exact where they agree)
The weights always sum to 1 and sum_m a_m x_m is unchanged by a gossip. The
evaluated model is that weighted average, sum_m a_m x_m (batch-norm
statistics averaged the same way).

With --compress, a message carries a compressed model difference from a
reference both ends of the pair hold (jaxdl.algorithms.pairwise, after
CHOCO-SGD, Koloskova et al. 2019): m sends q = C(x_m - r_{m->k}) and both
ends set r_{m->k} <- r_{m->k} + q, m at the push, k on arrival; k merges
its reconstruction of x_m,
    x_k <- (a_k x_k + a_m r_{m->k}) / (a_k + a_m),
with the weights as without compression (they still sum to 1). What C left
out stays in x_m - r_{m->k} and goes in m's later messages to k (error
feedback, with no residual of its own). The batch-norm statistics and the
weight travel whole. Each worker keeps 2 M references, so M is bounded
(pairwise.MAX_WORKERS); without --compress none are kept.

Versions read: `send` decides the message, (x_m, a_m) (or q, a_m) as they
are at the push; `receive` merges that message into the receiver as it is
on arrival. Engines keep one message of a worker in flight at a time: its
next push waits for that merge (jaxdl.cluster.async_schedules.gossip).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxdl.algorithms import pairwise
from jaxdl.algorithms.base import AlgorithmSpec, Problem, TrainState, mean_over_workers
from jaxdl.algorithms.easgd import local as _local
from jaxdl.algorithms.families import Gossip
from jaxdl.settings import Settings, between, setting


class GossipWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  weight: jax.Array  # a_m, float32
  links: Any = ()    # its pairwise references (--compress: pairwise.Links; () without)


class Message(NamedTuple):
  params: Any        # x_m; with --compress, q = C(x_m - r_{m->k}) (its payload)
  model_state: Any
  weight: jax.Array  # the half of a_m that travels
  sender: Any = ()   # m, int32 (--compress: the receiver's reference to update; () without)


@dataclasses.dataclass(frozen=True)
class GoSGDSettings(Settings):
  gossip_probability: float = setting(0.1, symbol="p",
                                     allowed=between(0, 1, noun="a probability"))
  """GoSGD's p: probability that a worker gossips after a local step."""


def send(problem: Problem, sender: GossipWorker, peer) -> tuple[GossipWorker, Message]:
  """The sender halves its weight and sends its model (with --compress, its
  compressed difference from r_{m->peer}) with that half to `peer`."""
  a = sender.weight / 2
  if not problem.compresses:
    return sender._replace(weight=a), Message(sender.params, sender.model_state, a)
  links, q = pairwise.encode(problem.compress, sender.links, sender.params, peer)
  return (sender._replace(weight=a, links=links),
          Message(q, sender.model_state, a, links.index))


def receive(problem: Problem, receiver: GossipWorker, message: Message) -> GossipWorker:
  """The weighted merge of a message (with --compress, of the receiver's
  reconstruction of the sender's model) into the receiver."""
  links, params = receiver.links, message.params
  if problem.compresses:
    links, params = pairwise.decode(problem.compress, links, params, message.sender)
  total = receiver.weight + message.weight
  sender_part = message.weight / total
  # x_k + (a_m / (a_k + a_m)) (x_m - x_k): where the two models agree, the
  # receiver's stays bit for bit; (a_k x_k + a_m x_m) / (a_k + a_m) of two
  # equal values rounds to another value for some of them
  merge = lambda xk, xm: xk + sender_part * (xm - xk)
  return receiver._replace(params=jax.tree.map(merge, receiver.params, params),
                           model_state=jax.tree.map(merge, receiver.model_state,
                                                    message.model_state),
                           weight=total, links=links)


def evaluated(workers: GossipWorker):
  a = workers.weight / workers.weight.sum()
  return mean_over_workers(workers.params, a), mean_over_workers(workers.model_state, a)


def build(settings: GoSGDSettings, problem: Problem, num_workers: int) -> Gossip:
  def init(key, worker) -> GossipWorker:
    state = problem.init_state(key)
    links = pairwise.of_worker(problem, state.params, worker, num_workers)
    return GossipWorker(*state, jnp.float32(1.0 / num_workers), links)

  def local(worker: GossipWorker, batch):
    state, metrics = _local(problem, TrainState(*worker[:3]), batch)
    return worker._replace(**state._asdict()), metrics

  p = settings.gossip_probability
  return Gossip(init=init, local=local, send=lambda worker, peer: send(problem, worker, peer),
                receive=lambda worker, message: receive(problem, worker, message),
                evaluated=evaluated,
                bytes_per_step=num_workers * problem.message_bytes() * p, probability=p)


def check(settings, config) -> None:
  del settings
  pairwise.check(config, "gosgd")


SPEC = AlgorithmSpec("gosgd", "gossip: push to a random peer with --gossip-probability",
                     Gossip, build, GoSGDSettings, check=check)
