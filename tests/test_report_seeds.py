"""The report over seeds: the partition and parallelism tables and the plots
give each cell's mean over its seeds and its 95% interval, checked against
numpy's mean and the t interval worked out here."""
import json

import matplotlib.collections
import numpy as np
import pytest

from jaxdl import plots, report
from jaxdl.report import intervals
from tests.registry_cases import T_975_2, held, table
from tests.test_report import _run_dir

SEEDS = (0, 1, 2)


def _seeded(root, name, summaries, evals=None, **config):
  """A cell's run directories over SEEDS, `summaries` and `evals` one per seed."""
  for i, seed in enumerate(SEEDS):
    _run_dir(root, f"{name}-seed{seed}", summaries[i], evals=(evals or [()] * 3)[i],
             seed=seed, **config)


def _band(values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Numpy's mean, low and high of three runs' values (rows), per column."""
  xs = np.asarray(values, dtype=np.float64)
  mean, half = xs.mean(axis=0), T_975_2 * xs.std(axis=0, ddof=1) / np.sqrt(len(xs))
  return mean, mean - half, mean + half


def test_the_partition_table_gives_each_cell_its_mean_and_interval(tmp_path):
  """bsp x2 over three seeds: one row, each figure (and each worker's batch
  seconds) numpy's mean ± t interval of its runs' summaries."""
  accuracy, times, idle = [0.80, 0.84, 0.83], [2.0, 2.2, 2.1], [0.30, 0.34, 0.31]
  per_worker = [[0.010, 0.020], [0.011, 0.022], [0.012, 0.019]]
  _seeded(tmp_path, "bsp-m2", [
      {"samples": 1000, "test_accuracy": a, "simulated_time_s": t, "epochs": 2.0,
       "idle_fraction": f, "batch_sizes": [8, 8], "batch_seconds_per_worker": w,
       "batch_seconds_std": [0.001, 0.002],
       "batch_seconds_histogram": {"edges": [0.0, 0.1], "counts": [[3], [3]]}}
      for a, t, f, w in zip(accuracy, times, idle, per_worker)], algorithm="bsp", workers=2)
  printed = report.Report(tmp_path).tables()
  rows = table(printed, "Partitions")
  assert list(rows) == ["bsp ×2"]
  assert rows["bsp ×2"] == {
      "batch sizes at step 0": "[8, 8]",
      "time per epoch (s)": held([t / 2.0 for t in times], ".4g") + " (3 seeds)",
      "idle (% of worker time)": held([100 * f for f in idle], ".1f") + " (3 seeds)",
      "batch seconds per worker (mean ± 95% interval over the seeds)": " / ".join(
          held(worker, ".3g") for worker in zip(*per_worker)),
      "test accuracy": held(accuracy, ".4f") + " (3 seeds)"}


def test_the_parallelisms_table_gives_each_cell_its_mean_and_interval(tmp_path):
  """GPipe and one device over three seeds: a row each, its samples/s,
  busy % per device, measured bubble, memory, time per epoch, time to the
  target and cost numpy's mean ± t interval of its runs' summaries."""
  walls, busy = [2.0, 2.5, 1.6], [[0.5, 0.25], [0.55, 0.3], [0.45, 0.2]]
  bubbles, epochs, costs, reached = [0.6, 0.65, 0.62], [1.0, 1.2, 1.1], [0.5, 0.6, 0.55], \
      [1.9, 2.0, 2.2]
  memory = {"arguments": 3e6, "temporaries": 1e6, "outputs": 0, "aliased": 0}
  mesh = [{"samples": 1000, "wall_time_s": w, "test_accuracy": 0.9, "devices": 2,
           "batch_sizes": [32], "seconds_per_epoch": e, "cost": c, "stages": 2,
           "microbatches": 4, "memory_per_device_bytes": memory, "busy_fraction_per_device": b,
           "bubble_fraction_measured": f, "bubble_fraction_ideal": 0.2}
          for w, b, f, e, c in zip(walls, busy, bubbles, epochs, costs)]
  evals = [[(2, 0.9, t)] for t in reached]
  _seeded(tmp_path, "gpipe-m1", mesh, evals, algorithm="sgd", workers=1, engine="mesh")
  one = {k: v for k, v in mesh[0].items() if "bubble" not in k and "busy" not in k
         and k not in ("stages", "microbatches")}
  _seeded(tmp_path, "sgd-m1", [one] * 3, [[(2, 0.9, 1.5)]] * 3, algorithm="sgd", workers=1,
          engine="mesh")
  (tmp_path / "grid.json").write_text(json.dumps({"cells": [
      {"name": f"{v}-m1-seed{s}", "variant": v} for v in ("sgd", "gpipe") for s in SEEDS]}))
  rows = table(report.Report(tmp_path, target=0.9).tables(), "Parallelisms")
  assert list(rows) == ["sgd", "gpipe"]
  three = " (3 seeds)"
  assert list(rows["gpipe"].values()) == [
      "pipeline, 2 stages x 4 micro-batches", "2", "32",
      held([1000 / w for w in walls], ",.0f") + three,
      " / ".join(held([100 * b for b in device], ".0f") for device in zip(*busy)),
      held([100 * f for f in bubbles], ".0f") + " (ideal 20)",
      "4.00 ± 0.00" + three, held(epochs, ".4g") + three, held(reached, ".4g") + three,
      held(costs, ".4g") + three]
  assert rows["sgd"]["busy (% per device)"] == "—"


def test_a_curve_is_the_mean_of_its_seeds_with_its_interval_as_a_band(tmp_path):
  """asp x4 over three seeds, evaluated at the same steps: its curve against
  epochs is numpy's mean of the runs' scores, shaded between numpy's t
  interval; against workers, the mean with the interval as error bars; one
  legend entry for it."""
  scores = [[0.5, 0.7, 0.8], [0.55, 0.72, 0.85], [0.45, 0.69, 0.83]]
  evals = [[(s, a, 1.0 + s) for s, a in zip((1, 2, 3), run)] for run in scores]
  _seeded(tmp_path, "asp-m4", [{"samples": 1000, "test_accuracy": run[-1],
                                "simulated_time_s": 1.0} for run in scores], evals,
          algorithm="asp", workers=4)
  mean, low, high = _band(scores)
  r = report.Report(tmp_path)
  fig = plots.curves(r, "epoch")
  ax = fig.axes[0]
  (line,) = [l for l in ax.get_lines() if l.get_label() == "asp"]
  np.testing.assert_allclose(line.get_xdata(), [0.5, 1.0, 1.5], rtol=0, atol=1e-15)
  np.testing.assert_allclose(line.get_ydata(), mean, rtol=0, atol=1e-15)
  (band,) = [c for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection)]
  edge = band.get_paths()[0].vertices[:, 1]
  assert all(np.isclose(edge, y).any() for y in [*low, *high])
  np.testing.assert_allclose(band.get_facecolor()[0][:3], line.get_color()[:3])
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ["asp"]
  assert "mean over the seeds" in fig.get_suptitle()

  workers = plots.accuracy_against_workers(r)
  (bars,) = workers.axes[0].containers
  data, _, (segments,) = bars.lines
  assert list(data.get_ydata()) == pytest.approx([mean[-1]], abs=1e-15)
  np.testing.assert_allclose(segments.get_segments()[0][:, 1], [low[-1], high[-1]], atol=1e-12)


def test_runs_evaluated_at_different_steps_are_interpolated(tmp_path):
  """Two runs evaluated at different epochs: each run's score interpolated
  linearly at every evaluation's epoch inside its own range, the mean over
  the runs that reach it, and the curve says it was interpolated."""
  a = [{"step": 2, "epoch": 1.0, "score": 0.2}, {"step": 6, "epoch": 3.0, "score": 0.6}]
  b = [{"step": 4, "epoch": 2.0, "score": 0.5}, {"step": 8, "epoch": 4.0, "score": 0.7}]
  curve = intervals.mean_curve([a, b], "epoch")
  assert curve.interpolated and curve.x == [1.0, 2.0, 3.0, 4.0]
  # a at 2.0: 0.4 (halfway), b at 3.0: 0.6; a stops at 3.0, b starts at 2.0
  assert curve.mean == pytest.approx([0.2, (0.4 + 0.5) / 2, (0.6 + 0.6) / 2, 0.7], abs=1e-12)
  assert [i.n for i in curve.scores] == [1, 2, 2, 1]
  same = intervals.mean_curve([a, [dict(p, score=p["score"] + 0.1) for p in a]], "epoch")
  assert not same.interpolated and same.mean == pytest.approx([0.25, 0.65], abs=1e-12)


def test_one_seed_is_shown_as_before_seeds_were_aggregated(tmp_path):
  """A cell of one run: its partition row gives each worker's batch seconds
  as mean ± std (its own spread), and its plots its line alone: no band, no
  error bars, no title."""
  _run_dir(tmp_path, "bsp-m2", {
      "samples": 1000, "test_accuracy": 0.8, "simulated_time_s": 3.0, "epochs": 2.0,
      "idle_fraction": 0.3, "batch_sizes": [8, 8], "batch_seconds_per_worker": [0.01, 0.02],
      "batch_seconds_std": [0.001, 0.002],
      "batch_seconds_histogram": {"edges": [0.0, 0.1], "counts": [[3], [3]]}},
      evals=[(1, 0.5, 1.0), (2, 0.8, 2.0)], algorithm="bsp", workers=2)
  r = report.Report(tmp_path)
  assert table(r.tables(), "Partitions")["bsp ×2"] == {
      "batch sizes at step 0": "[8, 8]", "time per epoch (s)": "1.5",
      "idle (% of worker time)": "30.0",
      "batch seconds per worker (mean ± std)": "0.01 ± 0.001 / 0.02 ± 0.002",
      "test accuracy": "0.8000"}
  for fig in (plots.curves(r, "time"), plots.accuracy_against_workers(r)):
    assert fig.get_suptitle() == "" and not fig.axes[0].containers
    assert not any(isinstance(c, matplotlib.collections.PolyCollection)
                   for c in fig.axes[0].collections)
