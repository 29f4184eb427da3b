"""compare's ``--sweep NAME=V1,V2,...``: variants over the values of an
algorithm's setting or of a run field, and the older list flags that are its
aliases (``--staleness-bounds 3,10`` is ``--sweep staleness_bound=3,10``).

NAME is a setting of an algorithm of the registry (jaxdl.algorithms) or a
field of `jaxdl run`'s config, as its flag without the dashes. Each value is
read by the field's type here; its range is checked by the field's owner (the
algorithm's settings, jaxdl.config.validate) in every cell's config, and a
refusal names the flag that gave the value.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal

from jaxdl.algorithms import settings_owners
from jaxdl.compare.grid import PER_CELL, Grid, algorithms_of, per_cell, takes
from jaxdl.config import field_owner, type_name
from jaxdl.config import field_types as run_field_types
from jaxdl.errors import ConfigError, flag
from jaxdl.settings import field_types
from jaxdl.validation import check_numbers

SWEEP = "sweep"  # the flag's field
ALIASES = {"staleness_bounds": "staleness_bound", "communication_periods": "communication_period",
           "gossip_probabilities": "gossip_probability"}
"""compare's list flags, each an alias of --sweep over the setting it names."""
ONE_A_GRID = {"engine": "use --engine (the cells of a grid all simulate their time or all "
                        "measure it)"}
"""Run fields that no sweep takes, with what to use instead."""


@dataclasses.dataclass(frozen=True)
class Sweep:
  """The values one field takes over a grid's variants, and the flag that gave them."""
  field: str
  values: tuple[Any, ...]
  source: str = SWEEP
  """The compare flag's field: "sweep", or the alias (e.g. "staleness_bounds")."""
  texts: tuple[str, ...] = ()
  """--sweep: each value as given."""

  def refusal(self, allowed: str) -> ConfigError:
    """The sweep refused as a whole, naming its flag."""
    given = f"{self.field}={','.join(self.texts)}" if self.source == SWEEP else self.values
    return ConfigError(self.source, given, allowed)

  def index(self, value: Any) -> int | None:
    """The position of `value` among the values (NaN is NaN); None: not one of them."""
    return next((i for i, v in enumerate(self.values)
                 if v == value or (v != v and value != value)), None)

  def refusal_of(self, value: Any, allowed: str) -> ConfigError:
    """One of its values refused, naming its flag."""
    if self.source == SWEEP:
      return ConfigError(SWEEP, f"{self.field}={self.texts[self.index(value)]}", allowed)
    return ConfigError(self.source, value, allowed)


def given(sweep: tuple[str, ...], aliases: dict[str, tuple | None]) -> list[Sweep]:
  """The sweeps of a command line: the aliases given (by their field), in
  ALIASES' order, then each --sweep, in its order; a field swept twice is refused."""
  sweeps = [Sweep(ALIASES[name], tuple(values), name)
            for name, values in aliases.items() if values is not None]
  sweeps += [parse(text) for text in sweep]
  seen: dict[str, Sweep] = {}
  for s in sweeps:
    if s.field in seen:
      raise s.refusal(f"each field swept once ({s.field} is swept by "
                      f"{flag(seen[s.field].source)} too)")
    seen[s.field] = s
  return sweeps


def parse(text: str) -> Sweep:
  """``staleness_bound=3,10`` -> Sweep("staleness_bound", (3, 10)), each value
  read by the field's type (ranges: checked in the cells' configs)."""
  name, equals, values = text.partition("=")
  field = name.strip().removeprefix("--").replace("-", "_")
  if not equals:
    raise ConfigError(SWEEP, text, "NAME=V1,V2,...: a `jaxdl run` field or an algorithm's "
                      "setting, and its values")
  hint = _sweepable_type(field, text)
  texts = tuple(v.strip() for v in values.split(","))
  if "" in texts:
    raise ConfigError(SWEEP, text, f"{field}=V1,V2,...: one value or more, none empty")
  parsed = []
  for value in texts:
    parsed.append(_read(field, value, hint))
    try:
      check_numbers({field: parsed[-1]}, {field: hint})
    except ConfigError as e:
      raise ConfigError(SWEEP, f"{field}={value}", e.allowed) from None
  return Sweep(field, tuple(parsed), SWEEP, texts)


def _sweepable_type(field: str, text: str) -> Any:
  """The type of the run field or setting `field`; refused where no sweep takes it."""
  owners = settings_owners()
  run_types = run_field_types()
  if field in PER_CELL:
    raise ConfigError(SWEEP, text, f"a field other than {field}, which compare sets per "
                      f"cell: {per_cell(field)}")
  if field in ONE_A_GRID:
    raise ConfigError(SWEEP, text, f"a field other than {field}: {ONE_A_GRID[field]}")
  if field in run_types:
    hint = run_types[field]
  elif field in owners:
    hint = field_types(owners[field][0].settings)[field]
  else:
    known = [*field_owner(), *owners]
    close = difflib.get_close_matches(field, known, n=1)
    raise ConfigError(SWEEP, text, "NAME=V1,V2,... with NAME a `jaxdl run` field or an "
                      "algorithm's setting (`jaxdl run --help`, `jaxdl list`)"
                      + (f"; did you mean {close[0]}?" if close else ""))
  if typing.get_origin(_optional(hint)) is tuple:
    raise ConfigError(SWEEP, text, f"a field of one value: {field} takes a list")
  return hint


def _optional(hint: Any) -> Any:
  """`hint` without its `| None`."""
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    rest = [a for a in typing.get_args(hint) if a is not type(None)]
    return rest[0] if len(rest) == 1 else hint
  return hint


def _read(field: str, text: str, hint: Any) -> Any:
  """`text` as a value of the type `hint` (None: "None", where the field may be unset)."""
  kind = _optional(hint)
  if kind is not hint and text in ("None", "none"):
    return None
  choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else None
  try:
    if choices is not None and text in map(str, choices):
      return next(c for c in choices if str(c) == text)
    if kind is bool and text.lower() in ("true", "false"):
      return text.lower() == "true"
    if kind in (int, float):
      return kind(text)
    if kind is str:
      return text
  except ValueError:
    pass
  unset = ", or None" if kind is not hint else ""
  raise ConfigError(SWEEP, f"{field}={text}", f"{type_name(kind)}{unset}")


def check_taken(grid: Grid, sweep: Sweep, shared: dict[str, Any]) -> None:
  """Refuses a sweep with no value, one that no variant of the grid takes
  (it would be ignored), and one of a field that a shared flag sets too."""
  if not sweep.values:
    raise sweep.refusal("one value or more")
  if sweep.field in shared:
    raise sweep.refusal(f"a field that no shared flag sets too ({flag(sweep.field)} is given)")
  if any(takes(v.algorithm, sweep.field) for v in grid.variants):
    return
  if sweep.field in field_owner():
    raise sweep.refusal(f"left unset: a run field's sweep leaves the one-worker baseline at "
                        f"the shared value, and the grid ({algorithms_of(grid)}) has no other "
                        "variant")
  owners = ", ".join(s.name for s in settings_owners()[sweep.field])
  raise sweep.refusal(f"left unset: no algorithm in the grid ({algorithms_of(grid)}) has "
                      f"{flag(sweep.field)} ({owners} do)")
