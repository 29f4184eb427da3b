"""A grid's findings: what a paper states about its variants ("ASP is more
accurate than AD-PSGD at every worker count"), which `jaxdl report` judges
by the cells' 95% intervals over their seeds (jaxdl.report.findings). They
are stated in an experiment file (no flag sets them): a bad one is refused
as that file's (--experiment), naming the finding's bad value."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from jaxdl.errors import ConfigError

FIGURES = ("metric", "error", "loss", "time_to_target", "samples_per_s")
"""The figures a finding may compare, as the report computes them: the test
metric (accuracy; higher is better, or lower for a loss metric such as nats
per char), the test error % (or the loss metric), the test loss, the time to
the report's target and the samples per second."""


@dataclasses.dataclass(frozen=True)
class Finding:
  """Variant `better` is better than variant `worse` in `figure` at each of
  `workers` (empty: every worker count both have); better follows the
  figure's direction (a higher accuracy, a lower error, loss or time)."""
  name: str
  better: str
  worse: str
  workers: tuple[int, ...] = ()
  figure: str = "metric"

  def __post_init__(self):
    if self.figure not in FIGURES:
      raise ConfigError("experiment", self.figure,
                        f"a finding's figure: one of {', '.join(FIGURES)}")
    if self.better == self.worse:
      raise ConfigError("experiment", self.better, "a finding about two different variants")
    if not isinstance(self.workers, (tuple, list)) or not all(
        isinstance(m, int) and m >= 1 for m in self.workers):
      raise ConfigError("experiment", self.workers, "a finding's worker counts: a tuple of "
                        "counts >= 1")
    object.__setattr__(self, "workers", tuple(self.workers))  # a list given: hashable still

  def to_dict(self) -> dict[str, Any]:
    """grid.json's record of the finding."""
    return {**dataclasses.asdict(self), "workers": list(self.workers)}


def check_findings(findings: Iterable[Finding], variants: Iterable[str]) -> None:
  """Refuses a finding about a variant that is not among `variants` (labels)."""
  labels = list(variants)
  for finding in findings:
    for label in (finding.better, finding.worse):
      if label not in labels:
        raise ConfigError("experiment", label,
                          f"a finding's variant: one of the grid's, {', '.join(labels)}")


def read_findings(records: Any, variants: Iterable[str]) -> tuple[Finding, ...]:
  """The findings of grid.json's record (a list of Finding fields; none in a
  grid.json written before findings were recorded), checked against the
  grid's variants."""
  if records is None:
    return ()
  fields = {f.name for f in dataclasses.fields(Finding)}
  if not isinstance(records, list) or not all(
      isinstance(r, dict) and set(r) <= fields and {"name", "better", "worse"} <= set(r)
      and all(isinstance(r[k], str) for k in ("name", "better", "worse"))
      and isinstance(r.get("workers", []), list) for r in records):
    raise ConfigError("experiment", records, "findings as a list of their fields: name, better, "
                      "worse, workers and figure each")
  findings = tuple(Finding(**{**r, "workers": tuple(r.get("workers", ()))}) for r in records)
  check_findings(findings, variants)
  return findings
