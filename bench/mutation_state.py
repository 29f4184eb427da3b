"""Keeps a mutation run's results between machines: `bench/mutation.sh` takes
longer than one sitting on 2 cores, and mutmut's results live in `mutants/`.

  python bench/mutation_state.py save      # mutants/**/*.meta -> bench/mutation-state.json
  python bench/mutation_state.py restore   # the reverse, where mutants/ has none yet
  python bench/mutation_state.py count     # tested / killed / survived so far

mutmut keeps a result only while the mutated function's source hash (in the
same file) is unchanged, so a restored result never outlives its function;
a test added since can only kill more.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
STATE = ROOT / "bench" / "mutation-state.json"
MUTANTS = ROOT / "mutants"


def _metas():
  return sorted(MUTANTS.rglob("*.meta"))


def save() -> None:
  commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
  files = {str(p.relative_to(MUTANTS)): json.loads(p.read_text()) for p in _metas()}
  STATE.write_text(json.dumps({"commit": commit, "files": files}, indent=1, sort_keys=True))
  print(f"saved {len(files)} files' results (commit {commit[:10]}) to {STATE.name}")


def restore() -> None:
  if _metas() or not STATE.exists():
    return
  files = json.loads(STATE.read_text())["files"]
  for path, meta in files.items():
    target = MUTANTS / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(meta, indent=4))
  print(f"restored {len(files)} files' results from {STATE.name}")


def count() -> dict[str, int]:
  from mutmut.stats import status_by_exit_code
  counts: dict[str, int] = {}
  for p in _metas():
    for code in json.loads(p.read_text()).get("exit_code_by_key", {}).values():
      status = status_by_exit_code[code]
      counts[status] = counts.get(status, 0) + 1
  return counts


if __name__ == "__main__":
  command = sys.argv[1] if len(sys.argv) > 1 else "count"
  {"save": save, "restore": restore, "count": lambda: print(count())}[command]()
