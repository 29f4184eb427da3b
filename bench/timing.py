"""Interleaved A/B timing: both arms measured in the same process, same run."""
from __future__ import annotations

import platform
import statistics
import time
from typing import Callable

import jax


def interleaved(arms: dict[str, Callable[[int], None]], steps: int, rounds: int,
                warmup: int = 3) -> dict[str, list[float]]:
  """Seconds per step of each arm, one figure per round.

  Each arm is `run(n)`: take n steps and block until they are done. Arms
  alternate within every round, so drift in the machine's load hits both.
  """
  for run in arms.values():
    run(warmup)  # compile and warm caches
  times: dict[str, list[float]] = {name: [] for name in arms}
  for _ in range(rounds):
    for name, run in arms.items():
      start = time.perf_counter()
      run(steps)
      times[name].append((time.perf_counter() - start) / steps)
  return times


def machine() -> str:
  devices = jax.devices()
  return (f"{platform.processor() or platform.machine()}, {len(devices)} x "
          f"{devices[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")


def report(title: str, times: dict[str, list[float]], baseline: str) -> float:
  """Prints min/median per arm and the median ratio to `baseline`; returns the ratio."""
  base = statistics.median(times[baseline])
  print(f"\n{title}")
  print(f"{'arm':<28}{'min ms':>10}{'median ms':>12}{'ratio':>8}")
  for name, ts in times.items():
    median = statistics.median(ts)
    print(f"{name:<28}{min(ts) * 1e3:>10.3f}{median * 1e3:>12.3f}{median / base:>8.3f}")
  return statistics.median(times[next(n for n in times if n != baseline)]) / base
