"""The links between a Ray cluster's machines, measured with Ray's own
calls, for `jaxdl calibrate` on a cluster.

A probe actor runs on the central actor's node (the driver's, or
--server-node's: `ray_placement`) and one on each other node, where a run's
workers go. From each worker node, calls to the central probe carry a
message of `nbytes` (a worker's push) or ask for one (its pull), and calls
of one byte each way: a call of one byte is two messages, so its median
round trip over two is the link's `latency`; what a message of `nbytes`
adds to it is its serialisation at the link's `bandwidth`. Last, every
worker node pushes at once: what the central node received per second is
its `central_bandwidth`. One machine (a local instance): no links.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from jaxdl.engines import ray_driver, ray_placement

ROUNDS = 8
"""Timed calls of each size, each way, from each worker node (after one untimed)."""
SMALL_ROUNDS = 24
"""Timed calls of one byte each way."""


class _Probe:
  """One end of the measured links."""

  def take(self, payload: np.ndarray) -> int:
    return payload.nbytes

  def give(self, nbytes: int) -> np.ndarray:
    return np.ones(nbytes, np.uint8)

  def timed(self, central, method: str, argument: Any, rounds: int) -> list[float]:
    """Seconds of each of `rounds` calls `central.method(argument)`, after one untimed."""
    import ray
    seconds = []
    for _ in range(rounds + 1):
      start = time.perf_counter()
      ray.get(getattr(central, method).remote(argument))
      seconds.append(time.perf_counter() - start)
    return seconds[1:]


def _link(ray, end, central, nbytes: int) -> dict[str, float]:
  """One worker node's link to the central node, measured from its probe `end`."""
  def median_s(method: str, argument: Any, rounds: int = ROUNDS) -> float:
    return statistics.median(ray.get(end.timed.remote(central, method, argument, rounds)))

  small = (median_s("take", np.ones(1, np.uint8), SMALL_ROUNDS)
           + median_s("give", 1, SMALL_ROUNDS)) / 2
  push, pull = median_s("take", np.ones(nbytes, np.uint8)), median_s("give", nbytes)
  return {"latency": small / 2, "push_s": push, "pull_s": pull, "small_s": small,
          "bandwidth": nbytes / max((push + pull) / 2 - small, 1e-9)}


def measure(address: str | None, server_node: str | None, nbytes: int) -> dict[str, Any] | None:
  """The links of the cluster at `address` (None: a local instance) whose
  central node is `server_node`'s (None: this driver's), for messages of
  `nbytes`: the profile's `latency`, `bandwidth`, `worker_nodes` and
  `central_bandwidth`, and each node's measures; None on one node."""
  started = ray_driver.connect(address)
  import ray
  probes = []
  try:
    placement = ray_placement.of_cluster(ray, server_node)
    if not placement.workers:
      return None
    probe = ray.remote(num_cpus=0)(_Probe)
    central = probe.options(**placement.central_options()).remote()
    ends = [probe.options(**placement.worker_options(i, soft=False)).remote()
            for i in range(len(placement.workers))]
    probes = [central, *ends]
    nodes = [_link(ray, end, central, nbytes) for end in ends]
    start = time.perf_counter()
    ray.get([end.timed.remote(central, "take", np.ones(nbytes, np.uint8), ROUNDS)
             for end in ends])
    together = len(ends) * (ROUNDS + 1) * nbytes / (time.perf_counter() - start)
  finally:
    for actor in probes:  # (a joined cluster's actors outlive this driver's calls)
      ray.kill(actor)
    if started:
      ray_driver.shutdown()
  bandwidth = statistics.median(n["bandwidth"] for n in nodes)
  return {"latency": statistics.median(n["latency"] for n in nodes), "bandwidth": bandwidth,
          "worker_nodes": len(nodes), "central_bandwidth": max(together, bandwidth),
          "links": {"message_bytes": nbytes, "nodes": nodes, "together_bandwidth": together}}
