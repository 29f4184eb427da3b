"""A diverging run stops, says so (status, step, exit code 3) and writes strict JSON."""
import json
import math

import numpy as np
import pytest

import jaxdl
from jaxdl import cli, rundir
from jaxdl.cli import main
from jaxdl.config import RunConfig
from jaxdl.runner import DIVERGENCE_FACTOR, divergence

# The mlp on digits at lr 50: the loss passes 1000 x its first value at step 2
# and is NaN from step 8 on (a lr-0.05 run's losses stay near 2.3 and fall).
DIVERGING = ["--model", "mlp", "--steps", "30", "--lr", "50", "--no-progress"]


def _strict(text: str):
  """json.loads that refuses NaN and Infinity (Python's json accepts them)."""
  def refuse(constant):
    raise ValueError(f"not strict JSON: {constant}")
  return json.loads(text, parse_constant=refuse)


def _strict_run_dir(out):
  """The run directory's summary and metrics records, parsed strictly."""
  for name in ("config.json", "checkpoints"):
    assert (out / name).exists(), name
  records = [_strict(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  return _strict((out / "summary.json").read_text()), records


def test_usage_states_the_rule_and_exit_code():
  assert f"past {DIVERGENCE_FACTOR:g} x its first value" in " ".join(cli.USAGE.split())
  assert f"{cli.EXIT_DIVERGED} the run diverged" in " ".join(cli.USAGE.split())


def test_strict_parser_refuses_nan():
  with pytest.raises(ValueError, match="NaN"):
    _strict('{"loss": NaN}')


@pytest.mark.parametrize("losses,params_finite,expected", [
    ([2.3, 2.2, 2.0], False, None),
    ([2.3, 2.2 * DIVERGENCE_FACTOR, 3.0], True, None),   # under the factor x 2.3
    ([2.3, 2.4 * DIVERGENCE_FACTOR, 3.0], True, 1),      # over it
    ([2.3, 2.0, math.inf, math.nan], True, 2),
    ([2.3, math.nan, 2.0, math.nan], True, None),        # NaN: steps without a gradient
    ([2.3, math.nan, 2.0, math.nan, math.nan], False, 3),  # a NaN tail, parameters not finite
    ([math.nan, math.nan], False, 0),
])
def test_divergence_rule(losses, params_finite, expected):
  asked = []
  def finite():
    asked.append(True)
    return params_finite
  assert divergence(np.array(losses), 2.3, finite) == expected
  if not any(np.isnan(losses)):
    assert not asked  # parameters are fetched only to tell a NaN tail's cause


def test_diverging_run_stops_with_exit_3_and_strict_json(tmp_path, capsys):
  out = tmp_path / "run"
  assert main(["run", "--out", str(out), *DIVERGING]) == 3
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and "diverged" in err[0] and "at step 2" in err[0], err
  summary, records = _strict_run_dir(out)
  assert summary["status"] == "diverged" and summary["diverged_at_step"] == 2
  assert "train loss" in summary["divergence"]
  assert "test_accuracy" not in summary  # the diverged parameters are no result
  # checked at the first log (step 20): stopped there, its record kept
  assert summary["steps"] == 20 and [r["step"] for r in records] == [20]
  assert not any(p.name.isdigit() for p in (out / "checkpoints").iterdir())


def test_api_returns_the_diverged_summary_and_resume_rediverges(tmp_path):
  out = tmp_path / "run"
  config = RunConfig.make(out=str(out), model="mlp", steps=30, lr=50.0, log_every=5,
                          checkpoint_every=1, progress=False)
  summary = jaxdl.run(config)  # does not raise
  assert summary["status"] == "diverged" and summary["diverged_at_step"] == 2
  assert summary["steps"] == 2  # a checkpoint step fetches the losses too
  assert summary == _strict((out / "summary.json").read_text())
  # the checkpoint of step 1 is kept, none of the diverged state
  assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]
  # --resume starts from step 1's checkpoint and diverges again, at the same step
  assert main(["run", "--out", str(out), "--resume", "--no-progress"]) == 3
  again, records = _strict_run_dir(out)
  assert again["diverged_at_step"] == 2 and again["steps"] == 2
  assert [r["step"] for r in records] == [2]


def test_completed_run_says_completed_and_exit_0(tmp_path):
  out = tmp_path / "run"
  assert main(["run", "--out", str(out), "--model", "mlp", "--steps", "30",
               "--no-progress"]) == 0
  summary, records = _strict_run_dir(out)
  assert summary["status"] == "completed" and "diverged_at_step" not in summary
  assert summary["steps"] == 30 and [r["step"] for r in records] == [20, 30]


def test_json_files_are_strict(tmp_path):
  rundir.write_json(tmp_path / "a.json", {"loss": math.nan, "xs": [1.0, -math.inf],
                                         "nested": {"y": math.inf}, "n": 3})
  assert _strict((tmp_path / "a.json").read_text()) == {
      "loss": None, "xs": [1.0, None], "nested": {"y": None}, "n": 3}
