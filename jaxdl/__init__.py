"""jaxdl: distributed deep-learning training algorithms in JAX, behind one contract."""
from __future__ import annotations

from jaxdl.config import RunConfig
from jaxdl.errors import ConfigError, TaskError

# A script's own task (jaxdl.task), imported on first use: it pulls in jax.
_TASK_NAMES = ("Task", "FunctionData", "IterableData", "from_linen", "from_nnx")


def run(config: RunConfig | None = None, *, task=None, **overrides):
  """Trains one configuration, of a script's own `task` if given; see
  `jaxdl.runner.run`."""
  from jaxdl.runner import run as _run  # heavy imports only when training
  return _run(config, task=task, **overrides)


def __getattr__(name: str):
  if name in _TASK_NAMES:
    from jaxdl import task
    return getattr(task, name)
  raise AttributeError(f"module 'jaxdl' has no attribute {name!r}")


__all__ = ["ConfigError", "RunConfig", "TaskError", "run", *_TASK_NAMES]
__version__ = "0.1.0"
