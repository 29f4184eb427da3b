"""The bytes compressed messages move, engine by engine.

1. ray: each algorithm and compressor on real processes (3 workers, the mlp
   on digits): the bytes its actors sent (`bytes_total`: the serialized
   messages) against what the sim engine counts for the messages its trace
   records (jaxdl.engines.sim.message_bytes), and
   whether the sim's replay of the trace gives its parameters bit for bit.
2. asp: asp with top-k 1% of the pushes alone and of the pushes and the
   replies (--compress-pull), on the sim: bytes against the uncompressed
   run's, and test accuracy, over seeds.
3. mesh: the bytes each collective of one compiled mesh step moves on a
   device (its result's), with and without compression.

  python -m bench.compressed_bytes ray
  python -m bench.compressed_bytes asp --seeds 0 1 2
  python -m bench.compressed_bytes mesh
"""
from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
import tyro

from bench.timing import machine

RUN = dict(dataset="digits", model="mlp", batch_size=16, progress=False)
RAY_CASES = (
    ("asp", {"compress": "topk:0.01"}),
    ("asp", {"compress": "topk:0.01", "compress_pull": "topk:0.01"}),
    ("asp", {"compress": "randk:0.05", "compress_pull": "qsgd:4"}),
    ("asp", {"compress": "sign", "compress_pull": "powersgd:2"}),
    ("asp", {"compress": "topk:0.01", "compress_pull": "topk:0.01", "servers": 2}),
    ("dc_asgd", {"compress": "qsgd:16", "compress_pull": "sign"}),
    ("lc_asgd", {"compress": "powersgd:2", "compress_pull": "randk:0.05"}),
    ("gosgd", {"compress": "topk:0.01", "gossip_probability": 0.5}),
    ("gosgd", {"compress": "qsgd:4", "gossip_probability": 0.5}),
    ("ad_psgd", {"compress": "topk:0.01"}),
    ("ad_psgd", {"compress": "powersgd:2"}),
    ("easgd", {"compress": "topk:0.01", "communication_period": 1}),
    ("easgd", {"compress": "sign", "communication_period": 1}),
    ("asp", {}), ("ad_psgd", {}), ("gosgd", {"gossip_probability": 0.5}))


@dataclasses.dataclass(frozen=True)
class Args:
  part: tyro.conf.Positional[Literal["ray", "asp", "mesh"]]
  steps: int = 24
  """Steps of each ray run (asp: 110, 5 epochs)."""
  seeds: tuple[int, ...] = (0,)
  """asp: the runs' seeds."""


def ray(args: Args) -> None:
  import jaxdl
  from jaxdl import trace
  from jaxdl.build import prepare
  from jaxdl.config import RunConfig
  from jaxdl.engines import ray_driver
  from jaxdl.engines.sim import message_bytes
  ray_driver.connect(None)
  print(f"{'algorithm':<10}{'settings':<58}{'bytes_total':>12}{'modelled':>12}{'ratio':>8}"
        f"{'replay':>8}")
  with tempfile.TemporaryDirectory() as tmp:
    for i, (name, settings) in enumerate(RAY_CASES):
      out = Path(tmp) / str(i)
      config = RunConfig.make(algorithm=name, engine="ray", workers=3, steps=args.steps,
                              out=str(out / "ray"), **settings, **RUN)
      summary = jaxdl.run(config)
      built = prepare(config)
      modelled = message_bytes(built.algorithm, built.problem,
                               list(trace.read_trace(out / "ray" / "trace.jsonl")))
      replayed = jaxdl.run(config.replace(engine="sim", out=str(out / "sim"),
                                          replay=str(out / "ray" / "trace.jsonl")))
      same = replayed["params_fingerprint"] == summary["params_fingerprint"]
      text = " ".join(f"{k}={v}" for k, v in settings.items())
      print(f"{name:<10}{text:<58}{summary['bytes_total']:>12,}{modelled:>12,.0f}"
            f"{summary['bytes_total'] / modelled:>8.3f}{str(same):>8}", flush=True)


def asp(args: Args) -> None:
  import jaxdl
  from jaxdl.config import RunConfig
  arms = {"none": {}, "push": {"compress": "topk:0.01"},
          "both": {"compress": "topk:0.01", "compress_pull": "topk:0.01"}}
  print(f"{'seed':>4}{'arm':>6}{'bytes_total':>14}{'of none':>9}{'test acc':>10}{'sim s':>8}")
  with tempfile.TemporaryDirectory() as tmp:
    for seed in args.seeds:
      plain = None
      for arm, settings in arms.items():
        summary = jaxdl.run(RunConfig.make(
            algorithm="asp", engine="sim", workers=4, steps=110, seed=seed, compute_time=1e-3,
            jitter=0.3, network="1gbps", out=f"{tmp}/{seed}-{arm}", **settings, **RUN))
        plain = plain or summary["bytes_total"]
        print(f"{seed:>4}{arm:>6}{summary['bytes_total']:>14,.0f}"
              f"{summary['bytes_total'] / plain:>9.4f}{summary['test_accuracy']:>10.4f}"
              f"{summary['simulated_time_s']:>8.3f}", flush=True)


SIZES = {"f32": 4, "s32": 4, "u32": 4, "u8": 1, "pred": 1, "bf16": 2}
COLLECTIVE = re.compile(r"= (.*?) (all-reduce|all-gather|reduce-scatter|all-to-all|"
                        r"collective-permute)(-start)?\(")


def collective_bytes(hlo: str) -> dict[str, int]:
  """The bytes of each kind of collective's results in a compiled module."""
  total: dict[str, int] = {}
  for line in hlo.splitlines():
    found = COLLECTIVE.search(line)
    if found:
      shapes = re.findall(r"(f32|s32|u32|u8|pred|bf16)\[([\d,]*)\]", found.group(1))
      nbytes = sum(SIZES[t] * int(np.prod([int(d) for d in dims.split(",") if d]))
                   for t, dims in shapes)
      total[found.group(2)] = total.get(found.group(2), 0) + nbytes
  return total


def mesh(args: Args) -> None:
  del args
  import jax
  from jaxdl.config import RunConfig
  from jaxdl.runner import setup
  print(f"{'algorithm':<10}{'compress':<12}collective result bytes a device, one step")
  for name in ("ar_sgd", "bsp"):
    for compress in ("none", "topk:0.01", "powersgd:2"):
      engine = setup(RunConfig.make(algorithm=name, engine="mesh", workers=4, steps=1,
                                    compress=compress, **RUN)).engine
      state = engine.init(jax.random.key(0))
      hlo = engine.jitted_step.lower(state, engine.batch(0)).compile().as_text()
      print(f"{name:<10}{compress:<12}{collective_bytes(hlo)}", flush=True)


if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=4")
  args = tyro.cli(Args)
  print(f"machine: {machine()}")
  {"ray": ray, "asp": asp, "mesh": mesh}[args.part](args)
