"""Pipeline schedules' slots: what each of p stages does in each slot of a
step of m micro-batches (GPipe, 1F1B), what a stage holds meanwhile, and
the bubble: (p - 1) of m + p - 1 ticks."""
from __future__ import annotations

import numpy as np


IDLE, FORWARD, BACKWARD = 0, 1, 2


SCHEDULES = ("gpipe", "1f1b")


def schedule(kind: str, stages: int, microbatches: int) -> np.ndarray:
  """A pipeline schedule's slots: (T, p, 2) int, [t, s] = (what stage s does
  in slot t: IDLE, FORWARD or BACKWARD, of which micro-batch).

  gpipe: every stage takes all m forwards, then all m backwards (m
  micro-batches' inputs kept a stage). 1f1b (PipeDream-flush): stage s takes
  min(p - 1 - s, m) forwards, then alternates a forward and a backward, then
  the backwards left (at most p kept). An operation waits for what it needs
  (the stage before's forward, the stage after's backward, its own forward)
  from an earlier slot. Both take T = 2 (m + p - 1) slots: the same bubble."""
  if kind not in SCHEDULES:
    raise ValueError(f"schedule {kind!r}: one of {', '.join(SCHEDULES)}")
  p, m = stages, microbatches
  orders = []
  for s in range(p):
    warm = m if kind == "gpipe" else min(p - 1 - s, m)
    order = [(FORWARD, i) for i in range(warm)]
    for i in range(m - warm):
      order += [(FORWARD, warm + i), (BACKWARD, i)]
    order += [(BACKWARD, i) for i in range(m - warm, m)]
    orders.append(order)
  done: dict[tuple[int, int, int], int] = {}  # (op, micro-batch, stage) -> its slot
  slots, position = [], [0] * p
  while any(position[s] < 2 * m for s in range(p)):
    t, row = len(slots), []
    for s in range(p):
      if position[s] == 2 * m:
        row.append((IDLE, 0))
        continue
      op, i = orders[s][position[s]]
      need = ((FORWARD, i, s - 1) if op == FORWARD and s > 0 else
              (BACKWARD, i, s + 1) if op == BACKWARD and s < p - 1 else
              (FORWARD, i, s) if op == BACKWARD else None)
      if need is None or done.get(need, t) < t:
        row.append((op, i))
      else:
        row.append((IDLE, 0))
    for s, (op, i) in enumerate(row):
      if op != IDLE:
        done[(op, i, s)] = t
        position[s] += 1
    slots.append(row)
  return np.asarray(slots, np.int32)


def held(table: np.ndarray) -> int:
  """The most micro-batches a stage holds at once in a schedule: inputs kept
  from a forward to its backward, activations and cotangents received and
  not yet used. Each is a run of consecutive micro-batches, so buffers of
  this many rows, indexed by micro-batch mod it, never collide."""
  p = table.shape[1]
  slot = {(int(o), int(i), s): t for t in range(len(table)) for s in range(p)
          for o, i in [table[t, s]] if o != IDLE}
  m = max(i for _, i, _ in slot) + 1
  most = 0
  for s in range(p):
    # each buffer's spans (from, to], one per micro-batch: held after `from`, up to
    # `to`: inputs kept, activations received, cotangents received
    buffers = [[(slot[(FORWARD, i, s)], slot[(BACKWARD, i, s)]) for i in range(m)]]
    if s > 0:
      buffers.append([(slot[(FORWARD, i, s - 1)], slot[(FORWARD, i, s)]) for i in range(m)])
    if s < p - 1:
      buffers.append([(slot[(BACKWARD, i, s + 1)], slot[(BACKWARD, i, s)]) for i in range(m)])
    for spans in buffers:
      held_at = np.zeros(len(table) + 1, int)
      for start, end in spans:  # held in slots start + 1 ... end
        held_at[start + 1:end + 1] += 1
      most = max(most, int(held_at.max()))
  return most


def bubble_fraction(stages: int, microbatches: int) -> float:
  """The share of a stage's ticks in which it has no micro-batch: (p - 1) / (m + p - 1)."""
  return (stages - 1) / (microbatches + stages - 1)
