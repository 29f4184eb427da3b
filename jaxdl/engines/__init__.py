"""Engines decide when and where an algorithm's pure functions run.

Each engine implements `jaxdl.engines.base.Engine` and declares the
algorithm families it runs; registering it here is the only other line it
needs. An algorithm runs on every engine that declares its family, the first
registered being its default.
"""
from __future__ import annotations

from jaxdl.algorithms import AlgorithmSpec
from jaxdl.config import RunConfig
from jaxdl.engines import base
from jaxdl.engines.base import Engine
from jaxdl.engines.mesh import MeshEngine
from jaxdl.engines.ray_engine import RayEngine
from jaxdl.engines.sim import SimEngine
from jaxdl.errors import ConfigError
from jaxdl.registry import Registry

ENGINES: Registry[type[Engine]] = Registry("engine")
ENGINES.register("mesh", "SPMD over the device mesh: shard_map over devices, vmap "
                 "over each device's workers")(MeshEngine)
ENGINES.register("sim", "a deterministic simulated cluster: the real math in the order "
                 "of a schedule from a cost model")(SimEngine)
ENGINES.register("ray", "real processes: a Ray actor per worker (and a server actor), "
                 "on this machine or a cluster (--ray-address)")(RayEngine)


def engines_for(family: type) -> list[str]:
  """The engines that run algorithms of `family`, the default first."""
  return [name for name in ENGINES if family in ENGINES.get(name).families]


def choose(spec: AlgorithmSpec, config: RunConfig) -> str:
  """The engine that runs the algorithm `spec` (--engine, checked; auto: the
  first registered that runs its family, or a simulated one for a dry run
  or a split of the global batch that changes)."""
  engines = engines_for(spec.family)
  wanted = config.algorithm.engine
  simulating = config.output.dry_run or config.cluster.partition != "static"
  simulated = [n for n in engines if ENGINES.get(n).simulated]
  if wanted != "auto":
    name = wanted
  elif simulating and simulated:
    name = simulated[0]
  else:
    name = engines[0]
  if name not in engines:
    raise ConfigError("engine", wanted, f"one of auto, {', '.join(engines)} for {spec.name}")
  return name


def check(name: str, config: RunConfig, spec: AlgorithmSpec) -> None:
  """Refuses every field of `config` that the engine `name` cannot run with
  the algorithm `spec`: each other engine's own fields (Engine.own_fields;
  a replay keeps those that place processes), then the engine's own checks
  of its slice of the config."""
  engine, flat, defaults = ENGINES.get(name), config.flat(), RunConfig().flat()
  for other in ENGINES:
    owner = ENGINES.get(other)
    for field, what in owner.own_fields.items():
      kept = config.output.replay and field in owner.placement
      if field in engine.own_fields or flat[field] == defaults[field] or kept:
        continue
      default = "left unset" if defaults[field] is None else f"its default ({defaults[field]!r})"
      raise ConfigError(field, flat[field], f"{default} with --engine {name}: it is --engine "
                        f"{other}'s ({what})")
  engine.check(base.slice_of(config, engine.fields), spec)


__all__ = ["ENGINES", "Engine", "MeshEngine", "RayEngine", "SimEngine", "check", "choose",
           "engines_for"]
