"""The simulator calibrated against the ray engine: `jaxdl calibrate`
measures a cost profile with one worker; then, for asp, ssp and gosgd at
M = 2 and 4, a ray run's training time (its trace's clock at the last
event) against what `--engine sim --cluster PROFILE.json` predicts for the
same config (its simulated time). Prints each ratio, predicted / measured.

  python -m bench.calibration                      # mlp, 300 steps a run
  python -m bench.calibration --model cnn --steps 200

On a cluster of several machines, the profile measures the links too, and
each ray run's workers go round robin over the machines other than the
driver's (a cluster of network namespaces, links shaped to 100 Mb/s):

  sudo .venv/bin/python -m bench.netns_cluster --workers 2 --rate 100mbit -- \
      .venv/bin/python -m bench.calibration --ray-address {address}
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import tyro

import jaxdl
from bench.timing import machine
from jaxdl import calibrate, rundir
from jaxdl.config import RunConfig
from jaxdl.engines import ray_driver


@dataclasses.dataclass(frozen=True)
class Args:
  model: str = "mlp"
  batch_size: int = 32
  steps: int = 300
  """Steps of each predicted run (a step: every worker's batch once, on average)."""
  calibration_steps: int = 500
  """Updates of each of the profile's one-worker runs."""
  algorithms: tuple[str, ...] = ("asp", "ssp", "gosgd")
  workers: tuple[int, ...] = (2, 4)
  ray_address: str | None = None
  """A Ray cluster to measure and run on (HOST:PORT); unset: a local instance."""


def main(args: Args) -> None:
  ray_driver.connect(args.ray_address)
  print(f"machine: {machine()}")
  base = RunConfig.make(model=args.model, batch_size=args.batch_size, progress=False,
                        ray_address=args.ray_address)
  with tempfile.TemporaryDirectory() as tmp:
    profile = calibrate.calibrate(base.replace(steps=args.calibration_steps),
                                  announce=lambda line: None)
    path = Path(tmp) / "profile.json"
    rundir.write_json(path, profile)
    print(f"profile ({args.calibration_steps} updates a run, 1 worker): "
          f"{calibrate.summary_line(profile)}")
    print(f"{'algorithm':<10}{'workers':>8}{'ray s':>9}{'sim s':>9}{'sim/ray':>9}"
          f"{'ray samples/s':>15}")
    rows = []
    for algorithm in args.algorithms:
      for m in args.workers:
        config = base.replace(algorithm=algorithm, workers=m, steps=args.steps,
                              eval_every=args.steps, checkpoint_every=args.steps)
        ray = jaxdl.run(config.replace(engine="ray", out=f"{tmp}/{algorithm}-{m}-ray"))
        sim = jaxdl.run(config.replace(engine="sim", cluster=str(path), ray_address=None,
                                       out=f"{tmp}/{algorithm}-{m}-sim"))
        measured, predicted = ray["trace_time_s"], sim["simulated_time_s"]
        rows.append({"algorithm": algorithm, "workers": m, "ray_s": measured,
                     "sim_s": predicted, "ratio": predicted / measured})
        print(f"{algorithm:<10}{m:>8}{measured:>9.2f}{predicted:>9.2f}"
              f"{predicted / measured:>9.2f}{ray['samples_per_s']:>15.0f}", flush=True)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"largest error: {100 * worst:.0f}%")
    print(json.dumps({"profile": {k: profile[k] for k in (
        "compute_time", "server_time", "order_time", "latency", "bandwidth", "worker_nodes",
        "central_bandwidth")}, "links": profile["measured"].get("links"), "runs": rows}))


if __name__ == "__main__":
  main(tyro.cli(Args))
