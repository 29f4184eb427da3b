"""Engines decide when and where an algorithm's pure functions run.

Each engine implements `jaxdl.engines.base.Engine` and declares the
algorithm shapes it runs; registering it here is the only other line it
needs. An algorithm runs on every engine that declares its shape, the first
registered being its default.
"""
from __future__ import annotations

from jaxdl.engines.base import Engine
from jaxdl.engines.mesh import MeshEngine
from jaxdl.engines.ray_engine import RayEngine
from jaxdl.engines.sim import SimEngine
from jaxdl.registry import Registry

ENGINES: Registry[type[Engine]] = Registry("engine")
ENGINES.register("mesh", "SPMD over the device mesh: shard_map over devices, vmap "
                 "over each device's workers")(MeshEngine)
ENGINES.register("sim", "a deterministic simulated cluster: the real math in the order "
                 "of a schedule from a cost model")(SimEngine)
ENGINES.register("ray", "real processes: a Ray actor per worker (and a server actor), "
                 "on this machine or a cluster (--ray-address)")(RayEngine)


def engines_for(shape: type) -> list[str]:
  """The engines that run algorithms of `shape`, the default first."""
  return [name for name in ENGINES if shape in ENGINES.get(name).shapes]


__all__ = ["ENGINES", "Engine", "MeshEngine", "RayEngine", "SimEngine", "engines_for"]
