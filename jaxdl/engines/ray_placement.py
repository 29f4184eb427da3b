"""Where a ray run's actors run on a cluster of several nodes.

The central actor (a parameter server and its shards, a coordinator, an
exchange) runs on one node: --server-node ADDRESS, by default the driver's
node (the Ray node it is attached to). The workers go round robin over the
other alive nodes, in the order of their addresses, each to a node of its
own as far as there are nodes: worker w to the (w mod n)-th. The central
actor's node is hard (Ray refuses to run it elsewhere: it holds the run, and
the run ends with it); a worker's is soft, so that Ray restarts a worker
whose node died on a node still alive. On one node (a local instance)
nothing is placed: Ray's own scheduling, as before.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from jaxdl.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Placement:
  """The nodes of a run's actors, by Ray node id: the central actor's, and
  those the workers go round robin over (none: nothing is placed); the
  GPUs of the central actor's node."""
  central: str
  workers: tuple[str, ...]
  central_gpus: float = 0.0

  @classmethod
  def of(cls, nodes: Sequence[dict[str, Any]], driver: str, server_node: str | None):
    """The placement over `nodes` (`ray.nodes()`: each with its NodeID,
    NodeManagerAddress and Alive) of a run whose driver is attached to node
    `driver`, its central actor on the alive node at `server_node` (None:
    the driver's). A ConfigError where no alive node has that address."""
    alive = sorted((n["NodeManagerAddress"], n["NodeID"]) for n in nodes if n["Alive"])
    gpus = {n["NodeID"]: n.get("Resources", {}).get("GPU", 0.0) for n in nodes}
    central = driver
    if server_node is not None:
      at = [i for address, i in alive if address == server_node]
      if not at:
        addresses = ", ".join(dict.fromkeys(address for address, _ in alive))
        raise ConfigError("server_node", server_node, "the address of an alive node of the "
                          f"Ray cluster: {addresses}")
      central = driver if driver in at else at[0]
    return cls(central, tuple(i for _, i in alive if i != central), gpus.get(central, 0.0))

  def central_options(self) -> dict[str, Any]:
    """The central actor's options: on its node, or none."""
    if not self.workers:
      return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(self.central, soft=False)}

  def worker_options(self, w: int, soft: bool = True) -> dict[str, Any]:
    """Worker w's options: its node of the others (where alive; `soft`:
    elsewhere once that node is dead), or none."""
    if not self.workers:
      return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    node = self.workers[w % len(self.workers)]
    # Ray puts an actor that asks for no resource on a random node, whatever
    # its soft affinity (seen on Ray 2.60: 3 of 6 elsewhere); one byte of
    # memory makes the request one that the affinity decides.
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=soft), "memory": 1}


def of_cluster(ray, server_node: str | None) -> Placement:
  """The placement of a run whose driver is connected to Ray (`ray`)."""
  return Placement.of(ray.nodes(), ray.get_runtime_context().get_node_id(), server_node)


def _node_id(actor=None) -> str:
  """The id of the Ray node this process runs on (in an actor, called with
  `__ray_call__`)."""
  del actor
  import ray
  return ray.get_runtime_context().get_node_id()


def nodes_of(ray, actors: Sequence) -> list[str]:
  """The address (NodeManagerAddress) of the node this process is attached
  to, then of the node each of `actors` runs on now."""
  addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
  ids = [_node_id(), *ray.get([a.__ray_call__.remote(_node_id) for a in actors])]
  return [addresses.get(i, "") for i in ids]
