"""What every ray run's driver does, whatever the algorithm: connects this
process to Ray (`connect`: a cluster joined with its token, or a local
instance on the loopback address), places the actors on the cluster's
nodes (`jaxdl.engines.ray_placement`), sends a script's task to the actors
once, watches a joined cluster's head, and stops the actors it started
(`RayRun`). The actors get the engine's slice of the config (`RayFields`),
whose recipe each rebuilds the run from in its own process
(jaxdl.engines.base.Recipe).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Any

from jaxdl.algorithms import Problem, Family
from jaxdl.data import Streams
from jaxdl.engines import base, ray_cluster, ray_placement
from jaxdl.engines.base import Recipe
from jaxdl.engines.own_programs import OwnProgramsFields
from jaxdl.errors import ConfigError

INLINE_BYTES = 1 << 20
"""A ray run sends a message of up to this many bytes inside the call (a
small model's parameters), not through Ray's object store: on a local
instance about 1.6x the samples per second for the mlp and the cnn; across
three nodes, 2.2x for asp's (BENCHMARKS.md)."""
INLINE = "RAY_max_direct_call_object_size"
"""Ray's setting of that size, for a process of a cluster that this run
joins (a local instance's is its system config)."""

LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch that makes a local instance bind to 127.0.0.1 only (its
node address is then the loopback address), on Linux too."""


def connect(address: str | None) -> bool:
  """Connects this process to Ray: the cluster at `address` (with Ray's
  token authentication on unless RAY_AUTH_MODE says otherwise), or a new
  local instance on the loopback address, whose processes end with this
  one. True if this call started Ray (the engine then shuts it down)."""
  if address is not None:
    ray_cluster.check_address(address)
  loopback = address is None or address.rpartition(":")[0] in ("localhost", "127.0.0.1")
  if loopback:  # Ray would otherwise resolve the loopback address to the host's
    os.environ.setdefault(LOOPBACK_ONLY, "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine
  import ray
  if ray.is_initialized():
    return False
  if loopback:
    from ray._private import ray_constants  # read when ray is imported: set it again
    ray_constants.ENABLE_RAY_CLUSTER = os.environ[LOOPBACK_ONLY] not in ("0", "false")
  watchdog = ray_cluster.Watchdog() if address is None else None
  try:
    with warnings.catch_warnings():
      # Ray starts its processes with subprocess (fork, then exec at once):
      # JAX's warning about forking a multithreaded process does not apply.
      warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
      if address is None:
        options = {"num_cpus": os.cpu_count(), "_system_config": {
            "max_direct_call_object_size": INLINE_BYTES}}
      else:  # the run's processes inline as a local instance's; the driver on its node
        os.environ.setdefault(INLINE, str(INLINE_BYTES))
        options = {"runtime_env": {"env_vars": {INLINE: os.environ[INLINE]}}}
        if not loopback:
          options["_node_ip_address"] = ray_cluster.own_node(address)
      ray.init(address=address or "local", include_dashboard=False, configure_logging=False,
               log_to_driver=True, **options)
  except (ConnectionError, RuntimeError, ValueError) as e:
    if watchdog is not None:
      watchdog.stop()
    raise ConfigError("ray_address", address,
                      f"{ray_cluster.ADDRESS_HELP}, or unset for a local one ({e})") from None
  if watchdog is not None:
    watchdog.started()
  return True


def shutdown() -> None:
  """Shuts down Ray in this process (a local instance: every process of it)."""
  import ray
  ray.shutdown()
  if ray_cluster.Watchdog.active is not None:
    ray_cluster.Watchdog.active.stop()


def _by_value(task) -> None:
  """Sends the code of a script's task with it: the actors need not be able
  to import the module that defines its functions (a script, a test)."""
  from ray import cloudpickle
  values = [getattr(task, f.name) for f in dataclasses.fields(task)]
  values += [getattr(v, "fn", None) for v in values]  # FunctionData's function
  modules = {getattr(v, "__module__", None) for v in values if callable(v)}
  for name in modules - {None, "__main__"}:
    if name.split(".")[0] != "jaxdl" and name in sys.modules:
      cloudpickle.register_pickle_by_value(sys.modules[name])


@dataclasses.dataclass(frozen=True)
class RayFields(OwnProgramsFields):
  """The config fields the ray engine and its actors read: a real engine's
  (its workers' own programs', OwnProgramsFields), the cluster to join, the
  node of its central actor, where worker processes run and how long they
  wait for one another; and the run's recipe, which each actor rebuilds the
  run from."""
  ray_address: str | None
  server_node: str | None
  pin_workers: bool
  coordinator_timeout: float
  recipe: Recipe


class RayRun(base.LocalProcess):
  """What every ray run has: the connection to Ray, the actors' nodes
  (`placement`), the task sent to the actors, the actors (`server`,
  `workers`) and their end; on a joined cluster, the watch of its head."""
  name = "ray"
  fields = RayFields

  def __init__(self, algorithm: Family, problem: Problem, streams: Streams, fields: RayFields):
    import ray
    self.algorithm, self.problem, self.streams = algorithm, problem, streams
    self.num_workers = streams.num_workers
    # A script's own task travels to the actors once, in the recipe; a zoo
    # task is rebuilt there.
    if fields.recipe.task is not None:
      _by_value(fields.recipe.task)
    self.started = connect(fields.ray_address)
    self._ray = ray
    self.server, self.workers, self.shards, self.head = None, [], [], None
    try:
      self.placement = ray_placement.of_cluster(ray, fields.server_node)
    except ConfigError:
      self.close()
      raise
    if fields.ray_address is not None:  # its head stops answering: the run ends
      self.head = ray_cluster.HeadWatch(fields.ray_address)

  def jitted_functions(self) -> list:
    return []

  def processes(self) -> list[dict[str, Any]]:
    """Every process of the run, each with the address of its Ray node."""
    ray = self._ray
    actors = [a for a in [self.server, *self.shards, *self.workers] if a is not None]
    identities = [base.process_identity("driver")] + ray.get([a.identity.remote()
                                                              for a in actors])
    nodes = ray_placement.nodes_of(ray, actors)
    return [{**identity, "node": node} for identity, node in zip(identities, nodes)]

  def close(self) -> None:
    """Stops every actor (and a local Ray instance this engine started); if
    the joined cluster's head no longer answers, ends this process instead
    (`ray_cluster.HeadWatch`: Ray's calls would wait for it)."""
    ray = self._ray
    if self.head is not None:
      self.head.settle()
      self.head.stop()
      self.head = None
    for actor in [self.server, *self.shards, *(self.workers or [])]:
      if actor is not None:
        ray.kill(actor)
    self.server, self.workers, self.shards = None, None, []
    if self.started and ray.is_initialized():
      shutdown()
