"""Rechecks the survivors of a mutation run (bench/mutation.sh) against this tree.

  python bench/mutation_recheck.py RUN_DIR [NAME ...]

RUN_DIR is the checkout the run was made in (its mutants/ holds the results).
Each surviving mutant's diff (``mutmut show``) is applied to a scratch copy of
this tree (tests/ and what mutmut copies, pyproject.toml's `also_copy`), and
the tests of the mutated module (MODULE_TESTS, then ALWAYS, the fingerprints
last) run against it with -x: a failure kills the mutant. The same tests run
first on the unmutated copy, and must pass there: otherwise a failure would
say nothing of the mutant. Prints one line per mutant and the count; a diff
that no longer applies (the code moved on) is reported as such, not counted.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# module -> the test files that exercise it (in the order they run)
MODULE_TESTS = {
    "async_bn": ["tests/algorithms/test_async_bn.py"],
    "async_schedules": ["tests/cluster/test_schedule.py"],
    "base": ["tests/test_task.py", "tests/algorithms"],  # Problem.check_task: a task's checks
    "lc_asgd": ["tests/algorithms/test_async_bn.py", "tests/algorithms/test_lc_asgd.py"],
    "schedule": ["tests/cluster/test_schedule.py"],
    "sync_schedules": ["tests/cluster/test_schedule.py"],
    "task": ["tests/test_task.py", "tests/test_language_model.py"],
}
ALWAYS = ["tests/algorithms/test_setting_ranges.py", "tests/test_fingerprints.py"]
# What a mutant's tests read besides jaxdl/ (the copies mutmut makes too)
COPIED = ["tests",
          *tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["also_copy"]]


def survivors(run_dir: Path) -> list[str]:
  out = subprocess.run(["mutmut", "results"], cwd=run_dir, capture_output=True, text=True)
  return [m.group(1) for m in re.finditer(r"^\s*(\S+): survived$", out.stdout, re.M)]


def tests_for(name: str) -> list[str]:
  module = name.rsplit(".", 1)[0].rsplit(".", 1)[1]  # jaxdl.algorithms.bsp.x_f__mutmut_1 -> bsp
  own = MODULE_TESTS.get(module, [f"tests/algorithms/test_{module}.py"])
  if not any((ROOT / t).exists() for t in own):  # a module with no test file of its own
    own = ["tests/algorithms"]
  return [t for t in dict.fromkeys(own + ALWAYS) if (ROOT / t).exists()]


def _function(name: str) -> str:
  """jaxdl.cluster.schedule.x__bsp__mutmut_61 -> _bsp; ...xǁCǁvalidate__mutmut_3 -> validate."""
  last = name.rsplit(".", 1)[1]
  return re.sub(r"__mutmut_\d+$", "", last).split("ǁ")[-1].removeprefix("x_")


def apply(diff: str, tree: Path) -> bool:
  """Applies mutmut's diff by content: mutmut prints the function re-indented,
  so its removed lines are found (stripped) from the function's `def` on and
  replaced, keeping the file's indentation."""
  path = tree / re.search(r"^--- (\S+)", diff, re.M).group(1)
  old = [l[1:].strip() for l in diff.splitlines() if l.startswith("-") and not l.startswith("---")]
  new = [l[1:].strip() for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")]
  lines = path.read_text().splitlines()
  name = _function(re.search(r"^# (\S+):", diff, re.M).group(1))
  start = next((i for i, l in enumerate(lines) if re.match(rf"\s*def {re.escape(name)}\(", l)), 0)
  for i in range(start, len(lines) - len(old) + 1):
    if [l.strip() for l in lines[i:i + len(old)]] == old:
      indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
      lines[i:i + len(old)] = [indent + l for l in new]
      path.write_text("\n".join(lines) + "\n")
      return True
  return False


def _copy(scratch: Path) -> None:
  """This tree's files that the tests read, afresh in `scratch`."""
  for part in dict.fromkeys(["jaxdl", *COPIED, "pyproject.toml"]):
    target = scratch / part
    if target.is_dir():
      shutil.rmtree(target)
    if (ROOT / part).is_dir():
      shutil.copytree(ROOT / part, target)
    else:
      shutil.copy(ROOT / part, target)


def _passes(scratch: Path, tests: list[str]) -> tuple[bool, str]:
  """Whether `tests` pass on the scratch tree, and pytest's last lines."""
  # Run from the scratch tree, so that its (mutated) jaxdl is the one imported.
  env = {**os.environ, "PYTHONPATH": str(scratch)}
  result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           "-n", "2", "-m", "", *tests], cwd=scratch, env=env,
                          capture_output=True, text=True)
  return result.returncode == 0, "\n".join(result.stdout.splitlines()[-5:])


def recheck(run_dir: Path, name: str, scratch: Path, controlled: set) -> str:
  diff = subprocess.run(["mutmut", "show", name], cwd=run_dir, capture_output=True,
                        text=True).stdout
  tests = tests_for(name)
  _copy(scratch)
  if tuple(tests) not in controlled:  # the same tests, unmutated, must pass
    passed, tail = _passes(scratch, tests)
    if not passed:
      sys.exit(f"the unmutated tree fails {' '.join(tests)}:\n{tail}")
    controlled.add(tuple(tests))
  if not apply(diff, scratch):
    return "does not apply"
  return "survived" if _passes(scratch, tests)[0] else "killed"


def main(argv: list[str]) -> int:
  run_dir, names = Path(argv[0]), argv[1:]
  names = names or survivors(run_dir)
  counts: dict[str, int] = {}
  controlled: set = set()
  with tempfile.TemporaryDirectory() as tmp:
    for name in names:
      verdict = recheck(run_dir, name, Path(tmp), controlled)
      counts[verdict] = counts.get(verdict, 0) + 1
      print(f"{name}: {verdict}", flush=True)
  print(counts)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
