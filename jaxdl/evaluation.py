"""A task's evaluation on its test data, in batches, as the runner evaluates a
run's model."""
from __future__ import annotations

import jax
import numpy as np

from jaxdl.task import Task


class Evaluator:
  """The task's evaluation on its test data, in batches of up to `batch_size`
  examples (the last one smaller), averaged over examples: ``test_<metric>``."""

  def __init__(self, task: Task, batch_size: int = 1000):
    self._task, self._fn = task, jax.jit(task.evaluation)
    self._size = len(task.test) if task.test is not None else 0
    self._batch_size = min(batch_size, self._size)
    self._cached: list | None = None

  def _batches(self):
    if self._cached is not None:
      yield from self._cached
      return
    batches, nbytes = [], 0
    for start in range(0, self._size, self._batch_size):
      batch = self._task.test.gather(np.arange(start, min(start + self._batch_size,
                                                          self._size)))
      nbytes += sum(v.nbytes for v in batch.values())
      batches.append(batch)
      yield batch
    if nbytes <= 256 * 2**20:  # small test sets stay in memory
      self._cached = batches

  def __call__(self, params, model_state) -> dict[str, float]:
    if not self._size:
      return {}
    # Each batch's means weighed by its rows, summed where they are computed:
    # one fetch at the end, not one per batch.
    weighted = [jax.tree.map(lambda v, n=len(next(iter(batch.values()))): v * n,
                             self._fn(params, model_state, batch))
                for batch in self._batches()]
    sums = jax.device_get(jax.tree.map(lambda *v: sum(v), *weighted))
    means = {k: float(v) / self._size for k, v in sums.items()}
    if self._task.derived is not None:
      means.update(self._task.derived(means))
    return {f"test_{k}": v for k, v in means.items()}
