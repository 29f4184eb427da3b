"""Results over seeds: the mean of a cell's runs and its 95% interval
(Student's t), and whether two cells' intervals are apart.

The interval of n values x_1..x_n is mean ± t_{0.975, n-1} · s / √n, with s
the sample standard deviation (n − 1 in its denominator): an interval that
holds the expected value over seeds 95% of the time, if the runs' values
are normal. One value has no interval.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable

import numpy as np

# t_{0.975, df}, the 97.5% quantile of Student's t with df degrees of freedom
# (scipy.stats.t.ppf(0.975, df)), for df = 1..30; past 30, the Cornish-Fisher
# expansion around the normal quantile (within 2e-6 of scipy's from 31 on).
T_975 = (12.706204736174694, 4.302652729749462, 3.1824463052837078, 2.7764451051977934,
         2.5705818356363146, 2.4469118511449786, 2.364624251592784, 2.306004135204166,
         2.262157162798205, 2.228138851986274, 2.200985160091639, 2.1788128296672284,
         2.1603686564627913, 2.144786687917804, 2.131449545559776, 2.1199052992212546,
         2.1098155778333156, 2.1009220402410382, 2.0930240544083087, 2.085963447265864,
         2.0796138447276795, 2.0738730679040254, 2.0686576104190486, 2.0638985616280245,
         2.0595385527532972, 2.0555294386428735, 2.0518305164802846, 2.0484071417952454,
         2.045229642132703, 2.0422724563012378)
Z_975 = 1.959963984540054  # the normal distribution's 97.5% quantile


def t_quantile(df: int) -> float:
  """t_{0.975, df}: the half-width of a 95% interval in standard errors."""
  if df < 1:
    raise ValueError(f"degrees of freedom {df}: 1 or more")
  if df <= len(T_975):
    return T_975[df - 1]
  z = Z_975
  return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
          + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


@dataclasses.dataclass(frozen=True)
class Interval:
  """The mean of a cell's values over its seeds and its 95% interval
  [low, high]; with one value (n = 1), low = high = mean. Formats as its
  mean, then `` ± half-width`` where n > 1 (a sign asked for, the mean's alone)."""
  mean: float
  low: float
  high: float
  n: int

  @classmethod
  def of(cls, values: Iterable[float | None]) -> Interval | None:
    """The interval of the values given (None or NaN: a run without this
    figure, left out); None where none is left."""
    xs = [float(x) for x in values if x is not None and not math.isnan(x)]
    if not xs:
      return None
    n = len(xs)
    mean = math.fsum(xs) / n
    if n == 1:
      return cls(mean, mean, mean, 1)
    s = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(n - 1) * s / math.sqrt(n)
    return cls(mean, mean - half, mean + half, n)

  @property
  def half_width(self) -> float:
    return (self.high - self.low) / 2

  def __format__(self, spec: str) -> str:
    mean = format(self.mean, spec)
    if self.n == 1:
      return mean
    half = spec.replace("+", "")
    if spec.endswith("g") and "e" not in mean:  # the half-width to the mean's last place
      places = len(mean.partition(".")[2])
      half = f"{half[:-1].partition('.')[0]}.{places}f"
    return f"{mean} ± {self.half_width:{half}}"

  def to_dict(self) -> dict[str, float | int]:
    """The interval as separate fields: mean, low, high, n."""
    return dataclasses.asdict(self)


def separation(a: Interval, b: Interval) -> int:
  """Whether two cells' 95% intervals are apart: 1 where a's lies wholly
  above b's, -1 wholly below, 0 where they overlap (or touch) or either has
  a single seed (no interval: nothing to tell them apart by)."""
  if a.n < 2 or b.n < 2:
    return 0
  if a.low > b.high:
    return 1
  if a.high < b.low:
    return -1
  return 0


@dataclasses.dataclass(frozen=True)
class MeanCurve:
  """The mean of a cell's learning curves over its seeds: at each x, the
  interval of the runs' scores."""
  x: list[float]
  scores: list[Interval]
  interpolated: bool
  """The runs were evaluated at different steps: each run's score is
  interpolated (linearly) at the x of every run's evaluations within its own
  range, and the interval is over the runs that reach that x."""

  @property
  def mean(self) -> list[float]:
    return [i.mean for i in self.scores]


def mean_curve(curves: list[list[dict[str, float]]], x: str) -> MeanCurve | None:
  """The mean curve of runs' evaluations (dicts with "step", `x` and
  "score"): where every run was evaluated at the same steps, the point of
  a step is the runs' mean `x` and the interval of their scores there; else
  the scores are interpolated (MeanCurve.interpolated). None without points."""
  curves = [c for c in curves if c]
  if not curves:
    return None
  steps = [[p["step"] for p in c] for c in curves]
  if all(s == steps[0] for s in steps):
    return MeanCurve([Interval.of(p[x] for p in points).mean for points in zip(*curves)],
                     [Interval.of(p["score"] for p in points) for points in zip(*curves)],
                     False)
  grid = sorted({p[x] for c in curves for p in c})
  scores = [Interval.of(float(np.interp(at, [p[x] for p in c], [p["score"] for p in c]))
                        for c in curves if c[0][x] <= at <= c[-1][x]) for at in grid]
  return MeanCurve(grid, scores, True)
