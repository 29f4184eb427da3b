"""`jaxdl report`: the tables' numbers from known run directories, the plots,
and the runs of every registered algorithm, engine and task."""
import dataclasses
import json
import shutil

import numpy as np
import pytest

import jaxdl
from jaxdl import plots, report, rundir
from jaxdl.report import intervals
from jaxdl.report import tables as report_tables
from jaxdl.algorithms import ALGORITHMS
from jaxdl.cli import main
from jaxdl.compare import DEFAULT_GRID, GRIDS
from jaxdl.compare.grid import baseline, one_worker
from jaxdl.config import RunConfig
from jaxdl.engines import ENGINES
from jaxdl.plots import PLOTS
from jaxdl.task import registered, task_names
from tests import marks
from tests.registry_cases import (DEFAULT_ALGORITHMS, ENGINE_CASES, assert_tables_hold,
                                  engine_variant, table)


def _run_dir(root, name, summary, evals=(), trace_times=None, **config):
  """A fake run directory: config, summary, metrics (test accuracy per step)
  and, for simulated runs, a trace with one apply event per worker iteration
  (`trace_times`; by default each record's step at its wall time)."""
  out = root / name
  out.mkdir(parents=True)
  (out / "config.json").write_text(RunConfig.make(**config).to_json())
  (out / "summary.json").write_text(json.dumps(summary))
  (out / "metrics.jsonl").write_text("".join(
      json.dumps({"step": s, "epoch": s / 2, "train_loss": 1.0, "wall_time_s": w,
                  "test_accuracy": a}) + "\n" for s, a, w in evals))
  if trace_times is None and "simulated_time_s" in summary and evals:
    # a simulated run's times are its trace's: each step's M applies at the
    # time of the first record from that step on
    m = RunConfig.make(**config).algorithm.workers
    trace_times = [next(w for s, _, w in sorted(evals) if s >= step)
                   for step in range(1, max(s for s, _, _ in evals) + 1) for _ in range(m)]
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
  assert rundir.step_times(comparison / "asp-m4" / "trace.jsonl", 4) == pytest.approx([0.2, 0.4])


def test_accuracy_and_error_tables(comparison):
  r = report.Report(comparison)
  assert [c.variant for c in r.train] == ["asp", "sgd", "ssp_s3"]  # names from configs
  acc = _rows(r.metric_table("10gbps"))
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
  for name in PLOTS + ("accuracy_bytes.png",):  # (its cells counted their bytes)
    data = (comparison / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    assert f"]({name})" in text


def test_report_of_a_directory_without_runs_is_exit_2(tmp_path, capsys):
  assert main(["report", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "DIR=" in err


def _diverged_cell(root, name="ssp_s3-m8", **config):
  """ssp s=3 x8, stopped at step 3 (diverged at 2) after one evaluation at step 1."""
  _run_dir(root, name, {"samples": 300, "status": "diverged", "diverged_at_step": 2,
                        "divergence": "train loss nan at step 2", "train_loss": None,
                        "simulated_time_s": 0.3, "wait_s": [0.0] * 8, "staleness_mean": 1.0,
                        "staleness_max": 2},
           evals=[(1, 0.6, 1.0)], trace_times=[0.01 * k for k in range(1, 25)],
           **{"algorithm": "ssp", "staleness_bound": 3, "workers": 8, **config})
  with open(root / name / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 3, "epoch": 1.5, "train_loss": None, "wall_time_s": 2.0}) + "\n")


def test_a_diverged_cell_shows_diverged_never_a_figure(comparison):
  _diverged_cell(comparison)
  r = report.Report(comparison)
  assert r.target == 0.90  # from the finished cells only
  assert _rows(r.metric_table("10gbps"))["8"] == ["—", "—", "diverged"]
  assert _rows(r.error_table("10gbps"))["8"] == ["", "", "diverged"]
  row = _rows(r.scaling_table("10gbps"))["ssp_s3 ×8"]
  assert row[0] == "diverged at step 2" and set(row[1:]) == {"—"}
  assert "- `ssp_s3-m8`: train loss nan at step 2" in r.tables()
  cell = next(c for c in r.train if c.diverged)
  assert cell.last == {"step": 3, "epoch": 1.5, "score": None, "time": pytest.approx(0.24)}
  # the curves end in an x at the stopping point, labelled diverged
  fig = plots.curves(r, "epoch")
  marks = [l for ax in fig.axes for l in ax.get_lines() if "diverged" in l.get_label()]
  assert [(l.get_label(), l.get_marker(), list(l.get_xdata())) for l in marks] == [
      ("ssp_s3 (diverged)", "x", [1.5])]
  assert "ssp_s3 (diverged)" in [t.get_text() for t in fig.legends[0].get_texts()]
  fig = plots.accuracy_against_workers(r)
  assert [l.get_label() for l in fig.axes[0].get_lines() if l.get_marker() == "x"] == [
      "ssp_s3 (diverged)"]


def test_report_command_over_a_diverged_cell(comparison, capsys):
  _diverged_cell(comparison)
  assert main(["report", str(comparison)]) == 0
  printed = capsys.readouterr().out
  assert "| 8 | | | diverged |" in " ".join(printed.split())
  for name in PLOTS:
    assert (comparison / name).read_bytes()[:4] == b"\x89PNG"


def _line_colors(fig) -> dict[str, tuple]:
  return {l.get_label(): l.get_color() for ax in fig.axes for l in ax.get_lines()}


def test_a_variant_has_one_colour_in_every_plot_and_comparison(comparison, tmp_path):
  # another comparison, with other variants in another order
  other = tmp_path / "other"
  for name, algorithm, accuracy, extra in (
      ("ssp_s3-m2", "ssp", 0.8, {"staleness_bound": 3}), ("bsp-m2", "bsp", 0.7, {}),
      ("easgd_tau4-m2", "easgd", 0.6, {"communication_period": 4})):
    _run_dir(other, name, {"samples": 100, "test_accuracy": accuracy, "simulated_time_s": 1.0},
             evals=[(1, accuracy, 1.0)], algorithm=algorithm, workers=2, **extra)
  a = _line_colors(plots.curves(report.Report(comparison), "time"))
  b = _line_colors(plots.accuracy_against_workers(report.Report(other)))
  assert a["ssp_s3"] == b["ssp_s3"] == plots.color("ssp_s3")
  assert a["asp"] == plots.color("asp") != a["ssp_s3"]
  # the default comparison's variants all differ, and every named grid's
  labels = [v.label for v in DEFAULT_GRID.variants]
  assert len({plots.color(v) for v in labels}) == len(labels)
  for grid in GRIDS.values():
    labels = [v.label for v in grid.variants]
    assert len({plots.color(v) for v in labels}) == len(labels), labels


def test_report_axes_say_which_seconds(comparison):
  r = report.Report(comparison)
  fig = plots.curves(r, "time")
  # sgd and asp have simulated times, ssp_s3 too (its summary has simulated_time_s)
  assert fig.axes[0].get_xlabel() == "time (simulated seconds)"
  assert plots.curves(r, "epoch").axes[0].get_xlabel() == "epochs"
  # legends sit outside the axes: one figure legend, none inside
  assert fig.legends and not any(ax.get_legend() for ax in fig.axes)


def _ssp_cell(root, name, bound, fingerprint, wait):
  _run_dir(root, name, {"samples": 1000, "test_accuracy": 0.9, "simulated_time_s": 0.25,
                        "params_fingerprint": fingerprint, "wait_s": wait,
                        "staleness_mean": 2.5, "staleness_max": 3},
           algorithm="ssp", staleness_bound=bound, workers=4)


def test_report_says_when_the_staleness_bound_never_bound(comparison):
  summary_path = comparison / "asp-m4" / "summary.json"
  summary = json.loads(summary_path.read_text())
  summary_path.write_text(json.dumps({**summary, "params_fingerprint": "f-asp"}))
  _ssp_cell(comparison, "ssp_s100-m4", 100, "f-asp", [0.0] * 4)   # asp's parameters
  _ssp_cell(comparison, "ssp_s50-m4", 50, "f-other", [0.0] * 4)   # no wait, other bits
  notes = report.Report(comparison).staleness_notes("10gbps")
  assert "counted in server versions" in notes
  lines = notes.splitlines()[1:]
  assert lines == [
      "- ssp_s100: the staleness bound s never bound at 4 workers: identical to asp "
      "(the same parameters fingerprint).",
      "- ssp_s50: the staleness bound s never bound at 4 workers: no worker ever waited on it."]
  # ssp_s3 waited (0.1 s per worker): its bound bound, it is not named
  assert "ssp_s3:" not in notes
  assert notes in report.Report(comparison).tables()


def test_over_seeds_the_notes_say_in_how_many_the_bound_never_bound(tmp_path):
  """Three seeds of asp and of two ssp cells: ssp_s100 has asp's parameters in
  every seed, ssp_s10 in two of the three (its third seed waited): said so."""
  for seed in range(3):
    summary = {"samples": 1000, "test_accuracy": 0.9, "simulated_time_s": 0.25,
               "params_fingerprint": f"asp{seed}", "wait_s": [0.0] * 4,
               "staleness_mean": 2.5, "staleness_max": 3}
    _run_dir(tmp_path, f"asp-m4-seed{seed}", summary, algorithm="asp", workers=4, seed=seed)
    for bound, fingerprint, wait in ((100, f"asp{seed}", 0.0),
                                     (10, f"asp{seed}" if seed else "other", 0.1 * (not seed))):
      _run_dir(tmp_path, f"ssp_s{bound}-m4-seed{seed}",
               {**summary, "params_fingerprint": fingerprint, "wait_s": [wait] * 4},
               algorithm="ssp", staleness_bound=bound, workers=4, seed=seed)
  notes = report.Report(tmp_path).staleness_notes("10gbps").splitlines()[1:]
  same = "identical to asp (the same parameters fingerprint)."
  assert set(notes) == {
      f"- ssp_s10: the staleness bound s never bound at 4 workers in 2 of 3 seeds: {same}",
      f"- ssp_s100: the staleness bound s never bound at 4 workers: {same}"}
  assert len(notes) == 2


def test_the_notes_name_each_algorithm_that_declares_what_it_reduces_to(comparison):
  """The notes follow AlgorithmSpec.reduces_to, not a name: ssp declares asp;
  a copy of ssp under another name is named as ssp is, and one that
  declares nothing is not."""
  assert ALGORITHMS.get("ssp").reduces_to == "asp"
  summary_path = comparison / "asp-m4" / "summary.json"
  summary = json.loads(summary_path.read_text())
  summary_path.write_text(json.dumps({**summary, "params_fingerprint": "f-asp"}))
  for name, reduces_to in (("ssp_copy", "asp"), ("ssp_plain", None)):
    ALGORITHMS.add(dataclasses.replace(ALGORITHMS.get("ssp"), name=name, reduces_to=reduces_to))
  try:
    for name in ("ssp_copy", "ssp_plain"):
      _run_dir(comparison, f"{name}-m4", {"samples": 1000, "test_accuracy": 0.9,
                                          "simulated_time_s": 0.25, "wait_s": [0.0] * 4,
                                          "params_fingerprint": "f-asp", "staleness_mean": 2.5,
                                          "staleness_max": 3},
               algorithm=name, staleness_bound=100, workers=4)
    notes = report.Report(comparison).staleness_notes("10gbps")
  finally:
    for name in ("ssp_copy", "ssp_plain"):
      ALGORITHMS.remove(name)
  assert notes.splitlines()[1:] == [
      "- ssp_copy_s100: the staleness bound s never bound at 4 workers: identical to asp "
      "(the same parameters fingerprint)."]


def test_never_bound_from_real_runs(tmp_path):
  """A bound no worker reaches gives asp's schedule, hence asp's parameters."""
  from jaxdl.config import RunConfig as Config
  import jaxdl
  flags = dict(model="mlp", engine="sim", workers=4, steps=6, jitter=0.5, progress=False)
  d = tmp_path / "cmp"
  jaxdl.run(Config.make(algorithm="asp", out=str(d / "asp-m4"), **flags))
  jaxdl.run(Config.make(algorithm="ssp", staleness_bound=1000, out=str(d / "ssp_s1000-m4"),
                        **flags))
  jaxdl.run(Config.make(algorithm="ssp", staleness_bound=0, out=str(d / "ssp_s0-m4"), **flags))
  notes = report.Report(d).staleness_notes("10gbps")
  assert ("- ssp_s1000: the staleness bound s never bound at 4 workers: identical to asp"
          in notes)
  assert "ssp_s0" not in notes


def test_a_language_model_comparison_reads_lower_nats_as_better(tmp_path):
  d = tmp_path / "lm"

  def cell(name, nats, evals, trace_times, **config):
    _run_dir(d, name, {"samples": 1000, "simulated_time_s": 1.0, "test_nats_per_char": nats,
                       "target_metric": "test_nats_per_char", "higher_is_better": False},
             trace_times=trace_times, dataset="python_docs", model="transformer", **config)
    (d / name / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "epoch": s / 2, "train_loss": 1.0, "wall_time_s": 9.0,
                    "test_nats_per_char": x}) + "\n" for s, x in evals))

  cell("sgd-m1", 1.5, [(1, 2.5), (2, 1.5)], [0.4, 1.0], algorithm="sgd", workers=1)
  cell("asp-m4", 1.8, [(1, 1.55), (2, 1.8)], [0.05 * k for k in range(1, 9)],
       algorithm="asp", workers=4)
  r = report.Report(d)
  assert (r.metric, r.higher, r.target) == ("test_nats_per_char", False, 1.58)  # 105%, up
  assert _rows(r.metric_table("10gbps")) == {"1": ["—", "1.5000"], "4": ["1.8000", "—"]}
  assert _rows(r.error_table("10gbps")) == {"1": ["", "1.50"], "4": ["1.80 (+20.0%)", ""]}
  # time to 1.58: the first evaluation at or below it (sgd's 2nd, asp's 1st)
  assert [c.time_to(r.target) for c in r.train] == [pytest.approx(0.2), 1.0]
  tables = r.tables()
  assert "### Test nats per char (layout" in tables and "accuracy" not in tables.lower()
  with pytest.raises(report.ConfigError, match="--target=0.0 .*test nats per char > 0"):
    report.Report(d, 0.0)
  assert report.Report(d, 2.0).target == 2.0  # any positive nats: not an accuracy


def test_the_parallelisms_table(tmp_path, comparison):
  """Cells that ran on devices, one of them pipelined or tensor parallel: the
  ASU seed's table (strategy, devices, global batch, samples/s, memory per
  device, time per epoch, time to the target, cost); none in a comparison
  without such cells."""
  assert report.Report(comparison).strategies("10gbps") == []
  assert "Parallelisms" not in report.Report(comparison).tables()
  assert "predicted" not in report.Report(comparison).tables()
  d = tmp_path / "strategies"
  mesh = lambda **s: {"samples": 1000, "wall_time_s": 2.0, "test_accuracy": 0.9,
                      "seconds_per_epoch": 1.0, "cost": 0.5,
                      "memory_per_device_bytes": {"arguments": 3e6, "temporaries": 1e6,
                                                  "outputs": 0, "aliased": 0}, **s}
  _run_dir(d, "sgd-m1", mesh(devices=1, batch_sizes=[32]), evals=[(2, 0.9, 1.5)],
           algorithm="sgd", workers=1, engine="mesh")
  _run_dir(d, "tensor-m1", mesh(devices=2, batch_sizes=[32], tensor_parallel=2,
                                memory_per_device_bytes={"arguments": 1e6, "temporaries": 1e6,
                                                         "outputs": 0, "aliased": 0}),
           evals=[(2, 0.9, 1.8)], algorithm="sgd", workers=1, engine="mesh")
  _run_dir(d, "gpipe-m1", mesh(devices=2, batch_sizes=[32], stages=2, microbatches=4,
                               busy_fraction_per_device=[0.5, 0.25],
                               bubble_fraction_measured=0.625, bubble_fraction_ideal=0.2),
           evals=[(2, 0.9, 1.9)], algorithm="sgd", workers=1, engine="mesh")
  (d / "grid.json").write_text(json.dumps({"cells": [
      {"name": f"{v}-m1", "variant": v} for v in ("sgd", "tensor", "gpipe")]}))
  rows = _rows(report.Report(d, target=0.9).strategies_table("10gbps"))
  assert rows["sgd"] == ["data, 1 worker(s)", "1", "32", "500", "—", "—", "4.00", "1", "1.5",
                         "0.5"]
  assert rows["tensor"][:7] == ["tensor, 2 devices a worker", "2", "32", "500", "—", "—", "2.00"]
  assert rows["gpipe"][0] == "pipeline, 2 stages x 4 micro-batches"
  assert rows["gpipe"][4:6] == ["50 / 25", "62 (ideal 20)"]
  assert rows["gpipe"][8] == "1.9"  # its time to 0.90: its first evaluation at it
  written = report.Report(d, target=0.9).write().parent
  assert (written / "strategies.png").is_file()


def test_a_parallelisms_report_predicts_the_asu_seeds_strategies(tmp_path):
  """Beside the parallelisms table, the cost model's prediction of the ASU
  seed's strategies on 2x RTX 3070: the seed's samples/s and ratios, the
  predicted ones, and a note that orders them as the seed did."""
  d = tmp_path / "strategies"
  mesh = {"samples": 1000, "wall_time_s": 2.0, "test_accuracy": 0.9, "devices": 2,
          "batch_sizes": [32], "memory_per_device_bytes": {"arguments": 1e6, "temporaries": 1e6}}
  _run_dir(d, "sgd-m1", {**mesh, "devices": 1}, evals=[(2, 0.9, 1.5)], algorithm="sgd",
           workers=1, engine="mesh")
  _run_dir(d, "gpipe-m1", {**mesh, "stages": 2, "microbatches": 4}, evals=[(2, 0.9, 1.9)],
           algorithm="sgd", workers=1, engine="mesh")
  tables = report.Report(d, target=0.9).tables()
  heading = "### The ASU seed's strategies on 2× RTX 3070, predicted (timing only)"
  assert tables.index("### Parallelisms") < tables.index(heading)
  rows = _rows(tables[tables.index(heading):])
  assert [r[:4] for r in (rows["single device"], rows["data parallel"],
                          rows["GPipe (4 micro-batches)"])] == [
      ["1", "128", "2,275", "1.00"], ["2", "256", "2,968", "1.30"],
      ["2", "256", "1,528", "0.67"]]
  for column in (4, 6):  # the FLOP rate's samples/s, the roofline's
    predicted = {k: float(v[column].replace(",", "")) for k, v in rows.items()}
    assert predicted["data parallel"] > predicted["single device"] > \
        predicted["GPipe (4 micro-batches)"]
  assert rows["model parallel"][2:4] == ["—", "—"]  # not measured by the seed
  for model in ("The seed orders the measured strategies", "the FLOP rate", "the roofline"):
    assert f"{model} data parallel > single device > GPipe" in tables


# The registry-driven cases: a directory of real runs (3 steps, in this
# process; no grid.json, so the report names the variants from the runs'
# configs) of each registered algorithm, engine and task, reported.
TINY = dict(engine="sim", steps=3, batch_size=8, optimizer="sgd", lr=0.05, momentum=0.0,
            schedule="constant", progress=False)


def _run(out, **flags) -> dict:
  return jaxdl.run(RunConfig.make(**{**TINY, "model": "mlp", **flags, "out": str(out)}))


def _reported(directory, capsys) -> str:
  """`jaxdl report DIRECTORY`'s printed tables, which report.md holds too
  (from their first heading: a real engine's processes may have printed)."""
  capsys.readouterr()
  assert main(["report", str(directory)]) == 0
  printed = capsys.readouterr().out.split("\nreport: ")[0]
  printed = printed[printed.index("### "):]
  assert printed.strip() in (directory / report.REPORT).read_text()
  return printed


def _variant(printed: str, workers: int) -> str:
  """The variant with a figure in the metric table's row of `workers`, other
  than the baseline if there is one."""
  held = [v for v, x in table(printed, "Test")[str(workers)].items() if x != "—"]
  return ([v for v in held if v != baseline()] or held)[0]


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
  """The one-worker baseline's run directory and summary (each case copies it)."""
  out = tmp_path_factory.mktemp("baseline") / f"{baseline()}-m1"
  return out, _run(out, algorithm=baseline(), workers=1)


@pytest.mark.parametrize("name", marks.default_only(list(ALGORITHMS), DEFAULT_ALGORITHMS))
def test_every_algorithms_run_is_reported(name, baseline_run, tmp_path, capsys):
  """Each registered algorithm's run beside the baseline's: the report's
  tables hold its own numbers, a finite error and its degradation."""
  d = tmp_path / "cmp"
  base_dir, base = baseline_run
  workers = 1 if one_worker(name) else 2
  if name == baseline():
    summary = base = _run(d / name, algorithm=name, workers=1)
  else:
    shutil.copytree(base_dir, d / base_dir.name)
    summary = _run(d / name, algorithm=name, workers=workers)
  printed = _reported(d, capsys)
  variant = _variant(printed, workers)
  assert variant.startswith(name)
  assert_tables_hold(printed, variant, workers, summary, base)


@pytest.mark.parametrize("engine", ENGINE_CASES)
def test_a_run_on_every_engine_is_reported(engine, tmp_path, capsys):
  """A run on each engine, of an algorithm it runs: the report names the
  engine, and its time is the simulated one on a simulated engine, the
  wall time otherwise."""
  d = tmp_path / "cmp"
  summary = _run(d / "run", algorithm=engine_variant(engine), workers=2, engine=engine)
  assert ("simulated_time_s" in summary) == ENGINES.get(engine).simulated
  printed = _reported(d, capsys)
  assert f"on the {engine} engine." in (d / report.REPORT).read_text()
  assert_tables_hold(printed, _variant(printed, 2), 2, summary)


@pytest.mark.parametrize("task", task_names())
def test_every_registered_tasks_runs_are_reported_in_its_metric(task, tmp_path, capsys):
  """The baseline and a distributed algorithm on a registered task: the
  report's tables are in the task's target metric, with its direction."""
  d = tmp_path / "cmp"
  flags = dict(dataset=f"task:{task}", model=RunConfig().model.model)
  base = _run(d / "base", algorithm=baseline(), workers=1, **flags)
  summary = _run(d / "run", algorithm=engine_variant(TINY["engine"]), workers=2, **flags)
  printed = _reported(d, capsys)
  metric = registered(task).target_metric
  assert summary["target_metric"] == base["target_metric"] == metric
  assert_tables_hold(printed, baseline(), 1, base, base)
  assert_tables_hold(printed, _variant(printed, 2), 2, summary, base)


# t_{0.975, df} as published (e.g. NIST/SEMATECH's table of Student's t):
# df 1, 2, 3, 9, 30, and the normal quantile as df grows.
@pytest.mark.parametrize("df,quantile", [(1, 12.706205), (2, 4.302653), (3, 3.182446),
                                         (9, 2.262157), (30, 2.042272), (40, 2.021075),
                                         (120, 1.979930), (10**6, 1.959966)])
def test_t_quantiles_are_students(df, quantile):
  assert intervals.t_quantile(df) == pytest.approx(quantile, abs=2e-6)


def test_an_interval_is_the_mean_and_students_t_interval():
  """Three values: numpy's mean ± t_{0.975,2} s / √3, worked out here; one
  value has none; a missing or NaN figure is left out."""
  values = [0.9712, 0.9755, 0.9726]
  half = 4.302652729749462 * np.std(values, ddof=1) / np.sqrt(3)
  got = intervals.Interval.of([*values, None, float("nan")])
  assert got.n == 3 and got.mean == pytest.approx(np.mean(values), abs=1e-15)
  assert (got.low, got.high) == pytest.approx((np.mean(values) - half, np.mean(values) + half),
                                              abs=1e-15)
  assert f"{got:.4f}" == f"{np.mean(values):.4f} ± {half:.4f}"
  assert got.to_dict() == {"mean": got.mean, "low": got.low, "high": got.high, "n": 3}
  one = intervals.Interval.of([0.5, None])
  assert (one.low, one.high, one.n, f"{one:.2f}") == (0.5, 0.5, 1, "0.50")
  assert intervals.Interval.of([None]) is None


def test_an_intervals_half_width_is_given_to_its_means_last_place():
  """A `g` format keeps the mean's significant digits and gives the half-width
  to the same decimal place (0.0248 beside 0.25 is 0.02, not 0.02484)."""
  interval = intervals.Interval.of([0.24, 0.25, 0.26])  # half-width 4.3027 * 0.01 / √3
  assert f"{interval:.4g}" == "0.25 ± 0.02"
  assert f"{interval:.4f}" == "0.2500 ± 0.0248"
  assert f"{intervals.Interval.of([28240, 28251, 28260]):,.0f}" == "28,250 ± 25"
  assert f"{intervals.Interval.of([6.4e-05, 6.5e-05, 6.6e-05]):.4g}" == "6.5e-05 ± 2.484e-06"


def test_two_cells_are_apart_only_where_their_intervals_do_not_meet():
  a = intervals.Interval(0.90, 0.88, 0.92, 3)
  b = intervals.Interval(0.95, 0.93, 0.97, 3)
  touching = intervals.Interval(0.94, 0.92, 0.96, 3)
  assert intervals.separation(b, a) == 1 and intervals.separation(a, b) == -1
  assert intervals.separation(a, touching) == 0 and intervals.separation(touching, b) == 0
  single = intervals.Interval(0.99, 0.99, 0.99, 1)  # one seed: nothing to tell apart by
  assert intervals.separation(single, a) == 0 and intervals.separation(a, single) == 0


def test_a_cell_whose_seeds_partly_diverged_says_over_how_many(tmp_path):
  """Of three seeds, one diverged: the cell's figure is over the two others,
  and says so; a cell whose every seed diverged says diverged."""
  for seed, accuracy in enumerate([0.8, 0.9, None]):
    summary = {"test_accuracy": accuracy, "samples": 80, "simulated_time_s": 1.0 + seed}
    if accuracy is None:
      summary |= {"status": "diverged", "divergence": "loss nan", "diverged_at_step": 3}
    _run_dir(tmp_path, f"asp-m2-seed{seed}", summary, algorithm="asp", workers=2, seed=seed)
    _run_dir(tmp_path, f"ssp-m2-seed{seed}", {"test_accuracy": None, "samples": 8,
             "simulated_time_s": 1.0, "status": "diverged", "diverged_at_step": 2},
             algorithm="ssp", workers=2, seed=seed)
  printed = report.Report(tmp_path).tables()
  half = 12.706204736174694 * np.std([0.8, 0.9], ddof=1) / np.sqrt(2)
  assert table(printed, "Test accuracy")["2"] == {
      "asp": f"0.8500 ± {half:.4f} (2 of 3 seeds)", "ssp_s3": report.DIVERGED}
  assert table(printed, "Speedup")["ssp_s3 ×2"]["time (s)"] == "diverged at step 2, 2, 2"


def test_a_cell_resumed_on_a_real_engine_says_after_which_step_its_figures_were_measured(
    tmp_path):
  for name, resumed in (("asp-m4", {"measured_from_step": 6}), ("asp-m2", {})):
    _run_dir(tmp_path, name, {"samples": 1000, "test_accuracy": 0.9, "wall_time_s": 2.0,
                              "engine": "ray", **resumed},
             evals=[(12, 0.9, 2.0)], algorithm="asp", workers=int(name[-1]), engine="ray")
  printed = report.Report(tmp_path).tables()
  section = printed.split("### Cells resumed on a real engine\n\n")[1]
  assert section.startswith(report_tables.RESUMED_NOTE)
  assert section[len(report_tables.RESUMED_NOTE):].splitlines()[0] == "- `asp-m4`: after step 6"
  assert "asp-m2" not in section
