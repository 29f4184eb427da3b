"""The default `jaxdl compare`, timed end to end: wall seconds and CPU seconds.

Runs ``jaxdl compare --no-progress`` (the default grid: no other flag) in a
fresh process into a new directory, with a new, empty XLA compilation cache
("cold", as on a fresh machine) and then again into another directory with
that cache filled ("warm", a second comparison on the same machine). Prints
each round's wall seconds, the CPU seconds of every process it ran, and the
ratio of the wall seconds to the 60 s goal. With ``--against REF``, the same
rounds run on a git checkout of REF too (alternating, so the machine's load
hits both) and the ratios to REF's wall and CPU seconds are printed (on a
shared machine the CPU seconds are the steadier figure); each cell's
``params_fingerprint`` and test accuracy must be the same in both, or the
script exits with status 1.

  python -m bench.compare_time                         # this checkout, 1 round
  python -m bench.compare_time --against 9d09c33 --rounds 2
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tyro

GOAL_SECONDS = 60.0
ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Args:
  rounds: int = 1
  """Cold and warm runs per checkout."""
  against: str | None = None
  """A git ref to time the same way, alternating with this checkout."""
  jobs: int = 0
  """--jobs of jaxdl compare (0: its default, one process per core)."""


def _children_cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def time_compare(source: Path, out: Path, cache: Path, jobs: int) -> dict:
  """One `jaxdl compare` of the checkout at `source` into `out`, its XLA
  cache in `cache`: wall and CPU seconds, each cell's results."""
  env = {**os.environ, "PYTHONPATH": str(source), "JAX_COMPILATION_CACHE_DIR": str(cache)}
  cpu, start = _children_cpu(), time.perf_counter()
  subprocess.run([sys.executable, "-m", "jaxdl.cli", "compare", "--out", str(out),
                  "--no-progress", "--jobs", str(jobs)], env=env, cwd=out.parent, check=True,
                 stdout=subprocess.DEVNULL)
  wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
  cells = {}
  for summary in sorted(out.glob("*/summary.json")):
    s = json.loads(summary.read_text())
    cells[summary.parent.name] = (s.get("params_fingerprint"), s.get("test_accuracy"))
  return {"wall": wall, "cpu": cpu, "cells": cells}


def main(args: Args) -> int:
  from bench.timing import machine
  print(machine(), f"{len(os.sched_getaffinity(0))} cores")
  with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    sources = {"this": ROOT}
    if args.against:
      sources[args.against] = tmp / "against"
      subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach",
                      str(sources[args.against]), args.against], check=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
      results = {(name, kind): [] for name in sources for kind in ("cold", "warm")}
      for r in range(args.rounds):
        for name, source in sources.items():
          cache = tmp / f"xla-{len(results)}-{r}-{name.replace('/', '_')}"
          for kind in ("cold", "warm"):
            out = tmp / f"compare-{r}-{kind}-{name.replace('/', '_')}"
            res = time_compare(source, out, cache, args.jobs)
            results[name, kind].append(res)
            print(f"round {r + 1} {name:>10} {kind}: {res['wall']:6.1f} s wall, "
                  f"{res['cpu']:6.1f} s CPU, {len(res['cells'])} cells", flush=True)
    finally:
      if args.against:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                        str(sources[args.against])], check=False)
  print(f"\n| checkout | run | wall s (median) | CPU s (median) | wall / {GOAL_SECONDS:.0f} s |"
        + (f" wall / {args.against} | CPU / {args.against} |" if args.against else ""))
  print("|---|---|---|---|---|" + ("---|---|" if args.against else ""))
  status = 0
  for (name, kind), runs in results.items():
    wall = statistics.median(r["wall"] for r in runs)
    cpu = statistics.median(r["cpu"] for r in runs)
    row = f"| {name} | {kind} | {wall:.1f} | {cpu:.1f} | {wall / GOAL_SECONDS:.2f} |"
    if args.against:
      before = [statistics.median(r[x] for r in results[args.against, kind])
                for x in ("wall", "cpu")]
      row += f" {wall / before[0]:.2f} | {cpu / before[1]:.2f} |"
    print(row)
  if args.against:
    reference = results[args.against, "cold"][0]["cells"]
    for (name, kind), runs in results.items():
      for res in runs:
        if res["cells"] != reference:
          differ = sorted(c for c in reference if res["cells"].get(c) != reference[c])
          print(f"{name} {kind}: cells differ from {args.against}'s: {', '.join(differ)}")
          status = 1
    if not status:
      print(f"every cell's params_fingerprint and test accuracy: the same as {args.against}'s")
  return status


if __name__ == "__main__":
  sys.exit(main(tyro.cli(Args)))
