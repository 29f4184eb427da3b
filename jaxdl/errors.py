"""The one exception type for bad user input."""
from __future__ import annotations

from typing import Any


def flag(field: str) -> str:
  """The command-line flag of a config field: ``batch_size`` -> ``--batch-size``."""
  return "--" + field.replace("_", "-")


class ConfigError(ValueError):
  """Bad user input: names the field, the value given and what is allowed.

  The CLI prints ``str(error)`` as one line and exits with code 2.
  """

  def __init__(self, field: str, value: Any, allowed: str):
    self.field, self.value, self.allowed = field, value, allowed
    super().__init__(f"{flag(field)}={value!r} is not valid: {allowed}")


class TaskError(ConfigError):
  """A script's task that jaxdl cannot train: names the task, the part of it
  at fault (its loss, its train data, ...) and what is needed."""

  def __init__(self, task: str, part: str, allowed: str):
    ValueError.__init__(self, f"task {task!r}, {part}: {allowed}")
    self.field, self.value, self.allowed = "task", task, allowed
