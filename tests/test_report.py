"""`jaxdl report`: the tables' numbers from known run directories, and the plots."""
import json

import pytest

from jaxdl import report
from jaxdl.cli import main
from jaxdl.config import RunConfig
from jaxdl.plots import PLOTS


def _run_dir(root, name, summary, evals=(), trace_times=None, **config):
  """A fake run directory: config, summary, metrics (test accuracy per step)
  and, for simulated runs, a trace with one apply event per worker iteration."""
  out = root / name
  out.mkdir(parents=True)
  (out / "config.json").write_text(RunConfig.make(**config).to_json())
  (out / "summary.json").write_text(json.dumps(summary))
  (out / "metrics.jsonl").write_text("".join(
      json.dumps({"step": s, "epoch": s / 2, "train_loss": 1.0, "wall_time_s": w,
                  "test_accuracy": a}) + "\n" for s, a, w in evals))
  if trace_times is not None:
    (out / "trace.jsonl").write_text("".join(
        json.dumps({"time": t, "kind": "apply", "worker": 0, "iteration": 0}) + "\n"
        for t in trace_times))


@pytest.fixture
def comparison(tmp_path):
  d = tmp_path / "cmp"
  base = dict(samples=1000)
  # one-worker SGD: error 5%, 1000 samples in 1 s; 0.95 reached at step 2 (t = 1.0)
  _run_dir(d, "sgd-m1", {**base, "test_accuracy": 0.95, "simulated_time_s": 1.0,
                         "wait_s": [0.0], "bytes_total": 0.0, "staleness_mean": None},
           evals=[(1, 0.5, 9.0), (2, 0.95, 9.5)], trace_times=[0.4, 1.0],
           algorithm="sgd", workers=1)
  # asp x4: error 10% (+100%), 4x the throughput; 0.92 at step 1 = 4th apply (t = 0.2)
  _run_dir(d, "asp-m4", {**base, "test_accuracy": 0.90, "simulated_time_s": 0.25,
                         "wait_s": [0.05] * 4, "bytes_total": 2e6, "staleness_mean": 2.5,
                         "staleness_max": 3},
           evals=[(1, 0.92, 7.0), (2, 0.90, 8.0)],
           trace_times=[0.05 * k for k in range(1, 9)], algorithm="asp", workers=4)
  # ssp s=3 x4: error 6% (+20%), 2x; no trace: time to accuracy in wall time (3.0 s)
  _run_dir(d, "ssp_s3-m4", {**base, "test_accuracy": 0.94, "simulated_time_s": 0.5,
                            "wait_s": [0.1] * 4, "bytes_total": 1e6, "staleness_mean": 1.0,
                            "staleness_max": 3},
           evals=[(1, 0.5, 2.0), (2, 0.94, 3.0)], algorithm="ssp", staleness_bound=3, workers=4)
  # timing runs on another network: sgd as before, asp 8x faster than sgd there
  _run_dir(d, "sgd-m1-56gbps", {**base, "simulated_time_s": 1.0, "dry_run": True},
           algorithm="sgd", workers=1, network="56gbps", dry_run=True)
  _run_dir(d, "asp-m4-56gbps", {**base, "simulated_time_s": 0.125, "dry_run": True},
           algorithm="asp", workers=4, network="56gbps", dry_run=True)
  return d


def _rows(markdown: str) -> dict[str, list[str]]:
  lines = [l for l in markdown.splitlines() if l.startswith("| ")][1:]
  cells = [[x.strip() for x in l.strip("|").split("|")] for l in lines]
  return {c[0]: c[1:] for c in cells}


def test_step_times_follow_the_engines_step_count(comparison):
  assert report.step_times(comparison / "asp-m4" / "trace.jsonl", 4) == pytest.approx([0.2, 0.4])


def test_accuracy_and_error_tables(comparison):
  r = report.Report(comparison)
  assert [c.variant for c in r.train] == ["asp", "sgd", "ssp_s3"]  # names from configs
  acc = _rows(r.accuracy_table("10gbps"))
  assert acc == {"1": ["—", "0.9500", "—"], "4": ["0.9000", "—", "0.9400"]}
  err = _rows(r.error_table("10gbps"))
  assert err == {"1": ["", "5.00", ""], "4": ["10.00 (+100.0%)", "", "6.00 (+20.0%)"]}
  assert report.degradation(6.0, 5.0) == pytest.approx(20.0)
  assert "BN / Async-BN" not in r.tables()  # no --async-bn cell


def test_bn_and_async_bn_error_table(comparison):
  # asp x4 with --async-bn: error 8% beside asp's 10%; ssp has no Async-BN twin
  _run_dir(comparison, "asp_abn-m4", {"samples": 1000, "test_accuracy": 0.92,
                                      "simulated_time_s": 0.25},
           algorithm="asp", workers=4, async_bn=True, model="cnn_bn")
  r = report.Report(comparison)
  assert {c.variant: c.bn_variant for c in r.train}["asp_abn"] == "asp"
  rows = _rows(r.bn_error_table("10gbps"))
  assert rows == {"1": ["", "5.00 / —", ""], "4": ["10.00 / 8.00", "", "6.00 / —"]}
  assert "BN / Async-BN" in r.tables()


def test_scaling_table(comparison):
  r = report.Report(comparison)
  assert r.target == 0.90  # 95% of SGD's 0.95, rounded down to 0.01
  table = r.scaling_table("10gbps")
  header = table.splitlines()[0]
  assert "speedup @56gbps" in header and "time to 0.90 (s)" in header
  rows = _rows(table)
  # time, samples/s, speedup, speedup @56gbps, time to 0.90, TTA speedup, wait %,
  # staleness, MB
  assert rows["sgd ×1"] == ["1", "1,000", "1.00", "1.00", "1", "1.00", "0.0", "—", "0.0"]
  assert rows["asp ×4"] == ["0.25", "4,000", "4.00", "8.00", "0.2", "5.00", "20.0",
                            "2.50 / 3", "2.0"]
  assert rows["ssp_s3 ×4"] == ["0.5", "2,000", "2.00", "—", "3", "0.33", "20.0",
                               "1.00 / 3", "1.0"]


def test_report_command_writes_markdown_and_pngs(comparison, capsys):
  (comparison / "cells.json").write_text(json.dumps(
      {"lc_asgd-m4": {"status": "failed", "error": "ConfigError: boom"}}))
  assert main(["report", str(comparison)]) == 0
  printed = capsys.readouterr().out
  text = (comparison / "report.md").read_text()
  assert "IPDPS'21 Table III" in printed and "| 4 | 0.9000 | — | 0.9400 |" in text
  assert "`lc_asgd-m4`: ConfigError: boom" in text
  for name in PLOTS:
    data = (comparison / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    assert f"]({name})" in text


def test_report_of_a_directory_without_runs_is_exit_2(tmp_path, capsys):
  assert main(["report", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "--dir" in err
