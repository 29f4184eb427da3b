"""The one exception type for bad user input."""
from __future__ import annotations

import math
from typing import Any


POSITIONAL = {"dir": "DIR"}
"""Fields given by their position, not by a flag (``jaxdl report DIR``)."""


def flag(field: str) -> str:
  """The command-line flag of a config field: ``batch_size`` -> ``--batch-size``
  (a positional argument: its name, ``DIR``)."""
  return POSITIONAL.get(field) or "--" + field.replace("_", "-")


class ConfigError(ValueError):
  """Bad user input: names the field, the value given and what is allowed.

  The CLI prints ``str(error)`` as one line and exits with code 2.
  """

  def __init__(self, field: str, value: Any, allowed: str):
    self.field, self.value, self.allowed = field, value, allowed
    super().__init__(f"{flag(field)}={value!r} is not valid: {allowed}")


class ArgvError(ConfigError):
  """A command line that does not parse (an unknown flag, a flag without its
  value, a stray argument): `message` says it in one line, naming the flag."""

  def __init__(self, field: str, value: Any, allowed: str, message: str):
    ValueError.__init__(self, message)
    self.field, self.value, self.allowed = field, value, allowed


class TaskError(ConfigError):
  """A script's task that jaxdl cannot train: names the task, the part of it
  at fault (its loss, its train data, ...) and what is needed."""

  def __init__(self, task: str, part: str, allowed: str):
    ValueError.__init__(self, f"task {task!r}, {part}: {allowed}")
    self.field, self.value, self.allowed = "task", task, allowed


def positive(field: str, value: float | int | None, *, allow_none=False, zero=False) -> None:
  """A ConfigError naming `field` unless `value` is a number > 0 (>= 0 with
  `zero`; or None with `allow_none`)."""
  if value is None and allow_none:
    return
  ok = value is not None and math.isfinite(value) and (value >= 0 if zero else value > 0)
  if not ok:
    raise ConfigError(field, value, "a number >= 0" if zero else "a number > 0")
