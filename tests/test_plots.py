"""The report's plots: one legend entry per line, and 14 variants told apart."""
import itertools

import matplotlib.colors
import pytest

from jaxdl import plots, report
from jaxdl.compare import DEFAULT_GRID
from tests.test_report import _run_dir


def _legend_texts(fig) -> list[str]:
  return [t.get_text() for t in fig.legends[0].get_texts()]


@pytest.fixture
def gossip(tmp_path):
  """sgd and two gosgd variants at 4 workers on two networks: p=0.1's
  throughput equals p=1's on 10gbps only."""
  d = tmp_path / "cmp"
  for net, p01_time in (("10gbps", 0.5), ("1gbps", 0.8)):
    for name, algorithm, m, time, extra in (
        ("sgd-m1", "sgd", 1, 1.0, {}),
        ("gosgd_p1-m4", "gosgd", 4, 0.5, {"gossip_probability": 1.0}),
        ("gosgd_p0.1-m4", "gosgd", 4, p01_time, {"gossip_probability": 0.1})):
      _run_dir(d, f"{name}-{net}", {"samples": 1000, "test_accuracy": 0.9,
                                    "simulated_time_s": time},
               evals=[(1, 0.9, 1.0)], algorithm=algorithm, workers=m, network=net, **extra)
  return d


def test_a_variant_is_one_legend_entry_and_a_coincidence_is_said_once(gossip):
  fig = plots.speedup_against_workers(report.Report(gossip))
  texts = _legend_texts(fig)
  titles = [ax.get_title() for ax in fig.axes]
  assert sorted(titles) == ["network 10gbps", "network 1gbps"]
  # each variant once; p=0.1 lay on p=1 in the 10gbps panel only, and says where
  assert len(texts) == len(set(texts)) == 3, texts
  assert "linear" in texts
  assert ({"gosgd_p1", "gosgd_p0.1 (= gosgd_p1 in network 10gbps)"} <= set(texts)
          or {"gosgd_p0.1", "gosgd_p1 (= gosgd_p0.1 in network 10gbps)"} <= set(texts)), texts
  # on one network alone it lies on p=1 in every panel it is in: no panel named
  one = report.Report(gossip)
  one_fig = plots.accuracy_against_workers(one)
  texts = _legend_texts(one_fig)  # the same accuracies at 4 workers
  assert "gosgd_p0.1 (= gosgd_p1)" in texts or "gosgd_p1 (= gosgd_p0.1)" in texts, texts


def test_the_default_comparisons_14_variants_are_told_apart(tmp_path):
  labels = [v.label for v in DEFAULT_GRID.variants]
  assert len(labels) == 14
  styles = {v: plots.variant_style(v) for v in labels}
  assert len({(s["color"], s["marker"], str(s["linestyle"])) for s in styles.values()}) == 14
  assert len({s["color"] for s in styles.values()}) == 14
  for a, b in itertools.combinations(labels, 2):
    sa, sb = styles[a], styles[b]
    # colours alike (a hue's dark and light: tab20's pairs) must differ in both
    # marker and line style; colours apart need not
    hue = lambda c: matplotlib.colors.rgb_to_hsv(c[:3])
    (ha, sa_, va), (hb, sb_, vb) = hue(sa["color"]), hue(sb["color"])
    if abs(ha - hb) < 0.04 or min(abs(ha - hb), 1 - abs(ha - hb)) < 0.04:
      assert sa["marker"] != sb["marker"] and sa["linestyle"] != sb["linestyle"], (a, b)
  # drawn: every line of a variant carries its style
  d = tmp_path / "all"
  for i, v in enumerate(DEFAULT_GRID.variants):
    m = 1 if v.label == "sgd" else 4
    _run_dir(d, f"{v.label}-m{m}", {"samples": 1000, "test_accuracy": 0.5 + i / 100,
                                    "simulated_time_s": 1.0},
             evals=[(1, 0.5, 1.0)], algorithm=v.algorithm, workers=m, **dict(v.settings))
  fig = plots.accuracy_against_workers(report.Report(d))
  drawn = [l for l in fig.axes[0].get_lines() if l.get_label() != "sgd (1 worker)"]
  assert len(drawn) == 13
  looks = {(l.get_marker(), matplotlib.colors.to_rgba(l.get_color()), str(l.get_linestyle()))
           for l in drawn}
  assert len(looks) == 13
  for line in drawn:
    style = plots.variant_style(line.get_label())
    assert (line.get_marker(), matplotlib.colors.to_rgba(line.get_color())) == (
        style["marker"], style["color"])
