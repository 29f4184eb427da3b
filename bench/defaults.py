"""Every registered algorithm with its defaults: the test accuracy it reaches.

Each algorithm runs `jaxdl run --algorithm NAME --workers M` with nothing
else set (the default data, model, optimizer, schedule, length and engine),
at each worker count it supports among --workers (sgd: 1 worker). Prints
one row per algorithm and exits with status 1 when any run ends below
--threshold or does not complete (diverged).

  python -m bench.defaults                      # 4, 8 and 16 workers
  python -m bench.defaults --workers 8 --algorithms asp ssp
"""
from __future__ import annotations

import dataclasses
import sys
import tempfile
import time

import tyro

import jaxdl
from jaxdl.algorithms import ALGORITHMS
from jaxdl.config import RunConfig
from bench.timing import machine


@dataclasses.dataclass(frozen=True)
class Args:
  workers: tuple[int, ...] = (4, 8, 16)
  algorithms: tuple[str, ...] = ()
  """Algorithms to run (default: every registered one)."""
  threshold: float = 0.85
  """The least test accuracy every run must reach."""


def counts(name: str, workers: tuple[int, ...]) -> tuple[int, ...]:
  most = ALGORITHMS.get(name).max_workers
  return tuple(m for m in workers if most is None or m <= most) or (1,)


def main(args: Args) -> int:
  names = args.algorithms or tuple(ALGORITHMS)
  print(machine())
  print(f"| algorithm | {' | '.join(f'M={m}' for m in args.workers)} | seconds |")
  print("|---|" + "---|" * (len(args.workers) + 1))
  failed = []
  with tempfile.TemporaryDirectory() as tmp:
    for name in names:
      cells, start = {}, time.perf_counter()
      for m in counts(name, args.workers):
        summary = jaxdl.run(RunConfig.make(algorithm=name, workers=m, progress=False,
                                           out=f"{tmp}/{name}-m{m}"))
        accuracy = summary["test_accuracy"]
        cells[m] = f"{accuracy:.4f}"
        if summary.get("status", "completed") != "completed" or not accuracy >= args.threshold:
          failed.append(f"{name} M={m}: {accuracy:.4f}")
      row = [cells.get(m, "") for m in args.workers]
      if 1 in cells and 1 not in args.workers:  # a one-worker algorithm
        row[0] = f"{cells[1]} (M=1)"
      print(f"| {name} | {' | '.join(row)} | {time.perf_counter() - start:.0f} |", flush=True)
  if failed:
    print(f"below {args.threshold}: " + "; ".join(failed))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
