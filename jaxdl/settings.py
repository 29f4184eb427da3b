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


def setting(default: Any, *, symbol: str | None = None) -> Any:
  """A settings field; `symbol` is its short name in variant labels (ssp_s3)."""
  return dataclasses.field(default=default, metadata={"symbol": symbol} if symbol else {})


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
    self.validate()

  def validate(self) -> None:
    """Raises a ConfigError for a value out of range (types are checked already)."""

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
  hints = typing.get_type_hints(cls)
  return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


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
