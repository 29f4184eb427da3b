"""Typed, documented, validated settings: the base of every algorithm's own.

An algorithm declares its hyperparameters as a frozen dataclass deriving from
`Settings`, each field with a default and a docstring below it (shown by
``jaxdl run --help`` and ``jaxdl list``), optionally its paper symbol
(``setting(3, symbol="s")``: compare names the variant ``ssp_s3``). Values are
checked against the annotated types on construction, then by the class's own
`validate`; a bad one raises a ConfigError that names the flag.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import numbers
import textwrap
import types
import typing
from typing import Any

from jaxdl.errors import ConfigError
from jaxdl.registry import Registry


SETTINGS: Registry[type[Settings]] = Registry("algorithm")
"""Each registered algorithm's settings class, by the algorithm's name: the
run config's schema for the algorithm's own fields (kept by
jaxdl.algorithms.ALGORITHMS as algorithms are registered)."""


@dataclasses.dataclass(frozen=True)
class Range:
  """The values a setting allows: a number within bounds (each closed or
  open, either absent), or one of `choices`. Unset (None), where the
  setting's type allows it, is always allowed.

  `noun` names the kind of value in messages ("a decay"; default: "an
  integer" for an int setting, else "a number"); `note` says what it counts.
  """
  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  choices: tuple[str, ...] = ()
  noun: str | None = None
  note: str = ""

  def allows(self, value: Any) -> bool:
    if self.choices:
      return value in self.choices
    above = self.low is None or (value > self.low if self.low_open else value >= self.low)
    below = self.high is None or (value < self.high if self.high_open else value <= self.high)
    return above and below

  def describe(self, kind: type = float) -> str:
    """What the range allows, as an error message says it: "an integer >= 1
    (local steps between averagings)", "a decay in [0, 1)", "one of a, b"."""
    if self.choices:
      text = "one of " + ", ".join(self.choices)
    else:
      noun = self.noun or ("an integer" if kind is int else "a number")
      if self.low is not None and self.high is not None:
        text = (f"{noun} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                f"{')' if self.high_open else ']'}")
      elif self.low is not None:
        text = f"{noun} {'>' if self.low_open else '>='} {self.low:g}"
      else:
        text = f"{noun} {'<' if self.high_open else '<='} {self.high:g}"
    return f"{text} ({self.note})" if self.note else text


def at_least(low: float, *, noun: str | None = None, note: str = "") -> Range:
  return Range(low, noun=noun, note=note)


def above(low: float, *, noun: str | None = None, note: str = "") -> Range:
  return Range(low, low_open=True, noun=noun, note=note)


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False,
            noun: str | None = None, note: str = "") -> Range:
  return Range(low, high, low_open, high_open, noun=noun, note=note)


def one_of(*choices: str) -> Range:
  return Range(choices=choices)


def setting(default: Any, *, symbol: str | None = None, allowed: Range | None = None) -> Any:
  """A settings field: `symbol` is its short name in variant labels (ssp_s3),
  `allowed` its range (checked on construction, shown by --help)."""
  metadata = {k: v for k, v in (("symbol", symbol), ("allowed", allowed)) if v is not None}
  return dataclasses.field(default=default, metadata=metadata)


def allowed(cls: type, field: str) -> Range | None:
  """The declared range of a settings class's field (None: any value of its type)."""
  return next(f.metadata.get("allowed") for f in dataclasses.fields(cls) if f.name == field)


def require(field: str, value: Any, ok: bool, allowed: str) -> None:
  """Raises ConfigError(field, value, allowed) unless `ok`."""
  if not ok:
    raise ConfigError(field, value, allowed)


@dataclasses.dataclass(frozen=True)
class Settings:
  """No settings of its own."""

  def __post_init__(self):
    for field, kind in field_types(type(self)).items():
      value = _coerce(field, getattr(self, field), kind)
      object.__setattr__(self, field, value)
      valid = allowed(type(self), field)
      if valid is not None and value is not None and not valid.allows(value):
        raise ConfigError(field, value, valid.describe(base_type(kind)))
    self.validate()

  def validate(self) -> None:
    """Raises a ConfigError for values that their ranges allow but not
    together (types and each field's range are checked already)."""

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
  hints = typing.get_type_hints(cls)
  return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def base_type(kind: Any) -> Any:
  """int for `int | None`, and so on: the type a setting's value has when set."""
  args = typing.get_args(kind)
  if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args:
    return next(a for a in args if a is not type(None))
  return kind


def _coerce(field: str, value: Any, kind: Any) -> Any:
  """`value` as `kind` (int, float, bool, str, or one of them | None)."""
  args = typing.get_args(kind)
  if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args:
    if value is None:
      return None
    kind = next(a for a in args if a is not type(None))
  name = getattr(kind, "__name__", str(kind))
  if kind is bool:
    require(field, value, isinstance(value, bool), "true or false")
  elif kind is int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    require(field, value, ok, "an integer")
    value = int(value)
  elif kind is float:
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value))
    require(field, value, ok, "a finite number")
    value = float(value)
  elif kind is str:
    require(field, value, isinstance(value, str), "a string")
  else:
    raise TypeError(f"setting {field}: type {name} is not supported (int, float, bool, str)")
  return value


def symbol(cls: type, field: str) -> str | None:
  """The paper symbol of the setting `field` of `cls` (None: none, or not its setting)."""
  return next((f.metadata.get("symbol") for f in dataclasses.fields(cls) if f.name == field),
              None)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
  """The docstring under each field of a dataclass (and of its bases)."""
  docs: dict[str, str] = {}
  for klass in reversed(cls.__mro__):
    if not dataclasses.is_dataclass(klass) or klass is object:
      continue
    try:
      tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):
      continue
    body = tree.body[0].body
    for node, following in zip(body, body[1:] + [None]):
      if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
          and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
          and isinstance(following.value.value, str)):
        docs[node.target.id] = " ".join(following.value.value.split())
  return docs


def owners() -> dict[str, list[str]]:
  """Each setting's name -> the algorithms that declare it, in registry order."""
  found: dict[str, list[str]] = {}
  for name in SETTINGS:
    for field in dataclasses.fields(SETTINGS.get(name)):
      found.setdefault(field.name, []).append(name)
  return found
