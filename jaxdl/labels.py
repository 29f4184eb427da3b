"""Names of algorithm variants, derived from the registry: ``ssp_s3``,
``easgd_tau8``, ``gosgd_p0.1``, ``asp_abn`` (asp with --async-bn).

A variant's name is the algorithm's, then ``_<symbol><value>`` for each
setting given, by the setting's paper symbol (`jaxdl.settings.setting`) or
else its field name, ``_abn`` for Async-BN, and ``_proportional`` or
``_adaptive`` for a --partition other than static (``bsp_adaptive``). A
run directory is named by the settings with a symbol (the ones comparisons
vary).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from jaxdl.algorithms import ALGORITHMS
from jaxdl.errors import ConfigError
from jaxdl.settings import field_types, symbol

ASYNC_BN = "abn"  # the suffix of a variant with --async-bn
PARTITIONS = ("proportional", "adaptive")  # suffixes of --partition (static: none)


def _spec(algorithm: str):
  return ALGORITHMS.get(algorithm)


def _number(v: Any) -> str:
  return f"{v:g}" if isinstance(v, float) else str(v)


def part(algorithm: str, field: str, value: Any) -> str:
  """One setting's part of a variant name."""
  if field == "async_bn":
    return ASYNC_BN
  if field == "partition":
    return value
  sym = symbol(ALGORITHMS.get(algorithm).settings, field) if algorithm in ALGORITHMS else None
  return f"{sym or field}{_number(value)}"


def label(algorithm: str, settings: tuple[tuple[str, Any], ...]) -> str:
  """The variant name of `algorithm` with `settings` (flat field -> value)."""
  return "_".join([algorithm] + [part(algorithm, k, v) for k, v in settings
                                 if v is not False and v is not None and v != "static"])


def config_label(config: dict) -> str:
  """The variant name of a run's flat config: its settings with a symbol."""
  algorithm = config["algorithm"]
  settings = []
  if algorithm in ALGORITHMS:
    cls = ALGORITHMS.get(algorithm).settings
    settings = [(f.name, config.get(f.name, f.default)) for f in dataclasses.fields(cls)
                if symbol(cls, f.name)]
  settings.append(("async_bn", bool(config.get("async_bn"))))
  settings.append(("partition", config.get("partition", "static")))
  return label(algorithm, tuple(settings))


def parse(text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
  """``ssp_s3`` -> ("ssp", (("staleness_bound", 3),)); ``asp_abn`` ->
  ("asp", (("async_bn", True),)); ``asp`` -> ("asp", ())."""
  if text in ALGORITHMS:
    return text, ()
  for name in sorted(ALGORITHMS, key=len, reverse=True):
    if not text.startswith(name + "_"):
      continue
    cls = ALGORITHMS.get(name).settings
    by_symbol = {symbol(cls, f.name) or f.name: f.name for f in dataclasses.fields(cls)}
    settings = []
    for piece in text[len(name) + 1:].split("_"):
      if piece == ASYNC_BN:
        settings.append(("async_bn", True))
        continue
      if piece in PARTITIONS:
        settings.append(("partition", piece))
        continue
      match = re.fullmatch(r"([a-z]+)(-?\d+(?:\.\d*)?(?:e-?\d+)?)", piece)
      if not match or match.group(1) not in by_symbol:
        break
      field = by_symbol[match.group(1)]
      kind = field_types(cls)[field]
      value = float(match.group(2)) if "float" in str(kind) else int(float(match.group(2)))
      settings.append((field, value))
    else:
      return name, tuple(settings)
  symbols = sorted({symbol(ALGORITHMS.get(n).settings, f.name) or f.name
                    for n in ALGORITHMS for f in dataclasses.fields(ALGORITHMS.get(n).settings)})
  raise ConfigError("algorithms", text, "ALGORITHM, ALGORITHM_<setting><number> (settings: "
                    f"{', '.join(symbols)}), ALGORITHM_{ASYNC_BN} or ALGORITHM_"
                    f"{'|'.join(PARTITIONS)}; algorithms: {', '.join(ALGORITHMS)}")
