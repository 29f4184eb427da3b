"""The algorithm registry: one module per algorithm, one line here each.

An algorithm module declares its settings (a `jaxdl.settings.Settings`
dataclass), its factory `build(settings, problem, num_workers)` returning one
of the families of `jaxdl.algorithms.families`, and an `AlgorithmSpec`; the line
below registers it. Flags, `jaxdl list`, compare labels and validation all
derive from the registry.
"""
from __future__ import annotations

from jaxdl.algorithms import (ad_psgd, ar_sgd, asp, async_bn, bsp, dc_asgd, diloco, easgd, gosgd,
                              lc_asgd, local_sgd)
from jaxdl.algorithms.base import AlgorithmSpec, Batch, Problem, TrainState
from jaxdl.algorithms.collectives import WorkerAxis
from jaxdl.algorithms.families import (FAMILIES, Centralized, Collective, Decentralized, Elastic,
                                     Gossip, Family)
from jaxdl.errors import ConfigError
from jaxdl.registry import Registry
from jaxdl.settings import SETTINGS, owners



class AlgorithmRegistry(Registry[AlgorithmSpec]):
  """The algorithms by name; registering one also registers its settings
  class, the config's schema for its own fields (jaxdl.settings.SETTINGS)."""

  def register(self, name: str, doc: str = ""):
    add = super().register(name, doc)

    def both(spec: AlgorithmSpec) -> AlgorithmSpec:
      add(spec)
      SETTINGS.register(name)(spec.settings)
      return spec
    return both

  def remove(self, name: str) -> None:
    super().remove(name)
    SETTINGS.remove(name)


ALGORITHMS = AlgorithmRegistry("algorithm")
for _spec in (ar_sgd.SGD, bsp.SPEC, ar_sgd.SPEC, local_sgd.SPEC, diloco.SPEC, asp.ASP, asp.SSP,
              dc_asgd.SPEC, lc_asgd.SPEC, easgd.SPEC, gosgd.SPEC, ad_psgd.SPEC):
  ALGORITHMS.add(_spec)


def names_of(*families: type, server: bool = False) -> str:
  """The registered algorithms of `families` (with `server`: those that keep a
  parameter server), comma-separated, in registry order: for messages."""
  return ", ".join(n for n in ALGORITHMS if ALGORITHMS.get(n).family in families
                   and (ALGORITHMS.get(n).has_server or not server))


def check(spec: AlgorithmSpec, config) -> None:
  """The fields of a run's config (a RunConfig) that the algorithm `spec`
  owns or conditions: its settings, its worker count, Async-BN, compression
  of its pulls, parameter-server shards, batch-norm statistics and a split
  of the global batch that changes."""
  cfg, name = config.algorithm, spec.name
  if spec.max_workers is not None and cfg.workers > spec.max_workers:
    raise ConfigError("workers", cfg.workers, f"at most {spec.max_workers} for --algorithm {name}")
  if spec.check is not None:
    spec.check(config.settings(), config)
  if not 0 < cfg.bn_decay <= 1:
    raise ConfigError("bn_decay", cfg.bn_decay, "a factor in (0, 1]")
  if cfg.async_bn:
    async_bn.check(spec.family, name, names_of(*async_bn.RECEIVER))
  asp.check_pull(spec.family, name, cfg.compress_pull, names_of(Centralized))
  servers = config.cluster.servers
  if servers != 1 and not spec.has_server:
    raise ConfigError("servers", servers, f"1: {name} keeps no parameter server to shard "
                      f"(these do: {names_of(*FAMILIES, server=True)})")
  if config.cluster.partition != "static" and spec.family is not Collective:
    raise ConfigError("partition", config.cluster.partition, f"static for {name}: "
                      "proportional and adaptive partition a synchronous step's global batch "
                      f"({names_of(Collective)})")
  if cfg.sync_bn and spec.family is not Collective:
    raise ConfigError("sync_bn", True, f"only with a collective algorithm ({names_of(Collective)}"
                      f"): {name}'s workers share no batch statistics")


def build(spec: AlgorithmSpec, settings, problem: Problem, num_workers: int,
          bn_decay: float | None = None) -> Family:
  """The algorithm's functions for `problem` on `num_workers` workers; with a
  `bn_decay`, wrapped in Async-BN."""
  algorithm = spec.build(settings, problem, num_workers)
  if bn_decay is not None:
    algorithm = async_bn.wrap(algorithm, problem, bn_decay, spec.name)
  return algorithm


def settings_owners() -> dict[str, list[AlgorithmSpec]]:
  """Each setting's name -> the specs of the algorithms that declare it, in
  registry order (jaxdl.settings.owners, by spec)."""
  return {field: [ALGORITHMS.get(n) for n in names] for field, names in owners().items()}


__all__ = ["ALGORITHMS", "FAMILIES", "AlgorithmSpec", "Batch", "Centralized", "Collective",
           "Decentralized", "Elastic", "Gossip", "Problem", "Family", "TrainState",
           "WorkerAxis", "build", "check", "names_of", "settings_owners"]
