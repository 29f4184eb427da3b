"""The documentation's worked examples run as written: your own task, adding an
algorithm, adding an engine (docs/extending.md); and the README's algorithm tables."""
import dataclasses
import re
from pathlib import Path

import chex
import jax
import pytest

import jaxdl
import jaxdl.runner
from jaxdl.algorithms import ALGORITHMS, Collective
from jaxdl.config import RunConfig
from jaxdl.engines import ENGINES, Engine

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


def _rows(heading: str) -> list[str]:
  """The rows of the first table under the README heading `heading`."""
  text = README.read_text()
  body = text[text.index(f"{heading}\n"):].split("\n\n| ", 1)[1]
  return ["| " + line if i == 0 else line for i, line in
          enumerate(body.split("\n\n")[0].splitlines())][2:]


def test_the_algorithm_tables_are_the_registrys():
  """Every algorithm of the package has its row, in the table of its
  engines' kind, and every flag a row names is a flag of the run or of
  that algorithm."""
  tables = {Collective: _rows("### Synchronous algorithms on the device mesh"),
            None: _rows("### Asynchronous algorithms on a simulated cluster")}
  rows = {kind: {re.match(r"\| `(\w+)`", row).group(1): row for row in table}
          for kind, table in tables.items()}
  built_in = {n for n in ALGORITHMS if ALGORITHMS.get(n).build.__module__.startswith("jaxdl.")}
  assert set(rows[Collective]) | set(rows[None]) == built_in
  assert all(ALGORITHMS.get(n).family is Collective for n in rows[Collective])
  assert all(ALGORITHMS.get(n).family is not Collective for n in rows[None])
  run_flags = set(RunConfig().flat())
  for name, row in {**rows[Collective], **rows[None]}.items():
    settings = {f.name for f in dataclasses.fields(ALGORITHMS.get(name).settings)}
    for flag in re.findall(r"--([a-z][a-z-]*)", row):
      assert flag.replace("-", "_") in run_flags | settings, (name, flag)
