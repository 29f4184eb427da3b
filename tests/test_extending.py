"""One module and one registry line: an algorithm, an engine and a task of a
package of the user's own, named in JAXDL_PLUGINS, join every
registry-driven test with no other edit.

The package holds the documentation's own examples (docs/extending.md: the
algorithm asp_clip, of an existing family with a setting and its range; the
engine vmap) and a task,
each registered by one line; the suite's registry-driven tests (common,
families, settings ranges, list, help, compare, report, tasks, an engine's
reads) then run in a fresh process, and must generate and pass cases for
each of the three.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_readme import EXTENDING, _snippet

ROOT = Path(__file__).resolve().parents[1]
TASK = '''
import jax.numpy as jnp
import numpy as np

import jaxdl
from jaxdl.task import TASKS


def make_task():
  """A linear regression: y is the sum of x's 4 coordinates."""
  x = np.random.default_rng(0).normal(size=(512, 4)).astype(np.float32)
  data = {"x": x, "y": x.sum(1)}

  def loss(params, model_state, batch, key):
    return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2), (model_state, {})

  return jaxdl.Task(init=lambda key: ({"w": jnp.zeros(4)}, {}), loss=loss, train=data,
                    test=data, name="toy_sum")


TASKS.register("toy_sum")(make_task)
'''
SUITE = ["tests/algorithms/test_common.py", "tests/algorithms/test_families.py",
         "tests/algorithms/test_setting_ranges.py", "tests/algorithms/test_defaults.py",
         "tests/test_cli.py", "tests/test_compare.py", "tests/test_report.py",
         "tests/test_task.py", "tests/engines/test_base.py"]
"""The registry-driven tests: each generates its cases from the registries."""
EXPECTED = {
    "algorithm": r"test_common\.py::\S+\[asp_clip-sim\]",
    "its setting's range": r"test_setting_ranges\.py::\S+\[asp_clip-clip_norm=0",
    "its family's invariants": r"test_families\.py::\S+\[asp_clip",
    "its real engine": r"test_common\.py::\S+\[asp_clip-ray\]",
    "engine": r"test_common\.py::\S+\[ar_sgd-vmap\]",
    "its declared reads": r"test_base\.py::\S+\[vmap\]",
    "task": r"test_task\.py::\S+\[toy_sum\]",
    "the algorithm compared and swept": r"test_compare\.py::\S+\[asp_clip\]",
    "the algorithm's run reported": r"test_report\.py::\S+\[asp_clip\]",
    "a grid on the engine": r"test_compare\.py::\S+\[vmap\]",
    "a run on the engine reported": r"test_report\.py::\S+\[vmap\]",
    "the task compared": r"test_compare\.py::\S+\[toy_sum\]",
    "the task's runs reported": r"test_report\.py::\S+\[toy_sum\]",
}
"""Cases that must be generated for the plugins (test ids, as regular expressions)."""


@pytest.fixture
def plugins(tmp_path):
  package = tmp_path / "toyplug"
  package.mkdir()
  (package / "algorithm.py").write_text(
      _snippet("Adding an algorithm", EXTENDING)
      + "\nfrom jaxdl.algorithms import ALGORITHMS\n\nALGORITHMS.add(SPEC)\n")
  engine = _snippet("Adding an engine", EXTENDING)  # (its registry line is in it)
  (package / "engine.py").write_text(engine)
  (package / "task.py").write_text(TASK)
  (package / "__init__.py").write_text("from toyplug import algorithm, engine, task\n")
  path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
  return dict(os.environ, JAXDL_PLUGINS="toyplug", PYTHONPATH=path, COLUMNS="200")


def _pytest(env, *args):
  return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)


@pytest.mark.slow
def test_a_plugin_joins_every_registry_driven_test(plugins):
  selected = ["-m", "slow or not slow", "-k", "asp_clip or vmap or toy_sum or "
              "test_list_prints_every_registry or test_help_documents_every_flag"]
  listed = _pytest(plugins, "--collect-only", "-q", *selected, *SUITE)
  assert listed.returncode == 0, listed.stdout[-3000:]
  for what, pattern in EXPECTED.items():
    assert re.search(pattern, listed.stdout), (what, listed.stdout[-3000:])
  ran = _pytest(plugins, "-q", "-n", "2", *selected, *SUITE)
  assert ran.returncode == 0, ran.stdout[-5000:]


def test_a_plugin_is_run_listed_and_documented_by_the_command_line(plugins, tmp_path):
  """The default run's share: the command line of a process that imports the
  plugins lists all three, documents the setting and runs the algorithm."""
  jaxdl = lambda *args: subprocess.run([sys.executable, "-m", "jaxdl", *args], cwd=tmp_path,
                                       env=plugins, capture_output=True, text=True, timeout=300)
  listed = jaxdl("list").stdout
  assert all(name in listed for name in ("asp_clip", "vmap", "task:toy_sum", "--clip-norm"))
  assert "--clip-norm" in jaxdl("run", "--help").stdout
  bad = jaxdl("run", "--algorithm", "asp_clip", "--clip-norm", "0", "--out", "bad")
  assert bad.returncode == 2 and bad.stderr.strip().endswith("a number > 0")
  assert not (tmp_path / "bad").exists()
  ran = jaxdl("run", "--dataset", "task:toy_sum", "--algorithm", "ar_sgd", "--engine", "vmap",
              "--workers", "2", "--steps", "3", "--no-progress", "--out", "run")
  assert ran.returncode == 0, ran.stderr[-2000:]
  assert '"engine": "vmap"' in (tmp_path / "run" / "summary.json").read_text()
