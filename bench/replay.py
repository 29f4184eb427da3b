"""Replaying a real engine's trace one event at a time (the sim engine's
"events" batching): jaxdl's EventReplay against the same replay moving each
worker's state in and out of the stacked states op by op (eager indexing:
a gather or a scatter dispatched per leaf), as it did before.

Both arms run the same events (a schedule of the algorithm with M workers
on the mlp, from the sim engine's cost model), the same jitted event
programs, in one process, interleaved; the ratio is per event, and the
final states of the two arms must be bitwise equal (exit 1 otherwise).

  python -m bench.replay                            # ad_psgd and gosgd, 2 workers
  python -m bench.replay --algorithms asp --workers 8
"""
from __future__ import annotations

import dataclasses
import statistics
import sys

import jax
import numpy as np
import tyro

from bench.timing import interleaved, machine, report
from jaxdl.config import RunConfig
from jaxdl.engines.events import EventReplay, put, take
from jaxdl.runner import setup


@dataclasses.dataclass(frozen=True)
class Args:
  algorithms: tuple[str, ...] = ("ad_psgd", "gosgd")
  workers: int = 2
  steps: int = 20
  """Steps of the schedule replayed per arm per round."""
  rounds: int = 5


class OpByOp(EventReplay):
  """The replay with a worker's state taken and put back by eager indexing."""

  def __init__(self, *args):
    super().__init__(*args)
    self._take = take
    self._put = put
    self._copy = lambda states: states


def bench(algorithm: str, args: Args) -> float:
  config = RunConfig.make(model="mlp", algorithm=algorithm, workers=args.workers,
                          steps=args.steps, jitter=0.2, compute_time=1e-3)
  built = setup(config)
  engine = built.engine
  events, slots = engine.events, engine.slots  # the schedule of args.steps steps
  names = engine.metric_names
  state = engine.init(jax.random.key(0))  # gossip's messages in flight at the server's place
  start = state.server, state.workers
  arms, finals = {}, {}
  for name, replay in (("op by op", OpByOp), ("jaxdl", EventReplay)):
    run = replay(built.algorithm, built.streams)

    def arm(n, run=run, name=name):
      for _ in range(n):
        finals[name] = jax.block_until_ready(run(*start, events, names, slots)[:2])
    arms[name] = arm
  times = interleaved(arms, 1, args.rounds, warmup=1)
  ratio = report(f"{algorithm}, {args.workers} workers, mlp: seconds per replay of "
                 f"{len(events)} events", times, baseline="op by op")
  same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(finals["op by op"]),
                                                  jax.tree.leaves(finals["jaxdl"])))
  per_event = statistics.median(times["jaxdl"]) / len(events) * 1e3
  print(f"jaxdl: {per_event:.3f} ms per event; final states bitwise equal: {same}")
  return ratio if same else float("nan")


def main(args: Args) -> int:
  print(f"machine: {machine()}")
  ratios = {a: bench(a, args) for a in args.algorithms}
  print("\nreplay time jaxdl / op by op: " +
        ", ".join(f"{a}: {r:.3f}" for a, r in ratios.items()))
  return 1 if any(np.isnan(r) for r in ratios.values()) else 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
