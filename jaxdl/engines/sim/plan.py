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
  # A batched op's workers: the K computing ones, or all M with `mask` (which
  # of them compute) once the op runs over every worker (`batch_size`); and
  # each one's data step. Arrays of K, not M, entries: a step of gossip at
  # M = 4,096 workers plans thousands of batched ops of a few workers each.
  workers: np.ndarray | None = None
  steps: np.ndarray | None = None
  mask: np.ndarray | None = None
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
              else batch_size(computing(op), num_workers))
      out.append(Segment(op.kind, size, start, 1))
    else:
      while end < len(ops) and ops[end].kind == op.kind:
        end += 1
      # (a lone op outside a loop: XLA may round an update otherwise in one)
      out.append(Segment(op.kind, 0 if end - start == 1 else None, start, end - start))
    start = end
  return out


def computing(op: Op) -> int:
  """How many workers a batched op computes for."""
  return len(op.workers) if op.mask is None else int(op.mask.sum())


def signature(segments: Sequence[Segment]) -> tuple:
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
  everyone = np.arange(num_workers, dtype=np.int32)
  queued: dict[int, list[int]] = {}  # a worker's local steps not yet run, by worker
  ops: list[Op] = []

  def batched(kind, workers, steps, every_step):
    """An op of the sorted `workers` reading their data `steps`; over all M
    workers, if it runs over them, where the others read `every_step()`."""
    workers, steps = np.asarray(workers, np.int32), np.asarray(steps, np.int32)
    if one_at_a_time:
      for w, step in zip(workers, steps):
        ops.append(Op(f"{kind}_one", worker=int(w), workers=np.array([w], np.int32),
                      steps=np.array([step], np.int32)))
    elif batch_size(len(workers), num_workers) < num_workers:
      ops.append(Op(kind, workers=workers, steps=steps))
    else:
      mask, all_steps = np.zeros(num_workers, bool), every_step()
      mask[workers], all_steps[workers] = True, steps
      ops.append(Op(kind, workers=everyone, steps=all_steps, mask=mask))

  def flush():
    while queued:
      workers = sorted(queued)
      batched("local", workers, [queued[w][0] for w in workers],
              lambda: np.zeros(num_workers, np.int32))
      for w in workers:
        queued[w].pop(0)
        if not queued[w]:
          del queued[w]

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
        every_step = lambda: np.maximum(iteration, 0).astype(np.int32)
        workers = np.flatnonzero(pending)
        batched("compute", workers, iteration[workers], every_step)
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
      queued.setdefault(m, []).append(event.iteration)
    elif kind == "exchange":
      if m in queued:
        flush()
      ops.append(Op("exchange", m))
    elif kind == "step":
      ops.append(Op("step", iteration=event.iteration, workers=everyone,
                    steps=np.full(num_workers, event.iteration, np.int32)))
    elif kind == "send":  # the sender's local steps come first: they are in the message
      if m in queued:
        flush()
      ops.append(Op("send", m, peer=event.peer, slot=slots[index - 1]))
    elif kind == "gossip":  # as the receiver is on arrival
      if event.peer in queued:
        flush()
      ops.append(Op("receive", event.peer, peer=m, slot=slots[index - 1]))
    elif kind == "average":
      if m in queued or event.peer in queued:
        flush()
      ops.append(Op("pair", m, peer=event.peer))
  flush()
  return ops


class Sizes(NamedTuple):
  longest: int     # the most ops in a step
  batch_ops: int   # the most batched ops in a step
  signatures: Counter  # how many steps have each signature (segments' kinds and sizes)


def plan_sizes(events: Sequence, step_ends: Sequence[int], num_workers: int,
               one_at_a_time: bool, slots: Sequence[int] = ()) -> Sizes:
  """A dry run of every step's plan, so that op arrays have one shape and
  each program compiles once."""
  iteration, computed = np.full(num_workers, -1), np.zeros(num_workers, bool)
  longest = batch_ops = 1
  signatures = Counter()
  for start, end in zip([0] + [e + 1 for e in step_ends], step_ends):
    ops = plan(events, start, end, iteration, computed, one_at_a_time, slots)
    longest = max(longest, len(ops))
    batch_ops = max(batch_ops, sum(op.steps is not None for op in ops))
    signatures[signature(segments(ops, num_workers))] += 1
  return Sizes(longest, batch_ops, signatures)
