"""The algorithm registry: one module per algorithm, one line here each.

An algorithm module declares its settings (a `jaxdl.settings.Settings`
dataclass), its factory `build(settings, problem, num_workers)` returning one
of the shapes of `jaxdl.algorithms.shapes`, and an `AlgorithmSpec`; the line
below registers it. Flags, `jaxdl list`, compare labels and validation all
derive from the registry.
"""
from __future__ import annotations

from jaxdl.algorithms import (ad_psgd, ar_sgd, asp, async_bn, bsp, dc_asgd, diloco, easgd,
                              gosgd, lc_asgd, local_sgd)
from jaxdl.algorithms.base import AlgorithmSpec, Batch, Problem, TrainState
from jaxdl.algorithms.collectives import WorkerAxis
from jaxdl.algorithms.shapes import (SHAPES, Centralized, Collective, Decentralized, Elastic,
                                     Gossip, Shape)
from jaxdl.registry import Registry

ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm")
for _spec in (ar_sgd.SGD, bsp.SPEC, ar_sgd.SPEC, local_sgd.SPEC, diloco.SPEC, asp.ASP, asp.SSP,
              dc_asgd.SPEC, lc_asgd.SPEC, easgd.SPEC, gosgd.SPEC, ad_psgd.SPEC):
  ALGORITHMS.add(_spec)


def build(spec: AlgorithmSpec, settings, problem: Problem, num_workers: int,
          bn_decay: float | None = None) -> Shape:
  """The algorithm's functions for `problem` on `num_workers` workers; with a
  `bn_decay`, wrapped in Async-BN."""
  algorithm = spec.build(settings, problem, num_workers)
  if bn_decay is not None:
    algorithm = async_bn.wrap(algorithm, problem, bn_decay, spec.name)
  return algorithm


def settings_owners() -> dict[str, list[AlgorithmSpec]]:
  """Each setting's name -> the algorithms that declare it, in registry order."""
  import dataclasses
  owners: dict[str, list[AlgorithmSpec]] = {}
  for name in ALGORITHMS:
    spec = ALGORITHMS.get(name)
    for field in dataclasses.fields(spec.settings):
      owners.setdefault(field.name, []).append(spec)
  return owners


__all__ = ["ALGORITHMS", "SHAPES", "AlgorithmSpec", "Batch", "Centralized", "Collective",
           "Decentralized", "Elastic", "Gossip", "Problem", "Shape", "TrainState",
           "WorkerAxis", "build", "settings_owners"]
