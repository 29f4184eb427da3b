"""Engines decide when and where an algorithm's pure functions run."""
from __future__ import annotations

from jaxdl.engines.mesh import MeshEngine
from jaxdl.engines.sim import SimEngine
from jaxdl.registry import Registry

ENGINES: Registry[type] = Registry("engine")
ENGINES.register("mesh", "SPMD over the device mesh: shard_map over devices, vmap "
                 "over each device's workers")(MeshEngine)

ENGINES.register("sim", "a deterministic simulated cluster: the real math in the order "
                 "of a schedule from a cost model")(SimEngine)

__all__ = ["ENGINES", "MeshEngine", "SimEngine"]
