"""Mean and spread of test accuracy (or error) over comparison directories
that ran the same grid with different ``--seed``s.

  python experiments/over_seeds.py runs/ipdps21_table3-mini runs/ipdps21_table3-mini-seed1 ...
  python experiments/over_seeds.py --error runs/lcasgd_table3-mini ...

Prints a markdown table in the layout of `jaxdl report`'s accuracy table:
each cell is mean ± standard deviation (n - 1) over the directories that have
it, with n when some lack it.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys

import tyro

from jaxdl import report


@dataclasses.dataclass(frozen=True)
class Args:
  dirs: tyro.conf.Positional[tuple[str, ...]]
  """Comparison directories (one per seed)."""
  error: bool = False
  """Test error in % instead of test accuracy."""
  network: str | None = None
  """Network of the training cells (default: the first)."""


def table(args: Args) -> str:
  runs = [report.Report(d) for d in args.dirs]
  network = args.network or runs[0].main
  values: dict[tuple[str, int], list[float]] = {}
  for r in runs:
    for c in r.train:
      if c.network == network and "test_accuracy" in c.summary:
        a = c.summary["test_accuracy"]
        values.setdefault((c.variant, c.workers), []).append(100 * (1 - a) if args.error else a)
  variants = list(dict.fromkeys(v for v, _ in values))
  workers = sorted({m for _, m in values})
  spec = ".2f" if args.error else ".4f"
  rows = []
  for m in workers:
    row = [str(m)]
    for v in variants:
      xs = values.get((v, m))
      if not xs:
        row.append("")
        continue
      sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
      n = f" (n={len(xs)})" if len(xs) != len(runs) else ""
      row.append(f"{statistics.mean(xs):{spec}} ± {sd:{spec}}{n}")
    rows.append(row)
  what = "test error %" if args.error else "test accuracy"
  return (f"{what}, mean ± sd over {len(runs)} seeds ({network})\n\n"
          + report._markdown(["workers"] + variants, rows))


if __name__ == "__main__":
  print(table(tyro.cli(Args)))
  sys.exit(0)
