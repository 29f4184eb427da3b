"""After which steps a run logs, evaluates and checkpoints: the runner's
cadence, which an engine whose state lives in other processes reads too (to
gather that state only at the steps the runner reads it)."""
from __future__ import annotations

import dataclasses
from typing import Any

AT_THE_END = 10**9
"""A log_every, eval_every or checkpoint_every that no run reaches: once,
after its last step."""


@dataclasses.dataclass(frozen=True)
class Cadence:
  """After which steps the runner logs, evaluates and checkpoints; `done`
  counts the steps done (1 after the first)."""
  total_steps: int
  log_every: int
  eval_every: int
  checkpoint_every: int

  @classmethod
  def of(cls, fields: Any, steps_per_epoch: int, total_steps: int) -> Cadence:
    """The cadence of a run's log_every, eval_every and checkpoint_every
    (`fields`: the config's train section, or an engine's slice of the
    config that holds them)."""
    return cls(total_steps, fields.log_every, fields.eval_every or steps_per_epoch,
               fields.checkpoint_every or steps_per_epoch)

  def evaluates(self, done: int) -> bool:
    return done % self.eval_every == 0 or done == self.total_steps

  def logs(self, done: int) -> bool:
    return done % self.log_every == 0 or self.evaluates(done)  # also at the last step

  def checkpoints(self, done: int) -> bool:
    return done % self.checkpoint_every == 0 or done == self.total_steps

  def observes(self, done: int) -> bool:
    """Whether the runner reads the run's state after `done` steps (to
    evaluate it, check it for divergence or checkpoint it)."""
    return self.logs(done) or self.checkpoints(done)
