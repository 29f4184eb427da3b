"""A first comparison from Python: one-worker SGD, AR-SGD and ASP on digits.

  python experiments/quickstart.py [--out runs/quickstart]

Each run is a normal run directory under --out; the table compares test
accuracy, simulated or wall time and staleness. `jaxdl compare` does this
at scale (grids, reports, plots); this file shows the Python API it is built on.
"""
from __future__ import annotations

import dataclasses
import sys

import jaxdl
from jaxdl import RunConfig
from jaxdl.cli import script_args


@dataclasses.dataclass(frozen=True)
class Args:
  out: str = "runs/quickstart"
  """Directory for the runs."""
  workers: int = 4
  """Workers of the distributed runs."""
  epochs: float = 5.0


def main(args: Args) -> int:
  common = dict(model="mlp", epochs=args.epochs, batch_size=8, lr=0.05, momentum=0.0,
                schedule="constant", progress=False, overwrite=True)
  runs = {"sgd": dict(algorithm="sgd", batch_size=8 * args.workers),
          "ar_sgd": dict(algorithm="ar_sgd", workers=args.workers),
          "asp": dict(algorithm="asp", workers=args.workers, jitter=0.3)}
  print(f"{'algorithm':<10}{'test acc':>10}{'steps':>8}{'staleness':>11}")
  for name, overrides in runs.items():
    summary = jaxdl.run(RunConfig.make(out=f"{args.out}/{name}", **{**common, **overrides}))
    print(f"{name:<10}{summary['test_accuracy']:>10.4f}{summary['steps']:>8}"
          f"{summary.get('staleness_mean', 0.0):>11.2f}")
  return 0


if __name__ == "__main__":
  sys.exit(main(script_args(Args)))
