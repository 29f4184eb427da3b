"""A step's events as ops, planned on the host from the schedule alone.

An op is one handler call: its kind, its worker (and peer), and the batches
it reads. Which workers' gradients are computed together depends on the
order of events, never on values: all workers whose gradient is pending when
one of them must apply it are computed at once ("compute", one op batched
over workers), or one at a time ("compute_one") when the engine runs
gradients singly. A push followed by the same worker's next pull is one
"apply_pull" op, as in a parameter server's round trip.
"""
from __future__ import annotations

from collections import Counter
from typing import NamedTuple, Sequence

import numpy as np


class Op(NamedTuple):
  """One handler call, as planned on the host."""
  kind: str
  worker: int = 0
  peer: int = 0
  iteration: int = 0
  durations: tuple[float, float] = (0.0, 0.0)  # the event's (and a fused pull's)
  mask: tuple[bool, ...] | None = None          # which workers a batched op updates
  pairs: tuple | None = None                    # per worker: (worker, data step) or None
  slot: int = 0                                 # the in-flight message's slot


class Segment(NamedTuple):
  """A run of consecutive ops of one cheap kind, or one batched op."""
  kind: str
  size: int | None  # a batched op's rows K (handlers.BatchArrays); cheap: None, 0 alone
  start: int        # its first op
  count: int


BATCH_KINDS = ("compute", "compute_one", "local", "local_one", "step")


def batch_size(count: int, num_workers: int) -> int:
  """The rows K of a batched op of `count` computing workers: the next power
  of two (few shapes to compile), or all M workers, masked, once that is
  more than a quarter of them (a gather and a write-back then cost more
  than the gradients they spare)."""
  k = 1 << max(count - 1, 0).bit_length()
  return num_workers if 4 * k > num_workers else k


def segments(ops: Sequence[Op], num_workers: int) -> list[Segment]:
  """A step's ops as segments, in order."""
  out, start = [], 0
  while start < len(ops):
    op, end = ops[start], start + 1
    if op.kind in BATCH_KINDS:
      size = (1 if op.kind.endswith("_one") else num_workers if op.kind == "step"
              else batch_size(sum(op.mask), num_workers))
      out.append(Segment(op.kind, size, start, 1))
    else:
      while end < len(ops) and ops[end].kind == op.kind:
        end += 1
      # (a lone op outside a loop: XLA may round an update otherwise in one)
      out.append(Segment(op.kind, 0 if end - start == 1 else None, start, end - start))
    start = end
  return out


def shape(segments: Sequence[Segment]) -> tuple:
  """What a program that runs these segments is specialized on."""
  return tuple((s.kind, s.size) for s in segments)


def message_slots(events: Sequence) -> tuple[list[int], int]:
  """The in-flight buffer's slot of each gossip message (-1 for other events),
  the lowest free one when it is sent, and the buffer's size (the most
  messages in flight at once, at least 1)."""
  slots, sent, free, size = [-1] * len(events), {}, [], 0
  for i, e in enumerate(events):
    if e.kind == "send":
      if not free:
        free.append(size)
        size += 1
      free.sort()
      slots[i] = sent[e.worker, e.iteration] = free.pop(0)
    elif e.kind == "gossip":
      if (e.worker, e.iteration) not in sent:
        raise ValueError(f"event {i}: a gossip message of worker {e.worker}, iteration "
                         f"{e.iteration}, that was never sent")
      slots[i] = sent.pop((e.worker, e.iteration))
      free.append(slots[i])
  return slots, max(size, 1)


def plan(events: Sequence, start: int, end: int, iteration: np.ndarray,
         computed: np.ndarray, one_at_a_time: bool, slots: Sequence[int] = ()) -> list[Op]:
  """The ops of events[start:end + 1]; updates the bookkeeping in place.
  `slots`: message_slots(events)[0], for gossip."""
  num_workers = len(iteration)
  queued: list[list[int]] = [[] for _ in range(num_workers)]
  ops: list[Op] = []

  def batched(kind, mask, steps):
    if one_at_a_time:
      for w in np.flatnonzero(mask):
        pairs = tuple((w, steps[w]) if v == w else None for v in range(num_workers))
        ops.append(Op(f"{kind}_one", worker=int(w), pairs=pairs))
    else:
      ops.append(Op(kind, mask=tuple(bool(x) for x in mask),
                    pairs=tuple(enumerate(steps))))

  def flush():
    while any(queued):
      batched("local", [bool(q) for q in queued], [q[0] if q else 0 for q in queued])
      for q in queued:
        if q:
          q.pop(0)

  index = start
  while index <= end:
    event = events[index]
    index += 1
    m, kind = event.worker, event.kind
    if kind == "pull":
      ops.append(Op("pull", m, durations=(event.duration, 0.0)))
      iteration[m], computed[m] = event.iteration, False
    elif kind == "apply":
      if not computed[m]:
        pending = (iteration >= 0) & ~computed
        batched("compute", pending, [max(int(c), 0) for c in iteration])
        computed |= pending
      following = events[index] if index <= end else None
      if following is not None and following.kind == "pull" and following.worker == m:
        # A push and the same worker's next pull, as in a parameter server's
        # round trip: one op.
        ops.append(Op("apply_pull", m, durations=(event.duration, following.duration)))
        iteration[m], computed[m] = following.iteration, False
        index += 1
      else:
        ops.append(Op("apply", m, durations=(event.duration, 0.0)))
        computed[m], iteration[m] = False, -1
    elif kind == "local":
      queued[m].append(event.iteration)
    elif kind == "exchange":
      if queued[m]:
        flush()
      ops.append(Op("exchange", m))
    elif kind == "step":
      ops.append(Op("step", iteration=event.iteration,
                    pairs=tuple((w, event.iteration) for w in range(num_workers))))
    elif kind == "send":  # the sender's local steps come first: they are in the message
      if queued[m]:
        flush()
      ops.append(Op("send", m, peer=event.peer, slot=slots[index - 1]))
    elif kind == "gossip":  # as the receiver is on arrival
      if queued[event.peer]:
        flush()
      ops.append(Op("receive", event.peer, peer=m, slot=slots[index - 1]))
    elif kind == "average":
      if queued[m] or queued[event.peer]:
        flush()
      ops.append(Op("pair", m, peer=event.peer))
  flush()
  return ops


class Sizes(NamedTuple):
  longest: int     # the most ops in a step
  batch_ops: int   # the most batched ops in a step
  shapes: Counter  # how many steps have each shape of segments


def plan_sizes(events: Sequence, step_ends: Sequence[int], num_workers: int,
               one_at_a_time: bool, slots: Sequence[int] = ()) -> Sizes:
  """A dry run of every step's plan, so that op arrays have one shape and
  each program compiles once."""
  iteration, computed = np.full(num_workers, -1), np.zeros(num_workers, bool)
  longest = batch_ops = 1
  shapes = Counter()
  for start, end in zip([0] + [e + 1 for e in step_ends], step_ends):
    ops = plan(events, start, end, iteration, computed, one_at_a_time, slots)
    longest = max(longest, len(ops))
    batch_ops = max(batch_ops, sum(op.pairs is not None for op in ops))
    shapes[shape(segments(ops, num_workers))] += 1
  return Sizes(longest, batch_ops, shapes)
