"""The documentation's worked examples run as written: your own task, adding an
algorithm, adding an engine (docs/extending.md); the README's commands and
example, and its algorithm and engine tables against the registries."""
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import chex
import jax
import pytest

import jaxdl
import jaxdl.runner
from jaxdl.algorithms import ALGORITHMS
from jaxdl.config import RunConfig
from jaxdl.engines import ENGINES, Engine, engines_for

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXTENDING = ROOT / "docs" / "extending.md"
RUN = dict(dataset="digits", model="mlp", batch_size=16, lr=0.05, momentum=0.0,
           schedule="constant", steps=8, progress=False)


def _snippet(section: str, source: Path) -> str:
  """The first Python block under the heading `section` of `source` (a
  Markdown file: the README, or a page of the docs, whose Python blocks are
  notebook cells, ```{code-cell} with its options, ``:tags: [...]``, first)."""
  text = source.read_text()
  heading = re.search(rf"^#+ {re.escape(section)}\n", text, re.M)
  assert heading, f"{source.name} has no heading {section!r}"
  block = re.search(r"^```(?:python|\{code-cell\}[^\n]*)\n(.*?)^```", text[heading.end():],
                    re.S | re.M).group(1)
  return re.sub(r"\A(?::\w+:.*\n)+", "", block)


@pytest.fixture
def example(request):
  """Runs a documented snippet as a module; removes what it registered afterwards,
  and puts back an entry of the same name registered before (the same
  example installed as a module of the package)."""
  code = _snippet(request.param, EXTENDING)
  names = re.findall(r'AlgorithmSpec\("(\w+)"|ENGINES\.register\("(\w+)"', code)
  saved = [(registry, name, registry.get(name), registry.doc(name)) for pair in names
           for registry, name in zip((ALGORITHMS, ENGINES), pair) if name in registry]
  for registry, name, _, _ in saved:
    registry.remove(name)
  before_algorithms, before_engines = set(ALGORITHMS), set(ENGINES)
  namespace = {"__name__": "readme_example"}
  exec(compile(code, str(EXTENDING), "exec"), namespace)
  yield namespace
  for name in set(ALGORITHMS) - before_algorithms:
    ALGORITHMS.remove(name)
  for name in set(ENGINES) - before_engines:
    ENGINES.remove(name)
  for registry, name, entry, doc in saved:
    registry.register(name, doc)(entry)


@pytest.mark.parametrize("example", ["Adding an algorithm"], indirect=True)
def test_the_algorithm_example_registers_and_runs(example, tmp_path):
  ALGORITHMS.add(example["SPEC"])
  config = dict(RUN, algorithm="asp_clip", workers=2, compute_time=1e-3)
  # A clip norm no gradient reaches is asp; a small one changes the result.
  loose = jaxdl.run(RunConfig.make(**config, clip_norm=1e6, out=str(tmp_path / "loose")))
  asp = jaxdl.run(RunConfig.make(**dict(config, algorithm="asp"), out=str(tmp_path / "asp")))
  tight = jaxdl.run(RunConfig.make(**config, clip_norm=1e-3, out=str(tmp_path / "tight")))
  assert loose["params_fingerprint"] == asp["params_fingerprint"]
  assert tight["params_fingerprint"] != asp["params_fingerprint"]
  with pytest.raises(jaxdl.ConfigError, match="clip-norm"):
    RunConfig.make(algorithm="asp_clip", clip_norm=-1.0)


@pytest.mark.parametrize("example", ["Adding an engine"], indirect=True)
def test_the_engine_example_matches_the_mesh_engine(example, tmp_path):
  config = RunConfig.make(**RUN, algorithm="ar_sgd", workers=4, batch_sizes=(8, 16, 8, 4))
  vmap = jaxdl.runner.setup(config.replace(engine="vmap")).engine
  mesh = jaxdl.runner.setup(config.replace(engine="mesh")).engine
  assert isinstance(vmap, Engine) and isinstance(mesh, Engine)
  results = []
  for engine in (vmap, mesh):
    state = engine.init(jax.random.key(0))
    for t in range(8):
      state, _ = engine.step(state, t)
    results.append(engine.evaluated(state))
  chex.assert_trees_all_close(results[0], results[1], rtol=1e-5, atol=1e-6)
  summary = jaxdl.run(config.replace(engine="vmap", out=str(tmp_path / "vmap")))
  assert summary["engine"] == "vmap" and (tmp_path / "vmap" / "trace.jsonl").exists()


def test_the_task_example_trains_a_model_of_its_own(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  namespace = {"__name__": "readme_example"}
  code = _snippet("Your own model, loss and data", EXTENDING)
  exec(compile(code, str(EXTENDING), "exec"), namespace)
  variance = float(namespace["x"].sum(1).var())  # the loss of predicting the mean
  assert namespace["summary"]["test_loss"] < 0.01 * variance
  assert (tmp_path / "runs" / "sum" / "summary.json").exists()


def _rows(heading: str, index: int = 0) -> list[list[str]]:
  """The cells of the rows of table `index` under the README heading `heading`."""
  text = README.read_text()
  section = text[text.index(f"## {heading}\n"):].split("\n## ", 1)[0]
  table = re.findall(r"(?:^\|.*\n)+", section, re.M)[index]
  return [[c.strip() for c in line.strip().strip("|").split("|")]
          for line in table.splitlines()[2:]]


def _names(cells: str) -> list[str]:
  return [n.strip() for n in cells.split(",")]


def test_the_algorithm_and_engine_tables_are_the_registrys():
  """Every algorithm of the package has its row, with its family and the
  engines that run it, and every flag a row names is that algorithm's; every
  registered engine of the package has its row, with its families and
  whether its runs are bitwise deterministic."""
  rows = {re.fullmatch(r"`(\w+)`", r[0]).group(1): r for r in _rows("Algorithms and engines")}
  built_in = [n for n in ALGORITHMS if ALGORITHMS.get(n).build.__module__.startswith("jaxdl.")]
  assert list(rows) == built_in
  for name, (_, family, engines, paper) in rows.items():
    spec = ALGORITHMS.get(name)
    assert family == spec.family.__name__.lower() and _names(engines) == engines_for(spec.family)
    settings = {f.name for f in dataclasses.fields(spec.settings)}
    assert all(flag.replace("-", "_") in settings for flag in re.findall(r"--([a-z-]+)", paper))
  engines = {re.fullmatch(r"`(\w+)`", r[0]).group(1): r for r in _rows("Algorithms and engines", 1)}
  assert list(engines) == [n for n in ENGINES if ENGINES.get(n).__module__.startswith("jaxdl.")]
  for name, (_, families, deterministic) in engines.items():
    engine = ENGINES.get(name)
    assert _names(families) == [f.__name__.lower() for f in engine.families]
    assert deterministic.startswith("yes" if engine.deterministic else "no")


def _blocks(language: str) -> list[str]:
  return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.S | re.M)


def test_the_readme_python_example_runs(tmp_path, monkeypatch):
  [code] = _blocks("python")
  monkeypatch.chdir(tmp_path)
  namespace: dict = {}
  exec(compile(code, str(README), "exec"), namespace)
  summary = namespace["summary"]
  assert summary["algorithm"] == "asp" and summary["test_accuracy"] > 0.8
  assert (tmp_path / "runs" / "asp" / "summary.json").exists()


def test_the_readme_command_line_runs(tmp_path):
  [_, _, command, _] = _blocks("bash")
  assert command.startswith("jaxdl run ")
  ran = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=tmp_path, timeout=600,
                       env=dict(os.environ, PATH=os.pathsep.join(
                           [str(Path(sys.executable).parent), os.environ["PATH"]])),
                       capture_output=True, text=True)
  assert ran.returncode == 0, ran.stderr[-2000:]
  summary = json.loads((tmp_path / "runs" / "ssp" / "summary.json").read_text())
  assert summary["algorithm"] == "ssp" and summary["test_accuracy"] > 0.8


def test_the_set_up_commands_are_what_ci_runs():
  """The two set-up commands: a fresh venv, the package installed from this
  checkout under the lock file, then the main job or the tests; .ci/run makes
  its environment and runs the tests the same way."""
  main_job, tests = (block.strip() for block in _blocks("bash")[:2])
  install = "python3 -m venv .venv && .venv/bin/pip install -e {} -c requirements.lock && "
  assert main_job == install.format(".") + ".venv/bin/jaxdl compare"
  assert tests == install.format("'.[test]'") + ".venv/bin/python -m pytest -n 2"
  ci = (ROOT / ".ci" / "run").read_text()
  assert 'python3 -m venv "$venv"' in ci and "-c requirements.lock" in ci
  assert re.search(r"pip\" install --quiet -e '\.\[test[,\]]", ci)
  assert '"$venv/bin/python" -m pytest -n 2 -q\n' in ci


@pytest.mark.slow
def test_the_main_job_runs_as_the_readme_says(tmp_path):
  """`jaxdl compare` with its defaults: the tables printed, report.md and
  its plots written under runs/compare."""
  ran = subprocess.run([str(Path(sys.executable).parent / "jaxdl"), "compare"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=1800)
  assert ran.returncode == 0, ran.stderr[-3000:]
  report = tmp_path / "runs" / "compare" / "report.md"
  assert report.exists() and "| 16 |" in ran.stdout
  assert (tmp_path / "runs" / "compare" / "speedup_workers.png").read_bytes()[:4] == b"\x89PNG"


def test_the_readmes_links_lead_somewhere():
  """Every relative link of the README names a file of the checkout."""
  links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text())
  assert len(links) >= 13
  assert [link for link in links if not (ROOT / link).exists()] == []
