"""The trace of a run: timed events, written by every engine as trace.jsonl.

A schedule is a list of events in the order their math must happen (the order
in which the server, or the peer, processes them); the times are virtual
seconds from the cost model, or wall seconds in a recorded real run. The sim
engine executes the math of a schedule event by event, so a schedule fully
determines the parameters: same schedule, same bits.

Event kinds, by the family of the algorithm's communication
(`Event.kind`, what the math does, who is involved):

  centralized (asp, ssp, dc_asgd, lc_asgd):
    "pull"   worker reads the server's parameters (version = applies so far)
             and starts its iteration `iteration` on them
    "apply"  the server applies the gradient of `worker`'s iteration
             `iteration` (computed on what that worker last pulled)
  elastic (easgd):
    "local"  worker takes local step `iteration` on its own parameters
    "exchange"  worker and the center do the elastic update
  gossip (gosgd):
    "local"  worker takes local step `iteration`
    "send"   after that step, worker halves its weight and sends (x, a) to
             `peer`: the message is fixed here and held in flight
    "gossip" the message worker sent after step `iteration` arrives, and
             `peer` merges it (the sender itself, on a real engine, when
             the receiver's process had died: no weight is lost)
  decentralized (ad_psgd):
    "pull"   worker reads its own parameters and starts iteration `iteration`
             on that snapshot
    "average"  worker and `peer` average their parameters atomically
    "apply"  worker applies the gradient of iteration `iteration` to its own
             parameters
  synchronous (bsp, ar_sgd, local_sgd):
    "step"   all workers take global step `iteration` together
    "partition"  from global step `iteration` on, worker m's share of the
             global batch is `sizes[m]` (--partition proportional or
             adaptive: the sizes sum to B; jaxdl.partition)

"wait" events (a worker idle, e.g. blocked by SSP's bound, at a barrier, or
a GoSGD push waiting for the merge of the worker's last message)
carry no math and only feed the statistics; neither does a parameter
server's "restart" (a real engine's worker process failed and was restarted
at its clock `iteration`; it pulls again). A "restart" that names a `peer`
(a worker that kept its own model: easgd, gosgd, ad_psgd) gives the
restarted worker a copy of that peer's whole state at that point.

A training step is one global batch of samples on every engine, B = the sum
of the workers' batch sizes: a synchronous "step" event processes B, and an
asynchronous run's step ends with the update ("apply" or "local") at which
the samples all workers have processed together reach the next multiple of
B, however many updates of which workers that took. An epoch is
`steps_per_epoch` such steps (the training set once, see
jaxdl.data.WorkerStreams).
"""
from __future__ import annotations

import collections
import dataclasses
import json
from typing import Iterable, Iterator, Sequence

import numpy as np

KINDS = ("pull", "apply", "local", "exchange", "send", "gossip", "average", "step", "wait",
         "restart", "partition")


@dataclasses.dataclass(frozen=True)
class Event:
  time: float            # virtual seconds when the event takes effect
  kind: str              # one of KINDS
  worker: int            # -1 for "step" (all workers)
  iteration: int = -1    # the worker's iteration (its clock) the event belongs to
  peer: int = -1         # the other worker of "gossip" / "average"
  duration: float = 0.0  # "wait": seconds idle; centralized "pull": transfer
                         # seconds, "apply": compute seconds; on a real engine
                         # also "local" and AD-PSGD's "pull": compute seconds
                         # (no math reads these); otherwise 0
  version: int = -1      # server version read ("pull") or produced ("apply")
  sizes: tuple[int, ...] = ()  # "partition": each worker's batch size

  def to_json(self) -> str:
    return json.dumps({k: v for k in FIELDS if (v := getattr(self, k)) != -1
                       and not (k == "duration" and v == 0.0) and v != ()})

  @staticmethod
  def from_json(line: str) -> Event:
    # to_json leaves out every -1, the worker of a "step" event included.
    fields = {"worker": -1, **json.loads(line)}
    if "sizes" in fields:
      fields["sizes"] = tuple(fields["sizes"])
    return Event(**fields)


FIELDS = tuple(f.name for f in dataclasses.fields(Event))


def write_trace(path, events: Iterable[Event], append: bool = False) -> None:
  """Writes `events` to a trace.jsonl (after those it holds: `append`; a run
  writes its own through `jaxdl.rundir.save_trace`)."""
  with open(path, "a" if append else "w") as f:
    for event in events:
      f.write(event.to_json() + "\n")


def read_trace(path, torn_tail: bool = False) -> Iterator[Event]:
  """The events of a trace.jsonl; a ValueError names the first line that is
  not an event. `torn_tail`: a last line without its newline, an append that
  a killed process left half written (`jaxdl.rundir.save_trace`), is left out."""
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if torn_tail and not line.endswith("\n"):
        return
      if not line.strip():
        continue
      try:
        event = Event.from_json(line)
      except (ValueError, TypeError) as e:
        raise ValueError(f"line {number}: {str(e).splitlines()[0]}") from None
      if event.kind not in KINDS:
        raise ValueError(f"line {number}: unknown kind {event.kind!r}")
      yield event


def step_ends(events: Sequence[Event], batch_sizes: Sequence[int] | int) -> list[int]:
  """Index of the event that completes each training step (see above).

  `batch_sizes`: the workers' batch sizes; an int M counts every worker's
  update as 1, so that a step is M updates.
  """
  equal = isinstance(batch_sizes, int)
  total, ends, done = batch_sizes if equal else sum(batch_sizes), [], 0
  for i, e in enumerate(events):
    if e.kind == "step":
      done += total
    elif e.kind in ("apply", "local"):
      done += 1 if equal else batch_sizes[e.worker]
    else:
      continue
    if done >= (len(ends) + 1) * total:  # one update is at most B: one step at most
      ends.append(i)
  return ends


def summarize(events: Sequence[Event], num_workers: int,
              bytes_total: float | None = None) -> dict:
  """Statistics of a schedule: time, updates, staleness, waiting and traffic.

  Staleness of an "apply" = version it produced - 1 - version its worker
  pulled for that iteration (the updates that landed in between); only
  centralized schedules, whose pulls carry versions, have it.
  """
  counts = collections.Counter(e.kind for e in events)
  pulled, staleness, wait = {}, collections.Counter(), [0.0] * num_workers
  per_worker = [counts["step"]] * num_workers
  for e in events:
    if e.kind in ("apply", "local"):
      per_worker[e.worker] += 1
    if e.kind == "pull" and e.version >= 0:
      pulled[e.worker, e.iteration] = e.version
    elif e.kind == "apply" and (e.worker, e.iteration) in pulled:
      staleness[e.version - 1 - pulled.pop((e.worker, e.iteration))] += 1
    elif e.kind == "wait":
      wait[e.worker] += e.duration
  time = events[-1].time if events else 0.0
  batches = counts["apply"] + counts["local"] + counts["step"] * num_workers
  n = sum(staleness.values())
  if bytes_total is None:
    bytes_total = getattr(events, "bytes_total", None)
  return {
      "simulated_time_s": time,
      "counts": dict(sorted(counts.items())),
      "updates": counts["apply"] + counts["step"] + counts["exchange"],
      "batches": batches,
      "batches_per_worker": per_worker,
      "batches_per_s": batches / time if time > 0 else 0.0,
      "staleness_mean": sum(k * v for k, v in staleness.items()) / n if n else None,
      "staleness_max": max(staleness) if n else None,
      "staleness_histogram": dict(sorted(staleness.items())),
      "wait_s": wait,
      "wait_total_s": sum(wait),
      # the workers' time idle (waiting), over all their time
      "idle_fraction": sum(wait) / (num_workers * time) if time > 0 else 0.0,
      "queued_s": list(getattr(events, "queued_s", ())),
      "bytes_total": bytes_total,
  }


def batch_time_figures(seconds: Sequence[Sequence[float]], bins: int = 20) -> dict:
  """Each worker's batch times (`seconds[m]`, one per batch) as summary
  figures: mean, standard deviation, 5th and 95th percentiles, and a
  histogram over edges common to all workers."""
  if not seconds or not all(len(s) for s in seconds):
    return {}
  lo, hi = min(min(s) for s in seconds), max(max(s) for s in seconds)
  edges = np.linspace(lo, hi, bins + 1) if hi > lo else np.asarray([lo, lo + 1.0])
  return {
      "batch_seconds_per_worker": [float(np.mean(s)) for s in seconds],
      "batch_seconds_std": [float(np.std(s)) for s in seconds],
      "batch_seconds_p05": [float(np.percentile(s, 5)) for s in seconds],
      "batch_seconds_p95": [float(np.percentile(s, 95)) for s in seconds],
      "batch_seconds_histogram": {"edges": edges.tolist(),
                                  "counts": [np.histogram(s, edges)[0].tolist()
                                             for s in seconds]},
  }
