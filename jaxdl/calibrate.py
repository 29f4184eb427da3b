"""`jaxdl calibrate`: this machine's costs on the ray engine, measured into a
cost profile that `jaxdl run --engine sim --cluster PROFILE.json` simulates.

Two short runs with one worker, so that nothing waits for anyone, on the
first registered engine whose server or coordinator is a process of its own
(`Engine.central_process`: ray), of the algorithms `probes` picks from the
registry by what they declare:

- a plain parameter server (asp: centralized, no settings of its own): each
  update is a pull, a gradient and a push applied at the server.
  `compute_time` is the worker's measured seconds per gradient;
  `server_time` what the server spends on one update, one at a time.
- a gossip algorithm (gosgd): each local step is a gradient and the
  coordinator's grant; `order_time` is what the coordinator spends on one
  event.

A central actor's time per call, once more workers keep it busy, lies
between two one-worker measures: its process's CPU seconds per call (what
it does, without waiting for a core it shares with the workers) and a
worker's cycle less its gradient (the messages and both ends' work, some of
which overlaps the actor's once there are two workers). The profile takes
their mean, or, if larger, the machine's CPU seconds per call (every
process's: the workers', the driver's, Ray's) over its cores.

On one machine a message's cost is the processes' own work, so a profile
counts it in these two times and sets the links between workers free
(`latency` 0). The simulator then predicts runs with more workers: the
server or coordinator serves one call at a time, which is what limits a
parameter server from 2 workers on (BENCHMARKS.md, "Calibrating the
simulator against the ray engine").

On a cluster of several machines (`--ray-address`), the engine first
measures the links between the central actor's machine and the others,
where the workers run (`Engine.links`: latency, bandwidth, the number of
worker machines, what the central machine receives from all at once); the
measuring runs' worker is on another machine than the central actor, so a
worker's cycle less its gradient less its messages' modelled time on the
link is the central actor's upper bound. The simulator then sends each
message over its worker machine's link, shared by the workers there.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from jaxdl.algorithms import ALGORITHMS, AlgorithmSpec, Centralized, Gossip
from jaxdl.build import prepare
from jaxdl.cluster import Profile
from jaxdl.config import RunConfig
from jaxdl.engines import ENGINES, base
from jaxdl.errors import ConfigError
from jaxdl.runner import run

DEFAULT_STEPS = 500
"""Updates of each measuring run, unless --steps is given."""


@dataclasses.dataclass(frozen=True)
class CalibrateArgs:
  """`jaxdl calibrate`'s own flag; the others are `jaxdl run`'s."""
  profile: str = "profile.json"
  """Where the profile is written: PATH.json."""


def _first(wanted: Callable[[AlgorithmSpec], bool]) -> str:
  return next(name for name in ALGORITHMS if wanted(ALGORITHMS.get(name)))


def probes() -> dict[str, str]:
  """The algorithm of each measuring run, by the profile field it measures:
  `server_time`, the first registered centralized algorithm that keeps a
  parameter server and has no settings of its own (one that applies each
  push as it arrives: asp); `order_time`, the first registered gossip one
  (whose coordinator grants each local step: gosgd)."""
  plain_server = lambda spec: (spec.family is Centralized and spec.has_server
                               and not dataclasses.fields(spec.settings))
  return {"server_time": _first(plain_server),
          "order_time": _first(lambda spec: spec.family is Gossip)}


def engine() -> str:
  """The engine of the measuring runs: the first registered one that runs
  both probes with a central process of its own (Engine.central_process)."""
  families = {ALGORITHMS.get(name).family for name in probes().values()}
  return next(name for name in ENGINES if ENGINES.get(name).central_process
              and families <= set(ENGINES.get(name).families))


def _measure(config: RunConfig, algorithm: str, out: Path) -> dict[str, float]:
  """One measuring run: its updates, seconds from the clock's start to its
  last update, mean measured seconds per gradient, and CPU seconds."""
  summary = run(config.replace(algorithm=algorithm, engine=engine(), workers=1, out=str(out),
                               eval_every=config.train.steps,
                               checkpoint_every=config.train.steps))
  return {"updates": summary["steps"], "seconds": summary["trace_time_s"],
          "compute_time": summary["batch_seconds_per_worker"][0],
          "central_cpu_s": summary["central_cpu_s"],
          "machine_cpu_s": summary["machine_cpu_s"]}


def calibrate(config: RunConfig, announce: Callable[[str], None] = print) -> dict[str, Any]:
  """The cost profile (a `Profile`'s fields, and what was measured) of this
  machine for `config`'s model, dataset and batch size."""
  if config.data.batch_sizes or config.cluster.worker_speeds:
    raise ConfigError("batch_sizes", config.data.batch_sizes or config.cluster.worker_speeds,
                      "unset: a profile is measured for one --batch-size")
  config = config.replace(steps=config.train.steps or DEFAULT_STEPS)
  measuring = probes()
  links = _links(config, announce)
  with tempfile.TemporaryDirectory(prefix="jaxdl-calibrate-") as tmp:
    runs = {}
    for algorithm in measuring.values():
      announce(f"measuring {algorithm} with one worker, {config.train.steps} updates")
      runs[algorithm] = _measure(config, algorithm, Path(tmp) / algorithm)
  server, order = runs[measuring["server_time"]], runs[measuring["order_time"]]
  compute, cores = server["compute_time"], len(os.sched_getaffinity(0))
  # what a parameter server's update sends over a worker machine's link: a
  # pull and a push (on one machine, nothing)
  server["link_s"] = 2 * (links["latency"] + links["links"]["message_bytes"]
                          / links["bandwidth"]) if links else 0.0
  order["link_s"] = 0.0
  for r in runs.values():
    # What brackets the busy central actor's time per call: its CPU seconds
    # per call (all its threads) below, a worker's whole cycle less its
    # gradient and its messages' time on a link (the messages' and both
    # ends' work) above; the profile takes their mean (BENCHMARKS.md: the
    # busy server's measured time lies between)
    r["cpu_bound"] = r["central_cpu_s"] / r["updates"]
    r["cycle_bound"] = max(r["seconds"] / r["updates"] - compute - r["link_s"], 0.0)
    # and a lower bound once the workers keep it busy: every process's CPU
    # seconds per call (the machine's) shared by its cores
    r["machine_bound"] = (r["machine_cpu_s"] or 0.0) / r["updates"] / cores
  central = lambda r: max((r["cpu_bound"] + r["cycle_bound"]) / 2, r["machine_bound"])
  network = {k: links[k] for k in ("latency", "bandwidth", "worker_nodes",
                                   "central_bandwidth")} if links else {}
  profile = Profile(model=config.model.model, dataset=config.data.dataset,
                    batch_size=config.data.batch_size, compute_time=compute,
                    server_time=central(server), order_time=central(order), **network)
  import ray
  measured = {**runs, **({"links": links["links"]} if links else {})}
  return {**dataclasses.asdict(profile), "measured": measured,
          "machine": {"host": platform.node(), "cores": cores,
                      "processor": platform.processor() or platform.machine(),
                      "jax": jax.__version__, "ray": ray.__version__},
          "date": datetime.datetime.now().isoformat(timespec="seconds")}


def _links(config: RunConfig, announce: Callable[[str], None]) -> dict[str, Any] | None:
  """The links between the machines of the measuring engine's processes
  (`Engine.links`), for messages of the model's size; None: one machine."""
  chosen = ENGINES.get(engine())
  measure = getattr(chosen, "links", None)
  if measure is None:
    return None
  setup = prepare(config.replace(algorithm=probes()["server_time"], engine=engine(), workers=1))
  nbytes = setup.problem.model_bytes()
  announce(f"measuring the links between the machines with messages of {nbytes:,} bytes")
  return measure(base.slice_of(setup.config, chosen.fields), nbytes)


def summary_line(profile: dict[str, Any]) -> str:
  ms = lambda k: f"{np.float64(profile[k]) * 1e3:.2f} ms"
  line = (f"compute {ms('compute_time')} a batch, server {ms('server_time')} an update, "
          f"coordinator {ms('order_time')} an event")
  if profile.get("worker_nodes"):
    line += (f"; {profile['worker_nodes']} worker machines, each link "
             f"{profile['bandwidth'] * 8 / 1e6:,.0f} Mb/s and {ms('latency')} a message")
  return line
