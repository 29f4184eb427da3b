"""Each pipeline stage's own work in a step, timed alone on its device: over
a run's step time, each device's busy fraction (jaxdl.engines.mesh)."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdl.parallel.pipeline.stages import Stages


def stage_seconds(stages: Stages, microbatches: int, micro_batch: int, devices,
                  repeats: int = 5) -> list[float]:
  """Each stage's own work in a step, timed alone on its device (`devices[s]`):
  m forwards and m backwards, each backward recomputing its forward, on
  micro-batches of `micro_batch` examples (random parameters and inputs;
  the median of `repeats` runs after a compile). A step's time over these
  is what its bubble, imbalance and messages add."""
  key = jax.random.key(0)
  seconds = []
  for s in range(stages.count):
    run = stages.on_rows(s)

    def work(row, state_row, micro, cotangents, run=run):
      def one(carry, xs):
        state_row, grad = carry
        x, cotangent = xs
        _, state_row = run(row, state_row, x)
        _, pull = jax.vjp(lambda r, a: run(r, state_row, a)[0], row, x)
        return (state_row, grad + pull(cotangent)[0]), None
      return jax.lax.scan(one, (state_row, jnp.zeros_like(row)), (micro, cotangents))[0]

    keys = jax.random.split(jax.random.fold_in(key, s), 3)
    shape = (microbatches, micro_batch, stages.width)
    arguments = jax.device_put((
        0.01 * jax.random.normal(keys[0], (max(stages.sizes),), stages.dtype),
        jnp.zeros((max(stages.state_sizes, default=0),), stages.dtype),
        jax.random.normal(keys[1], shape, stages.dtype),
        jax.random.normal(keys[2], shape, stages.dtype)), devices[s])
    compiled = jax.jit(work).lower(*arguments).compile()
    jax.block_until_ready(compiled(*arguments))
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(compiled(*arguments))
      times.append(time.perf_counter() - start)
    seconds.append(float(np.median(times)))
  return seconds
