"""A grid's findings: stated with the grid, recorded in grid.json, refused
in one line where they name an unknown variant or figure, and judged by the
report from the cells' 95% intervals over their seeds."""
import json
from pathlib import Path

import numpy as np
import pytest

from jaxdl import compare, report
from jaxdl.cli import main
from jaxdl.compare import DEFAULT_RUN, Finding, Grid, Variant
from jaxdl.compare.findings import FIGURES
from jaxdl.errors import ConfigError
from jaxdl.report import findings
from jaxdl.report.intervals import Interval
from tests.registry_cases import held, table
from tests.test_report import _run_dir

LOW, HIGH = Interval(0.50, 0.48, 0.52, 3), Interval(0.80, 0.78, 0.82, 3)


def test_the_verdicts_of_hand_made_intervals():
  """Apart in the stated direction (higher or lower is better), apart the
  other way, overlapping (with fewer than 5 seeds and with 5), one seed,
  no figure."""
  overlapping = Interval(0.51, 0.49, 0.60, 3)
  assert findings.verdict(HIGH, LOW, higher_is_better=True) == "reproduced"
  assert findings.verdict(LOW, HIGH, higher_is_better=True) == "contradicted"
  assert findings.verdict(LOW, HIGH, higher_is_better=False) == "reproduced"
  assert findings.verdict(HIGH, LOW, higher_is_better=False) == "contradicted"
  assert findings.verdict(overlapping, LOW, True) == "not separated (5 seeds advised)"
  assert findings.verdict(LOW, overlapping, False) == "not separated (5 seeds advised)"
  five = Interval(0.51, 0.49, 0.60, 5)
  assert findings.verdict(five, Interval(0.50, 0.48, 0.52, 5), True) == "not separated"
  assert findings.verdict(Interval(0.9, 0.9, 0.9, 1), LOW, True) == "one seed: not judged"
  assert findings.verdict(None, LOW, True) == "no figure: not judged"


def test_a_finding_names_a_known_variant_and_figure_or_is_refused():
  variants = (Variant("sgd"), Variant("asp"), Variant("ssp", (("staleness_bound", 3),)))
  with pytest.raises(ConfigError,
                     match="--experiment='ssp_s9' is not valid: a finding's variant: "
                           "one of the grid's, sgd, asp"):
    Grid(variants=variants, findings=(Finding("F", "asp", "ssp_s9"),))
  with pytest.raises(ConfigError,
                     match="--experiment='accuracy' is not valid: a finding's figure: "
                           "one of metric, error"):
    Finding("F", "asp", "ssp_s3", figure="accuracy")
  with pytest.raises(ConfigError, match="--experiment=4 is not valid: a finding's worker counts"):
    Finding("F", "asp", "ssp_s3", workers=4)
  assert Finding("F", "asp", "ssp_s3", [4, 8]).workers == (4, 8)
  grid = Grid(variants=variants, findings=(Finding("F", "asp", "ssp_s3", (4,), "error"),))
  # recorded in grid.json, and read back as it was
  record = json.loads(json.dumps(grid.to_dict()))["findings"]
  assert compare.findings.read_findings(record, ["asp", "ssp_s3"]) == grid.findings
  assert "findings" not in Grid(variants=variants).to_dict()  # none: as before
  # variants replaced (--algorithms): the findings about vanished ones are dropped
  assert grid.replace(variants=variants[:2]).findings == ()
  assert grid.with_setting("staleness_bound", [3, 10]).findings == grid.findings


def _judged(root, accuracy, findings_record):
  """Three seeds of asp and ssp_s3 at 4 workers with the given accuracies
  (each a list over the seeds), a grid.json with `findings_record`; the report."""
  cells = []
  for variant, config in (("asp", {"algorithm": "asp"}),
                          ("ssp_s3", {"algorithm": "ssp", "staleness_bound": 3})):
    for seed, a in enumerate(accuracy[variant]):
      name = f"{variant}-m4-seed{seed}"
      _run_dir(root, name, {"samples": 100, "test_accuracy": a,
                            "simulated_time_s": 1 + 0.3 * seed + 0.1 * a,
                            "target_metric": "test_accuracy", "higher_is_better": True},
               evals=[(1, a, 1.0)], workers=4, seed=seed, **config)
      cells.append({"name": name, "variant": variant})
  (root / "grid.json").write_text(json.dumps({
      "grid": {"findings": findings_record}, "cells": cells}))


def test_the_report_judges_each_finding_by_the_intervals(tmp_path, capsys):
  """The Findings section (printed and in report.md): both variants' means ±
  intervals as numpy gives them, the seeds, and each verdict: ssp_s3 more
  accurate than asp (apart: reproduced), asp lower in error (contradicted),
  asp faster per sample (its 3 seeds overlap ssp's: not separated)."""
  accuracy = {"asp": [0.80, 0.82, 0.81], "ssp_s3": [0.90, 0.91, 0.92]}
  _judged(tmp_path, accuracy, [
      {"name": "F1", "better": "ssp_s3", "worse": "asp"},
      {"name": "F1", "better": "asp", "worse": "ssp_s3", "figure": "error"},
      {"name": "F9", "better": "asp", "worse": "ssp_s3", "workers": [4, 8],
       "figure": "samples_per_s"}])
  assert main(["report", str(tmp_path)]) == 0
  printed = capsys.readouterr().out
  section = printed.split("### Findings", 1)[1]
  rows = [[x.strip() for x in l.strip("|").split("|")] for l in section.splitlines()
          if l.startswith("| ")][1:]
  error = {v: [100 * (1 - a) for a in xs] for v, xs in accuracy.items()}
  throughput = {v: [100 / (1 + 0.3 * seed + 0.1 * a) for seed, a in enumerate(xs)]
                for v, xs in accuracy.items()}
  assert rows == [
      ["F1", "4", "test accuracy", f"ssp_s3: {held(accuracy['ssp_s3'], '.4f')}",
       f"asp: {held(accuracy['asp'], '.4f')}", "3 / 3", "reproduced"],
      ["F1", "4", "test error %", f"asp: {held(error['asp'], '.2f')}",
       f"ssp_s3: {held(error['ssp_s3'], '.2f')}", "3 / 3", "contradicted"],
      ["F9", "4", "samples/s", f"asp: {held(throughput['asp'], ',.0f')}",
       f"ssp_s3: {held(throughput['ssp_s3'], ',.0f')}", "3 / 3",
       "not separated (5 seeds advised)"],
      ["F9", "8", "samples/s", "asp: —", "ssp_s3: —", "0 / 0", "no figure: not judged"]]
  assert np.mean(throughput["asp"]) > np.mean(throughput["ssp_s3"])  # yet not apart
  assert "### Findings" in (tmp_path / report.REPORT).read_text()


def test_a_grid_json_without_findings_has_no_findings_section(tmp_path):
  _judged(tmp_path, {"asp": [0.8], "ssp_s3": [0.9]}, None)
  assert "Findings" not in report.Report(tmp_path).tables()


@pytest.mark.parametrize("record,named", [
    ([{"name": "F", "better": "asp", "worse": "bsp"}], "'bsp' is not a finding's variant"),
    ([{"name": "F", "better": "asp", "worse": "ssp_s3", "figure": "speed"}],
     "'speed' is not a finding's figure"),
    ({"F": "asp"}, "is not findings as a list")])
def test_a_report_of_a_bad_finding_is_one_line_and_exit_2(tmp_path, capsys, record, named):
  _judged(tmp_path, {"asp": [0.8], "ssp_s3": [0.9]}, record)
  assert main(["report", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and named in err, err
  assert not (tmp_path / report.REPORT).exists()


def test_an_experiment_with_a_bad_finding_is_one_line_and_exit_2(tmp_path, capsys):
  path = tmp_path / "bad.py"
  path.write_text("from jaxdl.compare import Finding, Grid, Variant\n"
                  "GRID = Grid(variants=(Variant('sgd'), Variant('asp')),\n"
                  "            findings=(Finding('F2', 'asp', 'ad_psgd'),))\n")
  assert main(["compare", "--experiment", str(path), "--out", str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "--experiment='ad_psgd' is not valid" in err, err
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["ipdps21_table3", "lcasgd_table3", "staleness_spread"])
def test_the_papers_findings_are_declared(name):
  """The experiment files state the papers' findings about their own variants."""
  path = Path(__file__).parent.parent / "experiments" / f"{name}.py"
  grid = compare.load_experiment(str(path))
  assert grid.findings and all(f.figure in FIGURES for f in grid.findings)
  if name == "ipdps21_table3":  # F2: ASP beats AD-PSGD in accuracy at every worker count
    assert Finding("F2", "asp", "ad_psgd") in grid.findings
  else:  # LC-ASGD's error (and loss) below DC-ASGD's, below ASGD's (staleness_spread: BN only)
    assert {(f.better, f.worse, f.figure) for f in grid.findings
            if name == "staleness_spread" or "(BN)" in f.name} == {
        (better, worse, figure) for better, worse in (("lc_asgd", "dc_asgd"), ("dc_asgd", "asp"))
        for figure in ("error", "loss")}


@pytest.mark.slow
def test_a_trained_variant_is_reproduced_better_than_an_untrained_one(tmp_path, capsys):
  """A real grid (sim, mlp, 20 steps, seeds 0 1 2): sgd at lr 0.05 more
  accurate and lower in loss than sgd at lr 1e-6 (reproduced); bsp x2's
  partition row and its mean curve are numpy's of its runs' summaries and
  metrics."""
  grid = Grid(variants=(Variant("sgd"), Variant("sgd", (("lr", 1e-6),), name="still"),
                        Variant("bsp")), workers=(2,), timing_networks=(),
              run=tuple({**dict(DEFAULT_RUN), "steps": 20}.items()),
              findings=(Finding("trains", "sgd", "still"),
                        Finding("trains", "sgd", "still", figure="loss")))
  out = tmp_path / "cmp"
  compare.run_grid(grid.with_seeds([0, 1, 2]), out, jobs=1, progress=False)
  r = report.Report(out)
  printed = r.tables()
  verdicts = [l.rsplit("|", 2)[-2].strip() for l in printed.split("### Findings")[1].splitlines()
              if l.startswith("| trains")]
  assert verdicts == ["reproduced", "reproduced"], printed
  summaries = [json.loads((out / f"bsp-m2-seed{s}" / "summary.json").read_text())
               for s in (0, 1, 2)]
  row = table(printed, "Partitions")["bsp ×2"]
  assert row["test accuracy"] == held([s["test_accuracy"] for s in summaries], ".4f") \
      + " (3 seeds)"
  assert row["idle (% of worker time)"] == held(
      [100 * s["idle_fraction"] for s in summaries], ".1f") + " (3 seeds)"
  assert row["batch seconds per worker (mean ± 95% interval over the seeds)"] == " / ".join(
      held(w, ".3g") for w in zip(*(s["batch_seconds_per_worker"] for s in summaries)))
  logged = [[json.loads(l) for l in (out / f"bsp-m2-seed{s}" / "metrics.jsonl").open()]
            for s in (0, 1, 2)]
  scores = [[e["test_accuracy"] for e in run if "test_accuracy" in e] for run in logged]
  curve = r.mean_curve(r.runs("bsp", 2, r.main), "epoch")
  assert curve.mean == pytest.approx(np.mean(scores, axis=0).tolist(), abs=1e-12)
