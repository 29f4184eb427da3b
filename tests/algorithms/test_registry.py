"""The registry's acceptance test (issue #12): an algorithm registered inside a
test, with a setting of its own, is listed, takes its flag, refuses a bad
value in one line, runs on its engine and is labelled in a compare report,
with no other module edited.

The toy is AR-SGD whose replicas descend on k times the all-reduced gradient
(`toy_scale`, symbol k): with plain SGD, k at lr is AR-SGD at k * lr.
"""
from __future__ import annotations

import dataclasses
import json

import chex
import jax
import pytest

from jaxdl.algorithms import ALGORITHMS, AlgorithmSpec, Collective, Problem, ar_sgd
from jaxdl.cli import main
from jaxdl.config import RunConfig
from jaxdl.engines import engines_for
from jaxdl.settings import Settings, require, setting
from tests.helpers import make_engine, train


@dataclasses.dataclass(frozen=True)
class ToySettings(Settings):
  toy_scale: float = setting(1.0, symbol="k")
  """The toy's k: each replica descends on k times the all-reduced gradient."""

  def validate(self) -> None:
    require("toy_scale", self.toy_scale, self.toy_scale > 0, "a number > 0")


def build(settings: ToySettings, problem: Problem, num_workers: int) -> Collective:
  def step(state, batch, t, axis):
    del t
    grads, model_state, metrics = problem.gradients(state.params, state.model_state, batch,
                                                    axis)
    grads = jax.tree.map(lambda g: settings.toy_scale * g, axis.psum(grads))
    return problem.apply_gradients(state, grads, model_state), metrics

  return Collective(init=lambda key, worker: ar_sgd.init(problem, key), step=step,
                    evaluated=ar_sgd.evaluated,
                    bytes_per_step=ar_sgd.ring_bytes(problem.model_bytes(), num_workers))


TOY = AlgorithmSpec("toy_sgd", "ar_sgd descending on --toy-scale times the gradient",
                    Collective, build, ToySettings)

# A tiny run of plain SGD: the toy's k then scales the step exactly as lr does.
QUICK = ["--model", "mlp", "--workers", "2", "--steps", "5", "--momentum", "0",
         "--schedule", "constant", "--no-progress"]


@pytest.fixture
def toy():
  ALGORITHMS.add(TOY)
  try:
    yield TOY
  finally:
    ALGORITHMS.remove(TOY.name)


def _one_line(text: str) -> str:
  return " ".join(text.split())


def test_list_shows_the_toy_and_its_setting(toy, capsys):
  assert main(["list"]) == 0
  lines = capsys.readouterr().out.splitlines()
  row = next(i for i, l in enumerate(lines) if l.split()[:1] == ["toy_sgd"])
  assert f"[collective; engines: {', '.join(engines_for(Collective))}]" in lines[row]
  assert toy.doc in lines[row]
  assert lines[row + 1].split()[:2] == ["--toy-scale", "1.0"]
  assert "The toy's k" in lines[row + 1]


def test_run_help_lists_the_toys_flag(toy, capsys, monkeypatch):
  monkeypatch.setenv("COLUMNS", "200")
  with pytest.raises(SystemExit) as exit_:
    main(["run", "--help"])
  assert exit_.value.code == 0
  out = _one_line(capsys.readouterr().out)
  assert "--toy-scale FLOAT" in out and "The toy's k" in out


def test_run_takes_its_flag_and_scales_the_step(toy, tmp_path, capsys):
  out = tmp_path / "toy"
  assert main(["run", "--algorithm", "toy_sgd", "--toy-scale", "0.5", "--lr", "0.1",
               "--out", str(out), *QUICK]) == 0
  config = json.loads((out / "config.json").read_text())
  assert config["algorithm"]["algorithm"] == "toy_sgd"
  assert config["algorithm"]["settings"] == {"toy_scale": 0.5}
  summary = json.loads((out / "summary.json").read_text())
  assert summary["algorithm"] == "toy_sgd" and summary["engine"] == "mesh"
  assert summary["steps"] == 5
  # k = 0.5 at lr 0.1 takes AR-SGD's steps at lr 0.05
  reference = tmp_path / "ar_sgd"
  assert main(["run", "--algorithm", "ar_sgd", "--lr", "0.05", "--out", str(reference),
               *QUICK]) == 0
  expected = json.loads((reference / "summary.json").read_text())
  assert summary["params_fingerprint"] == expected["params_fingerprint"]
  assert summary["train_loss"] == pytest.approx(expected["train_loss"], abs=1e-6)


@pytest.mark.parametrize("engine", ["mesh", "sim"])
def test_scale_k_at_lr_is_ar_sgd_at_k_lr_on_every_engine(toy, engine):
  base = dict(model="mlp", workers=2, momentum=0.0, schedule="constant", engine=engine,
              compute_time=1e-3 if engine == "sim" else None)
  params = []
  for config in (RunConfig.make(algorithm="toy_sgd", toy_scale=0.5, lr=0.1, **base),
                 RunConfig.make(algorithm="ar_sgd", lr=0.05, **base)):
    engine_ = make_engine(config, total_steps=5)
    state, history = train(engine_, 5)
    params.append(engine_.evaluated(state)[0])
    assert history[-1]["loss"] < history[0]["loss"]
  chex.assert_trees_all_close(params[0], params[1], atol=1e-6, rtol=0)
  # and k matters: k = 1 is AR-SGD at lr 0.1, not at 0.05
  engine_ = make_engine(RunConfig.make(algorithm="toy_sgd", lr=0.1, **base), total_steps=5)
  state, _ = train(engine_, 5)
  distance = jax.tree.map(lambda a, b: abs(a - b).max(), engine_.evaluated(state)[0], params[1])
  assert max(jax.tree.leaves(distance)) > 1e-4


@pytest.mark.parametrize("args,allowed", [
    (["--algorithm", "toy_sgd", "--toy-scale", "-1"], "a number > 0"),
    (["--algorithm", "toy_sgd", "--toy-scale", "0"], "a number > 0"),
    (["--algorithm", "asp", "--toy-scale", "0.5"], "a setting of toy_sgd, not of asp"),
])
def test_bad_toy_scale_is_one_line_exit_2_and_nothing_written(toy, tmp_path, capsys, args,
                                                              allowed):
  out = tmp_path / "run"
  assert main(["run", "--out", str(out), *QUICK, *args]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "--toy-scale" in err and allowed in err
  assert "Traceback" not in err
  assert not out.exists()


def test_without_registration_there_is_no_toy(capsys):
  assert "toy_sgd" not in ALGORITHMS
  assert main(["run", "--algorithm", "toy_sgd", *QUICK]) == 2
  assert "--algorithm='toy_sgd'" in capsys.readouterr().err


EXPERIMENT = """\
from jaxdl.algorithms import ALGORITHMS
from jaxdl.compare import Grid, Variant
from {module} import TOY

if "toy_sgd" not in ALGORITHMS:  # a cell's process registers it here
  ALGORITHMS.add(TOY)

GRID = Grid(variants=(Variant("sgd"), Variant.parse("toy_sgd_k0.5")), workers=(2,),
            timing_networks=(),
            run=(("model", "mlp"), ("batch_size", 32), ("lr", 0.05), ("momentum", 0.0),
                 ("schedule", "constant"), ("steps", 20), ("seed", 0)))
"""


def _table_rows(markdown: str, first_header: str) -> tuple[list[str], dict[str, list[str]]]:
  """The header and rows (by first cell) of the first table whose header
  starts with `first_header`."""
  lines = markdown.splitlines()
  start = next(i for i, l in enumerate(lines) if l.startswith(f"| {first_header} |"))
  table = []
  for line in lines[start:]:
    if not line.startswith("|"):
      break
    table.append([x.strip() for x in line.strip().strip("|").split("|")])
  header, rows = table[0], table[2:]
  return header, {r[0]: r[1:] for r in rows}


def _accuracy_of(markdown: str, variant: str, workers: str) -> float:
  header, rows = _table_rows(markdown, "workers")
  return float(rows[workers][header.index(variant) - 1])


def test_compare_labels_the_toy_by_its_symbol(toy, tmp_path, capsys):
  path = tmp_path / "toy_experiment.py"
  path.write_text(EXPERIMENT.format(module=__name__))
  out = tmp_path / "cmp"
  assert main(["compare", "--experiment", str(path), "--out", str(out), "--jobs", "1",
               "--no-progress"]) == 0
  printed = capsys.readouterr().out
  assert 0.0 <= _accuracy_of(printed, "toy_sgd_k0.5", "2") <= 1.0
  assert 0.0 <= _accuracy_of(printed, "sgd", "1") <= 1.0
  config = json.loads((out / "toy_sgd_k0.5-m2" / "config.json").read_text())
  assert config["algorithm"]["settings"] == {"toy_scale": 0.5}
  report = (out / "report.md").read_text()
  assert _accuracy_of(report, "toy_sgd_k0.5", "2") == _accuracy_of(printed, "toy_sgd_k0.5", "2")
  # Without the grid's names, the report labels the cell from its config.json
  (out / "grid.json").unlink()
  assert main(["report", str(out)]) == 0
  assert _accuracy_of(capsys.readouterr().out, "toy_sgd_k0.5", "2") == \
      _accuracy_of(printed, "toy_sgd_k0.5", "2")
