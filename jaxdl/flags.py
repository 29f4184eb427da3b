"""`jaxdl run`'s flags: the config's sections, and every registered algorithm's
settings as one flat section, all derived from the dataclasses (tyro).

A setting's flag is its field name (``--staleness-bound``); several
algorithms may share one (``--communication-period``: local_sgd's H and
EASGD's tau), and its help says whose it is. A setting given on the command
line must belong to the chosen algorithm.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any

import tyro

from jaxdl import parsing
from jaxdl.algorithms import settings_owners
from jaxdl.config import RunConfig
from jaxdl.errors import flag
from jaxdl.settings import field_docs, field_types

SETTINGS_SECTION = "algorithm_settings"


def _settings_section(base: RunConfig) -> type:
  """A dataclass with one field per setting name over all algorithms."""
  current = base.settings_dict()
  fields = []
  for name, specs in settings_owners().items():
    first = specs[0].settings
    default = current.get(name, next(f.default for f in dataclasses.fields(first)
                                     if f.name == name))
    helps = [f"{s.name}: {field_docs(s.settings).get(name, '')}" for s in specs]
    help_text = " | ".join(helps) if len(specs) > 1 else helps[0]
    kind = Annotated[field_types(first)[name], tyro.conf.arg(help=help_text)]
    fields.append((name, kind, dataclasses.field(default=default)))
  return dataclasses.make_dataclass(
      "AlgorithmSettings", fields, frozen=True,
      namespace={"__doc__": "Settings of the algorithms: each belongs to those named in its "
                            "help (see `jaxdl list`); unset: the algorithm's default."})


def flags_class(base: RunConfig) -> type:
  """The command line's dataclass: the sections of `base`, then the settings."""
  types = typing.get_type_hints(RunConfig)
  sections = [(f.name, types[f.name], dataclasses.field(default=getattr(base, f.name)))
              for f in dataclasses.fields(RunConfig)]
  settings = _settings_section(base)
  return dataclasses.make_dataclass(
      "RunFlags", sections + [(SETTINGS_SECTION, settings,
                               dataclasses.field(default=settings()))],
      frozen=True, namespace={"__doc__": RunConfig.__doc__})


def given_settings(parsed: Any, args: list[str]) -> dict[str, Any]:
  """The settings whose flag appears in `args`."""
  values = getattr(parsed, SETTINGS_SECTION)
  out = {}
  for f in dataclasses.fields(values):
    name = flag(f.name)
    negated = "--no-" + name[2:]
    if any(a == name or a.startswith(name + "=") or a == negated for a in args):
      out[f.name] = getattr(values, f.name)
  return out


def parse(args: list[str], base: RunConfig, prog: str, description: str | None = None
          ) -> tuple[RunConfig, dict[str, Any]]:
  """(`base` with the sections' flags applied, the settings given) from `args`."""
  parsed = parsing.parse(flags_class(base), args, prog, description=description,
                         config=(tyro.conf.OmitArgPrefixes,))
  sections = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(RunConfig)}
  flat = {k: v for name, section in sections.items()
          for k, v in dataclasses.asdict(section).items() if k != "settings"}
  flat = {k: tuple(v) if isinstance(v, list) else v for k, v in flat.items()}
  return base.replace(**flat), given_settings(parsed, args)
