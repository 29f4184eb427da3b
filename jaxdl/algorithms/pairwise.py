"""Pairwise references: compressed gossip between random pairs of workers.

CHOCO-SGD (Koloskova, Stich, Jaggi, "Decentralized Stochastic Optimization
and Gossip Algorithms with Compressed Communication", ICML 2019) sends
compressed differences from public copies that a worker's neighbours hold.
With a random peer each time (GoSGD, AD-PSGD), the copy is kept per ordered
pair: for each m -> k a reference r_{m->k}, held by both m (in `sent`, row k)
and k (in `received`, row m). A message from m to k is

    q = C(x_m - r_{m->k}),    and both sides set  r_{m->k} <- r_{m->k} + q,

with the compressor's own draws and memory (PowerSGD's Q per pair, warm
started by the pair's last message). The receiver uses r_{m->k}, its
reconstruction of x_m, wherever the uncompressed algorithm used x_m.

Error feedback without a residual: what C left out of a message is still in
x_m - r_{m->k}, and goes out in m's next messages to k; a separate residual
would count it twice. Every reference starts at the common initial model
x_0 (every worker starts there), so the first message carries x_m - x_0, the
progress so far, rather than the whole model: zeros would make a sparse
first message a model of mostly zeros, which the receiver would merge.

Both copies of r_{m->k} hold the same bits once the messages sent on the
pair have arrived: each side adds the same q to the same reference, in the
order sent (a pair's messages arrive in that order: its links are FIFO).

Memory: 2 M references per worker, 2 M^2 copies of the model in all, kept
only with --compress (MAX_WORKERS bounds M).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxdl.algorithms import compression
from jaxdl.errors import ConfigError

MAX_WORKERS = 32
"""The most workers whose pairwise references a run keeps (2 M^2 = 2,048 models at 32)."""


class Links(NamedTuple):
  """A worker's side of its pairs: its own index and both ends' references."""
  index: jax.Array  # int32: this worker's index m (a message names its sender)
  sent: Any         # like the params, each leaf M x ...: row k is r_{m->k}
  received: Any     # row k is r_{k->m}: worker k's model as this worker knows it
  memory: tuple     # per leaf, M x ...: the compressor's memory of pair m -> k (or None)
  key: jax.Array    # uint32 raw key data (jax.random.key_data) of the next message's draws


def _row(tree, k):
  return jax.tree.map(lambda x: lax.dynamic_index_in_dim(x, k, keepdims=False), tree)


def _set_row(tree, k, row):
  return jax.tree.map(lambda x, r: lax.dynamic_update_index_in_dim(x, r, k, 0), tree, row)


def sent_to(links: Links, peer):
  """r_{m->peer}: this worker's model as `peer` knows it."""
  return _row(links.sent, peer)


def init(compress: str, params, worker, num_workers: int, seed: int = 0) -> Links:
  """Worker `worker`'s links: every reference the common initial model
  `params`, its own draws (its index folded into the seed's key)."""
  stack = lambda x: jnp.broadcast_to(x, (num_workers, *jnp.shape(x)))
  memory = compression.init_memory(compress, params, seed)
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 2), worker)
  references = jax.tree.map(stack, params)
  return Links(jnp.asarray(worker, jnp.int32), references, references,
               tuple(None if m is None else stack(m) for m in memory),
               jax.random.key_data(key))


def of_worker(problem, params, worker, num_workers: int):
  """A worker's links under `problem` (an algorithms.Problem): `init` with
  --compress, () without (no references kept)."""
  if not problem.compresses:
    return ()
  return init(problem.compress, params, worker, num_workers, problem.seed)


def encode(compress: str, links: Links, params, peer) -> tuple[Links, Any]:
  """The message to `peer`, q = C(x - r_{m->peer}) as its payload
  (compression.encode), and the links with r_{m->peer} <- r_{m->peer} + q
  (and the pair's memory, the next key)."""
  key, draw = jax.random.split(jax.random.wrap_key_data(links.key))
  memory = tuple(None if m is None else lax.dynamic_index_in_dim(m, peer, keepdims=False)
                 for m in links.memory)
  # q as sent, decoded to the bits the receiver adds to its copy (compression.toward)
  q, reference, memory = compression.toward(compress, params, _row(links.sent, peer), draw,
                                            memory)
  memory = tuple(None if m is None else lax.dynamic_update_index_in_dim(old, m, peer, 0)
                 for old, m in zip(links.memory, memory))
  sent = _set_row(links.sent, peer, reference)
  return links._replace(sent=sent, memory=memory, key=jax.random.key_data(key)), q


def decode(compress: str, links: Links, q, sender) -> tuple[Links, Any]:
  """A message q (a payload) from `sender` arrives: (the links with
  r_{sender->m} <- r_{sender->m} + q, that reference: the receiver's
  reconstruction of x_sender)."""
  reference = compression.moved(compress, _row(links.received, sender), q)
  return links._replace(received=_set_row(links.received, sender, reference)), reference


def check(config, algorithm: str) -> None:
  """A ConfigError naming --workers for more than MAX_WORKERS with --compress."""
  workers = config.algorithm.workers
  if compression.parse_compress(config.algorithm.compress).name != "none" and (
      workers > MAX_WORKERS):
    raise ConfigError("workers", workers, f"at most {MAX_WORKERS} for {algorithm} with "
                      f"--compress {config.algorithm.compress} (each ordered pair of workers "
                      "keeps a reference model on both sides: 2 M^2 copies of the model)")
