"""Mean and spread of the test metric (accuracy, error, or the task's own,
e.g. nats per char) over comparison directories that ran the same grid with
different ``--seed``s.

  python experiments/over_seeds.py runs/ipdps21_table3-mini runs/ipdps21_table3-mini-seed1 ...
  python experiments/over_seeds.py --error runs/lcasgd_table3-mini ...    # or --loss

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
from jaxdl.report import markdown
from jaxdl.cli import script_args


@dataclasses.dataclass(frozen=True)
class Args:
  dirs: tyro.conf.Positional[tuple[str, ...]]
  """Comparison directories (one per seed)."""
  error: bool = False
  """Test error in % instead of test accuracy."""
  loss: bool = False
  """Test loss instead of test accuracy (finer than accuracy on a small test set)."""
  against: str | None = None
  """Paired: each value minus this variant's at the same workers and seed; a cell
  is the mean difference and how many seeds are below 0."""
  network: str | None = None
  """Network of the training cells (default: the first)."""


def table(args: Args) -> str:
  runs = [report.Report(d) for d in args.dirs]
  network = args.network or runs[0].main
  per_run = []
  for r in runs:
    got = {}
    for c in r.train:
      if c.network == network and c.score is not None:
        a = c.score
        got[c.variant, c.workers] = (c.summary["test_loss"] if args.loss else
                                     100 * (1 - a) if args.error else a)
    per_run.append(got)
  values: dict[tuple[str, int], list[float]] = {}
  for got in per_run:
    for (v, m), x in got.items():
      if args.against:
        if (args.against, m) not in got or v == args.against:
          continue
        x -= got[args.against, m]
      values.setdefault((v, m), []).append(x)
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
      if args.against:
        below = sum(x < 0 for x in xs)
        row.append(f"{statistics.mean(xs):+{spec}} ({below}/{len(xs)} < 0)")
        continue
      sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
      n = f" (n={len(xs)})" if len(xs) != len(runs) else ""
      row.append(f"{statistics.mean(xs):{spec}} ± {sd:{spec}}{n}")
    rows.append(row)
  what = ("test loss" if args.loss else "test error %" if args.error else
          report.metric_label(runs[0].metric).lower())
  if args.against:
    what += f" minus {args.against}'s, paired by seed"
  return (f"{what}, mean ± sd over {len(runs)} seeds ({network})\n\n"
          + markdown.table(["workers"] + variants, rows))


if __name__ == "__main__":
  print(table(script_args(Args)))
  sys.exit(0)
