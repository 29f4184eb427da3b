"""Stragglers on real processes: with --compute-time, every asynchronous
worker on the ray engine sleeps until each iteration's compute has taken
the simulator's modelled time for it (its speed, --jitter, stragglers: the
sim engine's draws for that worker and iteration). The trace records the
padded times, replays on the sim bit for bit, and its wall times show the
slow workers."""
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

import jaxdl
from jaxdl import compare, trace
from jaxdl.build import prepare
from jaxdl.config import RunConfig
from jaxdl.engines.base import slice_of
from jaxdl.engines.sim import CostFields, cost_model
from tests.engines.test_ray import _replayed, ray_instance  # noqa: F401 (a fixture)
from tests.marks import default_first

RUN = dict(dataset="digits", model="mlp", progress=False, eval_every=6)
COMPUTE_S = 0.08
"""A batch's modelled seconds at speed 1: its jittered draws stay well above a
real mlp batch's few ms even on a loaded machine, so nearly every one is padded."""
SLOWED = dict(compute_time=COMPUTE_S, jitter=0.3, straggler_prob=0.2, straggler_slowdown=3.0)
CLOCK_S = 1e-3
"""Slack of a comparison of the server's wall-clock times (time.time())."""

# The event that ends a worker's compute of iteration c (its duration the
# padded seconds), and those of the worker's own that come before its next.
COMPUTED = {"asp": "apply", "lc_asgd": "apply", "dc_asgd": "apply", "easgd": "local",
            "gosgd": "local", "ad_psgd": "pull"}
OWN = ("pull", "apply", "local", "exchange", "send", "average")


def _events(out) -> list[trace.Event]:
  return list(trace.read_trace(out / "trace.jsonl"))


def _modelled(config: RunConfig):
  """The simulator's compute_time(worker, iteration) for `config`."""
  built = prepare(config)
  return cost_model(slice_of(config, CostFields), built.problem, built.streams).compute_time


def _since_last_own(events, kind: str) -> dict[tuple[int, int], tuple[float, float]]:
  """Per (worker, iteration) of each `kind` event: (its duration, the wall
  seconds since the worker's own event before it, during which it computed)."""
  last, out = {}, {}
  for e in events:
    if e.kind in OWN:
      if e.kind == kind and e.worker in last:
        out[e.worker, e.iteration] = e.duration, e.time - last[e.worker]
      last[e.worker] = e.time
  return out


@pytest.mark.parametrize("name,settings", default_first([
    ("asp", {}), ("asp", {"servers": 2}), ("lc_asgd", {}), ("dc_asgd", {}),
    ("easgd", {"communication_period": 2}), ("gosgd", {"gossip_probability": 0.5}),
    ("ad_psgd", {})]))
def test_each_compute_is_padded_to_the_simulators_modelled_time(ray_instance, tmp_path, name,
                                                                settings):
  """3 workers of speeds 1, 1, 0.5, jitter sigma 0.3, 20% of iterations 3x
  slower: each recorded compute is the modelled time (never less; longer
  only where the real compute was), the server's wall times between a
  worker's events are never shorter than it, a parameter server's times are
  the sim schedule's for the same iterations, and the trace replays bit for
  bit."""
  config = RunConfig.make(algorithm=name, engine="ray", workers=3, batch_sizes=(8, 8, 8),
                          worker_speeds=(1.0, 1.0, 0.5), steps=8, out=str(tmp_path / "ray"),
                          **SLOWED, **settings, **RUN)
  run = jaxdl.run(config)
  modelled = _modelled(config)
  computed = _since_last_own(_events(tmp_path / "ray"), COMPUTED[name])
  assert len(computed) >= 8 * 3 - 3  # every worker's iterations after its first event
  exact = set()  # the iterations whose real compute took less than modelled
  for (w, c), (duration, wall) in computed.items():
    want = modelled(w, c)
    assert duration >= want * (1 - 1e-6) and wall >= want - CLOCK_S, (w, c, duration, wall)
    if duration == pytest.approx(want, rel=1e-6):
      exact.add((w, c))
  assert len(exact) >= 0.8 * len(computed), (len(exact), len(computed))
  # the draws: speeds (COMPUTE_S, twice that for the slow worker), jitter, stragglers 3x
  factors = [modelled(w, c) * (0.5 if w == 2 else 1.0) / COMPUTE_S for w, c in computed]
  assert len({round(f, 6) for f in factors}) == len(factors) and max(factors) > 2.5
  if COMPUTED[name] == "apply":  # the sim's schedule: the same seconds, iteration by iteration
    jaxdl.run(config.replace(engine="sim", dry_run=True, out=str(tmp_path / "schedule")))
    schedule = {(e.worker, e.iteration): e.duration for e in _events(tmp_path / "schedule")
                if e.kind == "apply"}
    same = exact & schedule.keys()
    assert len(same) >= len(exact) // 2
    assert all(computed[k][0] == np.float32(schedule[k]) for k in same)
  replayed = _replayed(tmp_path)
  assert replayed["params_fingerprint"] == run["params_fingerprint"]


def test_ssp_holds_its_bound_over_a_worker_four_times_slower(ray_instance, tmp_path):
  """ssp (s = 2), speeds 1, 1, 1, 0.25 on equal batches, 0.3 s a batch at
  speed 1: at every pull the puller is at most s iterations ahead of the
  slowest worker, every fast worker waits for it, and the slow worker's
  iterations take about 4 times a fast one's in wall time (from its pull to
  its apply, the transfers and the server's work included: a ratio above
  2.5 allows 300 ms of those an iteration; a loaded machine took 160 ms)."""
  bound, seconds = 2, 0.3
  run = jaxdl.run(RunConfig.make(
      algorithm="ssp", engine="ray", workers=4, staleness_bound=bound, batch_sizes=(8,) * 4,
      worker_speeds=(1.0, 1.0, 1.0, 0.25), compute_time=seconds, steps=10,
      out=str(tmp_path / "ray"), **RUN))
  events = _events(tmp_path / "ray")
  clocks, pulled, took = [0] * 4, {}, defaultdict(list)
  for e in events:
    if e.kind == "pull":
      assert e.iteration == clocks[e.worker] and clocks[e.worker] - min(clocks) <= bound
      pulled[e.worker] = e.time
    elif e.kind == "apply":
      clocks[e.worker] += 1
      took[e.worker].append(e.time - pulled[e.worker])
      # the recorded compute: at least the modelled time, 0.3 s / speed
      assert e.duration >= np.float32(seconds / (0.25 if e.worker == 3 else 1.0)), e
  waits = {e.worker for e in events if e.kind == "wait" and e.duration > 0}
  assert {0, 1, 2} <= waits and all(run["wait_s"][w] > 0 for w in (0, 1, 2))
  assert run["batches_per_worker"][3] < min(run["batches_per_worker"][:3])
  slow, fast = np.median(took[3]), np.median([t for w in (0, 1, 2) for t in took[w]])
  assert slow >= 4 * seconds - CLOCK_S and fast >= seconds - CLOCK_S
  assert 2.5 < slow / fast < 4.5, (slow, fast)


EXPERIMENT = Path(__file__).parents[2] / "experiments" / "stragglers.py"


@pytest.mark.parametrize("engine", ["sim", "ray"])
def test_the_straggler_experiment_runs_on_either_engine(tmp_path, engine):
  """experiments/stragglers.py with --engine ray keeps its modelled compute
  times (emulated, not dropped as a simulated cluster's): every cell is a
  valid run, its workers slowed as on the sim."""
  grid = compare.apply_args(compare.load_experiment(str(EXPERIMENT)), compare.CompareArgs(),
                            {"engine": engine})
  assert compare.check_cells(grid, tmp_path) == {}
  run = dict(grid.run)
  assert (run["engine"], run["compute_time"], run["worker_speeds"]) == (
      engine, 0.05, (1.0, 1.0, 1.0, 0.25))
  assert all(("network" in c.overrides) == (engine == "sim") for c in grid.cells())


@pytest.mark.slow
def test_the_straggler_comparison_on_real_processes(ray_instance, tmp_path):
  """A short run of the straggler comparison on ray (asp and ssp s = 3):
  the report names the engine, the slow worker makes fewer updates, and
  under SSP the fast ones wait for it, as on the simulator."""
  from jaxdl.cli import main
  out = tmp_path / "cmp"
  assert main(["compare", "--experiment", str(EXPERIMENT), "--engine", "ray", "--algorithms",
               "asp", "ssp_s3", "--steps", "10", "--out", str(out), "--no-progress"]) == 0
  report = (out / "report.md").read_text()
  assert "2 training runs, 0 timing runs, on the ray engine." in report
  summaries = {c: json.loads((out / f"{c}-m4" / "summary.json").read_text())
               for c in ("asp", "ssp_s3")}
  for cell, s in summaries.items():
    assert s["engine"] == "ray" and s["batches_per_worker"][3] < min(s["batches_per_worker"][:3])
    # every batch padded: jitter 0.1 leaves it above 0.6 x its 0.05 s (an mlp
    # gradient of 8 examples takes a few ms here)
    applies = [e for e in _events(out / f"{cell}-m4") if e.kind == "apply"]
    assert min(e.duration for e in applies) > 0.03
  assert min(summaries["ssp_s3"]["wait_s"][:3]) > 0 and not any(summaries["asp"]["wait_s"])
