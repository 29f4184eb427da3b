"""jaxdl: distributed deep-learning training algorithms in JAX, behind one contract."""
from __future__ import annotations

__version__ = "0.1.0"  # the package's (pyproject.toml reads it); CHANGELOG.md says what changed

from jaxdl import plugins
from jaxdl.config import RunConfig
from jaxdl.errors import ConfigError, TaskError
from jaxdl.runner import run
from jaxdl.task import FunctionData, IterableData, Task, from_linen, from_nnx

__all__ = ["ConfigError", "FunctionData", "IterableData", "RunConfig", "Task", "TaskError",
           "from_linen", "from_nnx", "run"]

plugins.load()  # last: a plugin may import any of jaxdl
