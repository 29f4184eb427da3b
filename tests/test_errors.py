"""Every error for bad input names a flag that exists."""
import dataclasses
import re
from pathlib import Path

from jaxdl import flags
from jaxdl.calibrate import CalibrateArgs
from jaxdl.compare import CompareArgs
from jaxdl.config import RunConfig
from jaxdl.report import ReportArgs

PACKAGE = Path(__file__).resolve().parents[1] / "jaxdl"
# ConfigError("field", ...), require("field", ...), and the (field, value, ok,
# allowed) rows of the cost model's checks.
PATTERNS = (r'ConfigError\(\s*"(\w+)"', r'require\(\s*"(\w+)"', r'^\s+\("(\w+)", self\.')


def _fields(cls) -> set[str]:
  out = set()
  for f in dataclasses.fields(cls):
    value = f.default if f.default is not dataclasses.MISSING else None
    if dataclasses.is_dataclass(f.type if isinstance(f.type, type) else value):
      out |= _fields(type(value))
    else:
      out.add(f.name)
  return out


def test_every_error_names_an_existing_flag():
  allowed = (_fields(flags.flags_class(RunConfig())) | _fields(CompareArgs)
             | _fields(ReportArgs) | _fields(CalibrateArgs))
  named = {}
  for path in PACKAGE.rglob("*.py"):
    text = path.read_text()
    for pattern in PATTERNS:
      for field in re.findall(pattern, text, re.M):
        named.setdefault(field, path.relative_to(PACKAGE.parent))
  assert len(named) > 30  # the scan found the errors
  unknown = {field: str(path) for field, path in named.items() if field not in allowed}
  assert not unknown, unknown
