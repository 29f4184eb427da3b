"""What the registry-driven cases of tests/test_compare.py and
tests/test_report.py share: which cases run by default, the algorithm each
engine runs and the setting each algorithm is swept over (from what the
registries declare), and what a comparison's tables must hold of a cell,
read against its own summary.json.

Each case costs a compile per run, a compare case a pool process, a real
engine's its processes' start-up: one algorithm and the deterministic
engines run by default, the rest with the slow ones.
"""
import dataclasses
import math

import numpy as np

from jaxdl.algorithms import ALGORITHMS
from jaxdl.compare.grid import one_worker
from jaxdl.engines import ENGINES
from jaxdl.settings import allowed, base_type, field_types
from tests import marks
from tests.algorithms.test_setting_ranges import edges

DEFAULT_ALGORITHMS = ("ssp",)
ENGINE_CASES = [e if ENGINES.get(e).deterministic else marks.slow(e) for e in ENGINES]


def table(printed: str, heading: str) -> dict[str, dict[str, str]]:
  """The markdown table under the first heading that starts with `heading`:
  each row, by its first entry, as a column -> entry map."""
  section = printed.split(f"### {heading}", 1)[1].split("\n###", 1)[0]
  lines = [l for l in section.splitlines() if l.startswith("| ")]
  header, *rows = [[x.strip() for x in l.strip().strip("|").split("|")] for l in lines]
  return {r[0]: dict(zip(header[1:], r[1:])) for r in rows}


def assert_tables_hold(printed: str, variant: str, workers: int, summary: dict,
                       base: dict | None = None) -> None:
  """The tables of `printed` (compare's or report's) hold the cell's own
  numbers, as its summary.json has them: its metric, its error (and
  degradation against the baseline's `base` summary, if another cell's), its
  time (simulated, else wall), samples/s and speedup over the baseline."""
  metric, higher = summary["target_metric"], summary["higher_is_better"]
  score = summary[metric]
  assert math.isfinite(score) and (0 <= score <= 1 or not higher), score
  label = metric.replace("_", " ").capitalize()
  held = table(printed, f"{label} (layout")[str(workers)][variant]
  assert held == f"{score:.4f}", (variant, held, score)
  error_of = lambda s: 100 * (1 - s[metric]) if higher else s[metric]
  error = f"{error_of(summary):.2f}"
  if base is not None and base is not summary:
    error += f" ({100 * (error_of(summary) - error_of(base)) / error_of(base):+.1f}%)"
  errors = table(printed, f"{'Test error %' if higher else label}, degradation")
  assert errors[str(workers)][variant] == error, (variant, errors, error)
  time_of = lambda s: s.get("simulated_time_s", s.get("wall_time_s"))
  row = table(printed, "Speedup")[f"{variant} ×{workers}"]
  throughput = summary["samples"] / time_of(summary)
  speedup = throughput * time_of(base) / base["samples"] if base is not None else None
  expected = (f"{time_of(summary):.4g}", f"{throughput:,.0f}",
              "—" if speedup is None else f"{speedup:.2f}")
  assert (row["time (s)"], row["samples/s"], row["speedup"]) == expected, (row, expected)


T_975_2 = 4.302652729749462  # Student's t, 97.5% quantile, 2 degrees of freedom


def held(values, spec: str) -> str:
  """Three values as the tables should give them: numpy's mean ± t_{0.975,2} s / √3."""
  xs = np.asarray(values, dtype=np.float64)
  assert len(xs) == 3
  half = T_975_2 * xs.std(ddof=1) / np.sqrt(len(xs))
  mean = f"{xs.mean():{spec}}"
  if spec.endswith("g") and "e" not in mean:  # a g format: the half-width to the mean's places
    decimals = mean.split(".")[1] if "." in mean else ""
    return f"{mean} ± {half:.{len(decimals)}f}"
  return f"{mean} ± {half:{spec.replace('+', '')}}"


def assert_intervals_hold(printed: str, variant: str, workers: int, summaries: list[dict],
                          bases: list[dict]) -> None:
  """The tables of `printed` give a cell of three seeds (`summaries`, in the
  seeds' order, as the baseline's `bases`) as numpy's mean of its runs' figures
  and the 95% t interval worked out here: its metric, its error and degradation
  against the baseline's run of the same seed, its samples/s."""
  metric, higher = summaries[0]["target_metric"], summaries[0]["higher_is_better"]
  label = metric.replace("_", " ").capitalize()
  scores = [s[metric] for s in summaries]
  assert table(printed, f"{label} (layout")[str(workers)][variant] == (
      held(scores, ".4f") + " (3 seeds)")
  error = lambda s: 100 * (1 - s[metric]) if higher else s[metric]
  errors = [error(s) for s in summaries]
  degradations = [100 * (e - error(b)) / error(b) for e, b in zip(errors, bases)]
  expected = held(errors, ".2f") + ("" if summaries == bases else
                                    f" ({held(degradations, '+.1f')}%)") + " (3 seeds)"
  errors_held = table(printed, f"{'Test error %' if higher else label}, degradation")
  assert errors_held[str(workers)][variant] == expected, (errors_held, expected)
  time_of = lambda s: s.get("simulated_time_s", s.get("wall_time_s"))
  row = table(printed, "Speedup")[f"{variant} ×{workers}"]
  assert row["samples/s"] == held([s["samples"] / time_of(s) for s in summaries], ",.0f") \
      + " (3 seeds)", row


def swept(name: str) -> tuple[str, list] | None:
  """The first setting of the algorithm `name` that declares its range
  (jaxdl.settings), and two values it allows: its default and a value on
  the range's edge (test_setting_ranges.edges); None if it has none."""
  cls = ALGORITHMS.get(name).settings
  for field in dataclasses.fields(cls):
    valid = allowed(cls, field.name)
    if valid is not None:
      inside, _ = edges(valid, base_type(field_types(cls)[field.name]))
      return field.name, [v for v in dict.fromkeys([field.default, *inside]) if v is not None][:2]
  return None


def engine_variant(engine: str) -> str:
  """The first registered algorithm that `engine` runs on more than one worker."""
  return next(n for n in ALGORITHMS
              if not one_worker(n) and ALGORITHMS.get(n).family in ENGINES.get(engine).families)
