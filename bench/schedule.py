"""How long the discrete-event schedule of a large asynchronous cluster takes to build.

SSP with 24 workers and 2000 iterations each (48,000 updates): about 1 s; a
schedule that grows superlinearly in the events shows here. (Was a wall-clock
assertion in tests/cluster/test_schedule.py; unit tests assert no timings.)

  python -m bench.schedule
  python -m bench.schedule --workers 48 --iterations 4000
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time

import tyro

from jaxdl.cluster import CostModel, centralized
from jaxdl.trace import summarize


@dataclasses.dataclass(frozen=True)
class Args:
  workers: int = 24
  iterations: int = 2000
  staleness_bound: int = 3
  rounds: int = 3
  budget_s: float = 10.0
  """Exit with status 1 when the median round takes longer."""


def main(args: Args) -> int:
  cost = CostModel(args.workers, compute_s=0.1, model_bytes=4e7, jitter=0.3,
                   straggler_prob=0.05, seed=0)
  times = []
  for _ in range(args.rounds):
    start = time.perf_counter()
    events = centralized(cost, args.workers * args.iterations,
                         staleness_bound=args.staleness_bound)
    times.append(time.perf_counter() - start)
  updates = summarize(events, args.workers)["updates"]
  median = statistics.median(times)
  print(f"ssp s={args.staleness_bound}, {args.workers} workers x {args.iterations} "
        f"iterations: {len(events)} events, {updates} updates; "
        f"min {min(times):.3f} s, median {median:.3f} s (budget {args.budget_s} s)")
  return 0 if median <= args.budget_s else 1


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
