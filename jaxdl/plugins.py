"""The user's own modules that register algorithms, engines and tasks without
editing the package: `JAXDL_PLUGINS=mypackage.my_algorithm,other.module`
names modules that every process of a run imports with jaxdl (the command
line, compare's cells, the ray engine's workers, the test suite), so that
what they register is run, listed, compared and tested as a built-in entry."""
from __future__ import annotations

import importlib
import os

VARIABLE = "JAXDL_PLUGINS"


def load() -> list[str]:
  """Imports the modules JAXDL_PLUGINS names (comma-separated); their names."""
  names = [n.strip() for n in os.environ.get(VARIABLE, "").split(",") if n.strip()]
  for name in names:
    importlib.import_module(name)
  return names
