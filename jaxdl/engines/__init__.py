"""Engines decide when and where an algorithm's pure functions run."""
from __future__ import annotations

from jaxdl.engines.local import LocalEngine
from jaxdl.registry import Registry

ENGINES: Registry[type] = Registry("engine")
ENGINES.register("local", "one worker, jitted on the default device")(LocalEngine)

__all__ = ["ENGINES", "LocalEngine"]
