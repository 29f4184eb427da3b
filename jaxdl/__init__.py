"""jaxdl: distributed deep-learning training algorithms in JAX, behind one contract."""
from __future__ import annotations

from jaxdl.config import RunConfig
from jaxdl.errors import ConfigError


def run(config: RunConfig | None = None, **overrides):
  """Trains one configuration; see `jaxdl.runner.run`."""
  from jaxdl.runner import run as _run  # heavy imports only when training
  return _run(config, **overrides)


__all__ = ["ConfigError", "RunConfig", "run"]
__version__ = "0.1.0"
