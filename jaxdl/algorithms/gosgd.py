"""GoSGD: gossip SGD, asynchronous and decentralized (Blot et al. 2016).

Worker m keeps x_m and a weight a_m (1/M at the start). After each local step,
with probability p = --gossip-probability it pushes to one random peer k:
    a_m <- a_m / 2, and it sends (x_m, a_m);
    on arrival:  x_k <- (a_k x_k + a_m x_m) / (a_k + a_m);  a_k <- a_k + a_m
The weights always sum to 1 and sum_m a_m x_m is unchanged by a gossip. The
evaluated model is that weighted average, sum_m a_m x_m (batch-norm
statistics averaged the same way).

--compress is refused: a message is the sender's whole model, decided at
the push without knowing the receiver's, which merges it as a model. A
compressed model (most coordinates zero, or rounded) would pull the
receiver toward it; a compressed model difference needs a model both sides
hold, and a random peer each time means a copy of every peer's model per
worker (CHOCO-SGD's public copies), which GoSGD does not keep.

Versions read: `send` decides the message, (x_m, a_m) as they are at the
push; `receive` merges that message into the receiver as it is on arrival.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxdl.algorithms.base import AlgorithmSpec, Problem, TrainState
from jaxdl.algorithms.easgd import local as _local
from jaxdl.algorithms import compression
from jaxdl.algorithms.shapes import Gossip
from jaxdl.settings import Settings, require, setting


class GossipWorker(NamedTuple):
  params: Any
  model_state: Any
  opt_state: Any
  weight: jax.Array  # a_m, float32


class Message(NamedTuple):
  params: Any
  model_state: Any
  weight: jax.Array  # the half of a_m that travels


@dataclasses.dataclass(frozen=True)
class GoSGDSettings(Settings):
  gossip_probability: float = setting(0.1, symbol="p")
  """GoSGD's p: probability that a worker gossips after a local step."""

  def validate(self) -> None:
    p = self.gossip_probability
    require("gossip_probability", p, 0 <= p <= 1, "a probability in [0, 1]")


def send(sender: GossipWorker) -> tuple[GossipWorker, Message]:
  """The sender halves its weight and sends its model with that half."""
  a = sender.weight / 2
  return sender._replace(weight=a), Message(sender.params, sender.model_state, a)


def receive(receiver: GossipWorker, message: Message) -> GossipWorker:
  """The weighted merge of a message into the receiver."""
  total = receiver.weight + message.weight
  merge = lambda xk, xm: (receiver.weight * xk + message.weight * xm) / total
  return receiver._replace(params=jax.tree.map(merge, receiver.params, message.params),
                           model_state=jax.tree.map(merge, receiver.model_state,
                                                    message.model_state),
                           weight=total)


def evaluated(workers: GossipWorker):
  a = workers.weight / workers.weight.sum()
  average = lambda x: jnp.tensordot(a, x, axes=1)
  return jax.tree.map(average, workers.params), jax.tree.map(average, workers.model_state)


def build(settings: GoSGDSettings, problem: Problem, num_workers: int) -> Gossip:
  def init(key, worker) -> GossipWorker:
    return GossipWorker(*problem.init_state(key), jnp.float32(1.0 / num_workers))

  def local(worker: GossipWorker, batch):
    state, metrics = _local(problem, TrainState(*worker[:3]), batch)
    return GossipWorker(*state, worker.weight), metrics

  p = settings.gossip_probability
  return Gossip(init=init, local=local, send=send, receive=receive, evaluated=evaluated,
                bytes_per_step=num_workers * problem.model_bytes() * p, probability=p)


def check(settings, config) -> None:
  del settings
  compression.refuse(config.algorithm.compress, "gosgd",
                     "its message is the sender's whole model, merged as a model by a "
                     "random peer that holds no reference to take a compressed difference "
                     "from")


SPEC = AlgorithmSpec("gosgd", "gossip: push to a random peer with --gossip-probability",
                     Gossip, build, GoSGDSettings, check=check)
