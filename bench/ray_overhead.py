"""The ray engine's cost: its overhead per update and its scaling, each
against a baseline measured in the same run.

1. Overhead per update: a ray asp run with one worker, whose every update is
   a pull, a gradient and a push applied at the server. Its seconds per
   update at the server (from the trace), less the worker's measured
   compute seconds, is what the engine adds; the baseline is a bare Ray
   actor round trip carrying the same messages (a push there, a pull
   back), timed in the same Ray instance; beside it, the engine's call (a
   push's arguments, one packed buffer, and a reply's) to an asyncio actor,
   as the server is, that returns at once (`server_round_trip`): the floor
   of the engine's overhead. The machine's CPU seconds per update bound the
   scaling on its cores, as long as they stay what one worker's cost.
2. Scaling: samples/s of ray asp with M workers over one worker's: the
   run's (wall time, the driver's evaluation and checkpoint included) and
   the server's (samples applied from the first pull to the last apply).
3. Start-up: seconds from `jaxdl.run` to its first step (Ray, the actors'
   imports, their data and compiled programs), from the same runs.

  python -m bench.ray_overhead                       # mlp and cnn, M = 1, 2, 4, 8
  python -m bench.ray_overhead --models mlp --workers 1 2
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import tyro

import jaxdl
from bench.timing import machine
from jaxdl import trace
from jaxdl.config import RunConfig
from jaxdl.engines import ray_driver
from jaxdl.engines.events import EventPrograms, one_batch, take
from jaxdl.engines.ray_messages import packed
from jaxdl.runner import setup


@dataclasses.dataclass(frozen=True)
class Args:
  models: tuple[str, ...] = ("mlp", "cnn")
  workers: tuple[int, ...] = (1, 2, 4, 8)
  steps: int = 200
  """Steps of each run (a step: every worker's batch once, on average)."""
  batch_size: int = 32
  round_trips: int = 300
  pin_workers: bool = False
  """Each worker's process on a core of its own (`--pin-workers`)."""
  against_inline_bytes: int | None = None
  """Also measure every run with Ray sending messages inside its calls only
  up to this many bytes (102400: Ray's own default; the engine's is
  jaxdl.engines.ray_driver.INLINE_BYTES), in a second Ray instance, and
  print the samples/s ratios."""
  """Bare actor round trips timed for the baseline."""


class Reply:
  def __init__(self, reply):
    self.reply = reply

  def call(self, message):
    return self.reply


def bare_round_trip(sent, returned, n: int) -> float:
  """Median seconds of a Ray actor call that carries `sent` and returns `returned`."""
  import ray
  return median_call(ray.remote(num_cpus=0)(Reply).remote(returned), (sent,), n)


def median_call(actor, args: tuple, n: int) -> float:
  """Median seconds of n calls of `actor.call(*args)`, after one untimed; kills the actor."""
  import ray
  ray.get(actor.call.remote(*args))
  times = []
  for _ in range(n):
    start = time.perf_counter()
    ray.get(actor.call.remote(*args))
    times.append(time.perf_counter() - start)
  ray.kill(actor)
  return statistics.median(times)


class AsyncReply:
  def __init__(self, reply):
    self.reply = reply

  async def call(self, *args):
    return self.reply


def server_round_trip(sent, returned, n: int) -> float:
  """Median seconds of the engine's call to its server, a push, against an
  asyncio actor (max_concurrency 64, as the server's) that does nothing
  but return a pull's reply: `sent` and `returned` packed as the engine
  packs them, with the push's other arguments."""
  import ray
  reply = (((packed(returned), False), 1), [])
  actor = ray.remote(num_cpus=0)(AsyncReply).options(max_concurrency=64).remote(reply)
  args = (0, 1, packed(sent), 1e-3, 2e-3, {"loss": 1.0, "accuracy": 0.5}, 0)
  return median_call(actor, args, n)


def messages(config: RunConfig):
  """A worker's push and the server's pull as the ray engine sends them:
  the leaves of a worker's state that its gradient changes and the server
  reads, and those the server changes and the gradient reads (host arrays)."""
  built = setup(config)
  try:
    state = take(built.engine.init(jax.random.key(0))[1], 0)
    parts = EventPrograms(built.algorithm, built.streams).message_parts(
        state, one_batch(built.streams, 0, 0))
    leaves = jax.device_get(jax.tree.leaves(state))
    return [leaves[i] for i in parts.push], [leaves[i] for i in parts.reply]
  finally:
    built.engine.close()


def ray_run(model: str, workers: int, args: Args, out: Path) -> dict:
  """A ray asp run's summary, with `total_s` (from jaxdl.run's call to its
  return) and, from its trace, `server_s` (from the first pull to the last
  apply: the engine's part, without the driver's start and end) and
  `server_samples_per_s` over it."""
  config = RunConfig.make(algorithm="asp", engine="ray", workers=workers, model=model,
                          batch_size=args.batch_size, steps=args.steps, progress=False,
                          eval_every=args.steps, checkpoint_every=args.steps, out=str(out),
                          pin_workers=args.pin_workers)
  start = time.perf_counter()
  summary = jaxdl.run(config)
  summary["total_s"] = time.perf_counter() - start
  events = list(trace.read_trace(out / "trace.jsonl"))
  applies = [e for e in events if e.kind == "apply"]
  summary["server_s"] = applies[-1].time - events[0].time
  summary["server_samples_per_s"] = len(applies) * args.batch_size / summary["server_s"]
  return summary


def main(args: Args) -> None:
  import ray
  print(f"machine: {machine()}")
  engine = measure(args)
  if args.against_inline_bytes is None:
    return
  ray.shutdown()
  inline, ray_driver.INLINE_BYTES = ray_driver.INLINE_BYTES, args.against_inline_bytes
  print(f"\nagainst messages inline up to {args.against_inline_bytes} bytes:")
  baseline = measure(args)
  print(f"\nsamples/s, inline up to {inline} bytes / up to "
        f"{args.against_inline_bytes}:")
  for model, runs in engine.items():
    print(f"  {model}: " + ", ".join(
        f"M = {m}: {r['samples_per_s'] / baseline[model][m]['samples_per_s']:.2f}"
        for m, r in runs.items()))


def measure(args: Args) -> dict[str, dict[int, dict]]:
  """Every model's runs (their summaries), printed with their baseline."""
  ray_driver.connect(None)
  everything = {}
  with tempfile.TemporaryDirectory() as tmp:
    for model in args.models:
      one = RunConfig.make(algorithm="asp", engine="ray", workers=1, model=model,
                           batch_size=args.batch_size, steps=1, progress=False)
      push, pull = messages(one)
      nbytes = [sum(np.asarray(x).nbytes for x in m) for m in (push, pull)]
      bare = bare_round_trip(push, pull, args.round_trips)
      floor = server_round_trip(push, pull, args.round_trips)
      runs = {m: ray_run(model, m, args, Path(tmp) / f"{model}-{m}") for m in args.workers}
      print(f"\n{model}: a push carries {nbytes[0] / 1e6:.2f} MB, a pull "
            f"{nbytes[1] / 1e6:.2f} MB; a bare actor round trip with them {bare * 1e3:.2f} ms, "
            f"the engine's call to an asyncio actor that returns at once {floor * 1e3:.2f} ms")
      if 1 in runs:
        r = runs[1]
        per_update = r["server_s"] / r["steps"]
        compute = r["batch_seconds_per_worker"][0]
        overhead = per_update - compute
        cpu = r["machine_cpu_s"] / r["steps"]
        print(f"  1 worker: {per_update * 1e3:.2f} ms an update, {compute * 1e3:.2f} ms of "
              f"compute: overhead {overhead * 1e3:.2f} ms = {overhead / bare:.2f} x the bare "
              f"round trip ({overhead / floor:.2f} x the call). The machine's CPU per "
              f"update: {cpu * 1e3:.2f} ms; at that cost "
              f"its {os.cpu_count()} cores allow at most "
              f"{os.cpu_count() * per_update / cpu:.2f} x one worker's updates per second")
      print(f"  {'workers':>8}{'samples/s':>12}{'vs 1':>8}{'at server':>11}{'vs 1':>8}"
            f"{'staleness':>11}{'CPU ms/upd':>12}{'start-up s':>12}")
      base, server = (runs[min(runs)][k] for k in ("samples_per_s", "server_samples_per_s"))
      for m, r in runs.items():
        startup = r["total_s"] - r["wall_time_s"]
        cpu = r["machine_cpu_s"] / (r["steps"] * m)
        print(f"  {m:>8}{r['samples_per_s']:>12.0f}{r['samples_per_s'] / base:>8.2f}"
              f"{r['server_samples_per_s']:>11.0f}{r['server_samples_per_s'] / server:>8.2f}"
              f"{r['staleness_mean'] or 0:>11.2f}{cpu * 1e3:>12.2f}{startup:>12.1f}")
      keys = ("samples_per_s", "server_samples_per_s", "wall_time_s", "server_s",
              "staleness_mean", "total_s", "machine_cpu_s", "central_cpu_s")
      print(json.dumps({"model": model, "bare_round_trip_s": bare,
                        "server_round_trip_s": floor, "message_bytes": nbytes,
                        "runs": {m: {k: r[k] for k in keys} for m, r in runs.items()}}))
      everything[model] = runs
  return everything


if __name__ == "__main__":
  main(tyro.cli(Args))
