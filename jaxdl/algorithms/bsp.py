"""BSP: bulk synchronous parallel SGD with a (sharded) parameter server.

Each step every worker pulls w_t, computes g_m on its batch, and pushes it;
the server waits for all M, then applies w_{t+1} = w_t - lr * u(sum_m (b_m/B) g_m)
with ONE optimizer state (IPDPS'21, Ko et al. 2021, "BSP").

The server's parameters and optimizer state live flattened and split over the
workers: a pull is an all-gather, a push a reduce-scatter, and each slice's
update runs where the slice lives. Server shard s of --servers k owns the M/k
consecutive slices of workers s*M/k ... (s+1)*M/k - 1, i.e. 1/k of the
parameters and optimizer state. Because the server updates flat slices, the
optimizer must act elementwise (sgd, adam, adamw, rmsprop, ...); layer-wise
ones (lamb, lars, adafactor, ...) need ar_sgd.

With --compress, each worker pushes C(g_m + e_m), keeping its own residual
e_m (error feedback, in its `outbox`); the server sums the pushes as they
are. The pull stays whole: the server's parameters.

Versions read: every worker's gradient of step t reads w_t, the server's
parameters after all of step t - 1's pushes (the barrier).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

from jaxdl.algorithms.base import AlgorithmSpec, Problem, mean_over_workers
from jaxdl.algorithms.families import Collective
from jaxdl.errors import ConfigError

# Optimizers whose update of one coordinate reads only that coordinate.
LAYERWISE_OPTIMIZERS = frozenset({"lamb", "lars", "adafactor", "fromage", "novograd"})


class BSPState(NamedTuple):
  server_params: jax.Array  # (1, P_pad / M): this worker's slice of the server's flat parameters
  server_opt_state: Any     # the optimizer state of that slice
  model_state: Any          # this worker's batch-norm statistics
  outbox: Any               # the compression state of its pushes (--compress)


def _flat_layout(problem: Problem, num_workers: int):
  """(number of parameters, padded length divisible by M, unravel)."""
  shapes = jax.eval_shape(lambda: problem.init_model(jax.random.key(0))[0])
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  flat, unravel = ravel_pytree(zeros)
  size = flat.size
  return size, math.ceil(size / num_workers) * num_workers, unravel


def _flat(tree, length: int) -> jax.Array:
  """The tree's leaves raveled into one row (1, length), zero-padded.

  A row, not a vector: XLA's CPU code for a concatenation fused into a loop
  runs tens of times slower once the loop is split over threads, and a loop
  over a row of one is not split (a one-worker bsp step on the mlp took
  3-27 ms instead of 0.1 on two cores, BENCHMARKS.md).
  """
  leaves = jax.tree.leaves(tree)
  dtype = jnp.result_type(*leaves)
  row = jnp.concatenate([x.reshape(1, -1).astype(dtype) for x in leaves], axis=1)
  return jnp.pad(row, ((0, 0), (0, length - row.shape[1])))


def build(settings, problem: Problem, num_workers: int) -> Collective:
  del settings
  size, padded, unravel = _flat_layout(problem, num_workers)
  chunk = padded // num_workers

  def init(key, worker) -> BSPState:
    params, model_state = problem.init_model(key)
    server_params = lax.dynamic_slice(_flat(params, padded), (0, worker * chunk), (1, chunk))
    return BSPState(server_params, problem.optimizer.init(server_params), model_state,
                    problem.init_outbox(params, worker))

  def step(state: BSPState, batch, step, axis):
    del step
    params = unravel(axis.all_gather(state.server_params).reshape(-1)[:size])  # pull
    grads, model_state, metrics = problem.gradients(params, state.model_state, batch, axis)
    sent, outbox = problem.compress_message(grads, state.outbox)
    grad_slice = axis.psum_scatter(_flat(sent, padded), dimension=1)        # push
    updates, opt_state = problem.optimizer.update(grad_slice, state.server_opt_state,
                                                  state.server_params)
    return BSPState(optax.apply_updates(state.server_params, updates), opt_state,
                    model_state, outbox), metrics

  def evaluated(states: BSPState):
    """The server's parameters with the workers' mean batch-norm statistics."""
    return (unravel(states.server_params.reshape(-1)[:size]),
            mean_over_workers(states.model_state))

  # every worker pushes a gradient and pulls the parameters
  return Collective(init=init, step=step, evaluated=evaluated, sync="ps",
                    bytes_per_step=float(num_workers * (problem.message_bytes()
                                                        + problem.model_bytes())))


def check(settings, config) -> None:
  del settings
  workers, servers = config.algorithm.workers, config.cluster.servers
  if servers < 1 or servers > workers or workers % servers:
    raise ConfigError("servers", servers, f"a divisor of --workers {workers}")
  optimizer = config.optim.optimizer or "sgd"  # bsp has no recipe of its own
  if optimizer in LAYERWISE_OPTIMIZERS:
    raise ConfigError("optimizer", optimizer,
                      "an elementwise optimizer for bsp, whose server updates flat "
                      "slices (use --algorithm ar_sgd for layer-wise ones)")


SPEC = AlgorithmSpec("bsp", "bulk synchronous parallel with a sharded parameter server",
                     Collective, build, check=check, server=True)
