"""Command lines parsed by tyro, whose errors are one line: a ConfigError
that names the flag, the value given and what the flag takes, which the CLI
prints and exits with code 2 (tyro itself draws a box of 6 to 16 lines).

    jaxdl run: error: --workers='x' is not valid: an integer
    jaxdl run: error: --worker is not a flag of jaxdl run (did you mean --workers?); see
      jaxdl run --help
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import re
import sys
import types
import typing
from typing import Annotated, Any

import tyro

from jaxdl.config import type_name
from jaxdl.errors import ArgvError, ConfigError, flag
from jaxdl.settings import field_docs

try:  # tyro's hook on a parse error, before it prints (1.0; a private module that may move)
  from tyro import _errors as _tyro_errors
  _ON_PARSE_ERROR = _tyro_errors.on_parse_error
except (ImportError, AttributeError):
  _ON_PARSE_ERROR = None


def parse(cls: type, args: list[str], prog: str, **kwargs: Any) -> Any:
  """``tyro.cli(cls, args=args, prog=prog, **kwargs)``; a command line it
  cannot parse raises a ConfigError (an ArgvError) naming the flag."""
  if _ON_PARSE_ERROR is None:
    with _condensed():
      return tyro.cli(cls, args=args, prog=prog, **kwargs)
  with _ON_PARSE_ERROR(lambda event: _refuse(event, args, cls)):
    return tyro.cli(cls, args=args, prog=prog, **kwargs)


def _refuse(event: Any, args: list[str], cls: type) -> None:
  """Raises the one-line error of tyro's parse-error `event`; other events
  (none that these command lines can raise) fall through to tyro's own."""
  e, prog = _tyro_errors, event.prog
  argument = getattr(event, "argument", None)
  field = _field(argument.lowered.name_or_flags[0]) if argument is not None else ""
  if isinstance(event, e.InvalidChoice):
    raise ConfigError(field, event.value, "one of " + ", ".join(event.choices))
  if isinstance(event, e.InstantiationFailure) and argument is not None:
    raise ConfigError(field, _given(args, flag(field), argument.lowered.nargs),
                      _kind(argument.field.type))
  if isinstance(event, e.BadValue):
    kind = _kind(argument.field.type)
    raise ArgvError(field, None, kind, f"{flag(field)} needs a value: {kind}")
  if isinstance(event, e.MissingArgs):
    missing = event.missing_arguments[0].arg
    field = _field(missing.lowered.name_or_flags[0])
    doc = field_docs(cls).get(field, "required").rstrip(".")
    doc = doc[:1].lower() + doc[1:]
    raise ArgvError(field, None, doc, f"{flag(field)} is missing: {doc} (see {prog} --help)")
  if isinstance(event, e.UnrecognizedArgs):
    raise _unrecognized(event.tokens[0], args, cls, prog)
  if isinstance(event, e.InstantiationFailure):
    raise ArgvError("", None, "", f"{event.message.splitlines()[0]} (see {prog} --help)")


def _field(name: str) -> str:
  """The field of a flag or positional argument: ``--batch-size`` -> batch_size."""
  return name.lstrip("-").replace("-", "_")


def _given(args: list[str], name: str, nargs: Any) -> str:
  """What `args` gave the flag `name` (its last occurrence): one value, or
  every value up to the next flag."""
  for i in range(len(args) - 1, -1, -1):
    if args[i].startswith(name + "="):
      return args[i].partition("=")[2]
    if args[i] == name:
      values = []
      for value in args[i + 1:]:
        if value.startswith("--") or (nargs == 1 and values):
          break
        values.append(value)
      return " ".join(values)
  return ""


def _kind(hint: Any) -> str:
  """What a flag of type `hint` takes, in words."""
  if typing.get_origin(hint) is Annotated:
    hint = typing.get_args(hint)[0]
  args = typing.get_args(hint)
  if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
    rest = [a for a in args if a is not type(None)]
    return f"{_kind(rest[0])}, or None (unset)"
  if typing.get_origin(hint) is tuple:
    return f"values, each {_kind(args[0])}"
  if hint is bool:
    return "no value"
  return type_name(hint)


def _flag_types(cls: type) -> dict[str, Any]:
  """Every flag of a (nested) dataclass of flags -> its type; a section's
  fields are flat flags (tyro.conf.OmitArgPrefixes)."""
  out = {}
  hints = typing.get_type_hints(cls, include_extras=True)
  for f in dataclasses.fields(cls):
    inner = f.default if dataclasses.is_dataclass(f.default) else hints[f.name]
    if dataclasses.is_dataclass(inner):
      out |= _flag_types(inner if isinstance(inner, type) else type(inner))
    else:
      out[flag(f.name)] = hints[f.name]
      if hints[f.name] is bool:
        out["--no-" + flag(f.name)[2:]] = bool
  return out


def _unrecognized(token: str, args: list[str], cls: type, prog: str) -> ArgvError:
  """The error of an argument that is no flag of `prog`: an unknown flag, or
  a value after a flag that takes none (or one value fewer)."""
  known = _flag_types(cls)
  if token.startswith("-"):
    name = token.partition("=")[0]
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ArgvError(_field(name), token, "a flag of " + prog,
                     f"{name} is not a flag of {prog}{hint}; see {prog} --help")
  at = next((i for i, a in enumerate(args) if a == token or a.endswith("=" + token)), None)
  before = [a.partition("=")[0] for a in args[:at + 1 if at is not None else 0]
            if a.startswith("--") and a != token]
  if not before:
    return ArgvError("", token, "", f"unexpected argument {token!r} (see {prog} --help)")
  name = before[-1]
  takes = _kind(known.get(name, str))
  return ArgvError(_field(name), token, takes, f"unexpected argument {token!r} after {name}, "
                   f"which takes {takes}")


@contextlib.contextmanager
def _condensed():
  """Without tyro's hook: its error box, caught, in one line."""
  captured = io.StringIO()
  try:
    with contextlib.redirect_stderr(captured):
      yield
  except SystemExit as e:
    if e.code != 2:
      sys.stderr.write(captured.getvalue())
      raise
    text = " ".join(re.sub(r"[\u2500-\u257f]+", " ", captured.getvalue()).split())
    raise ArgvError("", None, "", text) from None
  sys.stderr.write(captured.getvalue())
