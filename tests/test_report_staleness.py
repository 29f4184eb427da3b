"""The report's staleness distribution: a run's figures from its recorded
histogram, worked out by hand, and the table's mean and 95% interval over
seeds, against numpy's."""
import math

import numpy as np
import pytest

from jaxdl import report
from jaxdl.report.staleness import distribution
from tests.registry_cases import held, table
from tests.test_report import _run_dir

# Three seeds of one cell, as summary.json holds them (staleness -> updates),
# and their figures by hand: updates, mean, std (n in the denominator),
# p10 / p50 / p90 (nearest rank: of 5 updates the 1st, 3rd and 5th), max.
HISTOGRAMS = ({"0": 1, "1": 2, "3": 1, "10": 1}, {"3": 5}, {"2": 2, "4": 2, "6": 1})
BY_HAND = ((5, 3.0, math.sqrt((9 + 2 * 4 + 0 + 49) / 5), 0, 1, 10, 10),
           (5, 3.0, 0.0, 3, 3, 3, 3),
           (5, 3.6, math.sqrt((2 * 1.6**2 + 2 * 0.4**2 + 2.4**2) / 5), 2, 4, 6, 6))
NAMES = ("updates", "mean", "std", "p10", "p50", "p90", "max")


@pytest.mark.parametrize("histogram,figures", list(zip(HISTOGRAMS, BY_HAND)))
def test_a_runs_distribution_is_its_histograms(histogram, figures):
  assert distribution(histogram) == pytest.approx(dict(zip(NAMES, figures)))


def test_percentiles_take_the_nearest_rank_and_an_empty_histogram_has_none():
  # 10 updates: p10 is the 1st (0), p50 the 5th (1), p90 the 9th (1); p90 of 11 is the 10th
  assert distribution({0: 1, 1: 8, 7: 1}) == pytest.approx(
      {"updates": 10, "mean": 1.5, "std": math.sqrt((1.5**2 + 8 * 0.5**2 + 5.5**2) / 10),
       "p10": 0, "p50": 1, "p90": 1, "max": 7})
  assert distribution({0: 1, 1: 8, 7: 2})["p90"] == 7
  assert distribution({}) is None and distribution({"3": 0}) is None


def test_the_table_gives_each_figure_over_the_seeds(tmp_path):
  for seed, histogram in enumerate(HISTOGRAMS):
    _run_dir(tmp_path, f"asp-m4-seed{seed}", {
        "samples": 40, "test_accuracy": 0.9, "simulated_time_s": 1.0, "staleness_mean": 3.0,
        "staleness_max": max(map(int, histogram)), "staleness_histogram": histogram},
             algorithm="asp", workers=4, seed=seed)
  # a cell without staleness (sgd) has no row; a diverged seed is left out of its cell's
  _run_dir(tmp_path, "sgd-m1", {"samples": 40, "test_accuracy": 0.95,
                                "simulated_time_s": 1.0}, algorithm="sgd", workers=1)
  for seed in (0, 1):
    _run_dir(tmp_path, f"dc_asgd-m4-seed{seed}", {
        "samples": 40, "simulated_time_s": 1.0, **({"status": "diverged"} if seed else {}),
        "staleness_histogram": HISTOGRAMS[seed]}, algorithm="dc_asgd", workers=4, seed=seed)
  printed = report.Report(tmp_path).tables()
  rows = table(printed, "Staleness of the applied updates")
  columns = np.asarray(BY_HAND, dtype=np.float64).T
  specs = (".0f", ".2f", ".2f", ".1f", ".1f", ".1f", ".4g")
  assert rows["asp ×4"] == {"seeds": "3", **{name: held(column, spec) for name, column, spec
                                             in zip(NAMES, columns, specs)}}
  assert rows["asp ×4"]["std"] == "1.71 ± 4.54"  # (3.63, 0, 1.50): numpy's, written out
  assert rows["dc_asgd ×4"] == {"seeds": "1 of 2", **{
      name: format(x, spec) for name, x, spec in zip(NAMES, BY_HAND[0], specs)}}
  assert set(rows) == {"asp ×4", "dc_asgd ×4"}


def test_a_report_without_histograms_has_no_distribution(tmp_path):
  _run_dir(tmp_path, "asp-m4", {"samples": 40, "test_accuracy": 0.9, "simulated_time_s": 1.0,
                                "staleness_mean": 3.0, "staleness_max": 3},
           algorithm="asp", workers=4)
  assert "Staleness of the applied updates" not in report.Report(tmp_path).tables()
