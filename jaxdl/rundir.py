"""The run directory: config, metrics (JSONL + TensorBoard), summary, checkpoints."""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax

from jaxdl import trace
from jaxdl.config import ENVIRONMENT
from jaxdl.errors import ConfigError

try:
  import fcntl
except ImportError:  # Windows: no flock (claimed holds nothing)
  fcntl = None

CONFIG, METRICS, SUMMARY, CHECKPOINTS, TENSORBOARD, TRACE, CLUSTER = (
    "config.json", "metrics.jsonl", "summary.json", "checkpoints", "tb", "trace.jsonl",
    "cluster.json")
RUN_FILES = (CONFIG, METRICS, SUMMARY, CHECKPOINTS, CHECKPOINTS + ".corrupt", TENSORBOARD,
             TRACE, CLUSTER)


def environment() -> dict[str, Any]:
  """What a run's parameters depend on besides its config: the backend, the
  device count (e.g. ar_sgd's reductions are ordered by the mesh), XLA_FLAGS
  and the jax version."""
  return {"backend": jax.default_backend(), "devices": jax.device_count(),
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax_version": jax.__version__}


def environment_warning(path: Path) -> str | None:
  """One line when the config.json at `path` was written on another
  environment than this process's (None when the same, or not recorded)."""
  try:
    stored = json.loads(Path(path).read_text()).get(ENVIRONMENT)
  except (OSError, ValueError, AttributeError):
    return None
  if not isinstance(stored, dict):
    return None
  now = environment()
  changed = [f"{k} {stored.get(k)!r} -> {v!r}" for k, v in now.items() if stored.get(k) != v]
  if not changed:
    return None
  return (f"warning: {path} was written with another environment ({'; '.join(changed)}): "
          "the parameters and their fingerprint may differ")


def _limit(name: str, default: int) -> int:
  """This file system's limit `name` (os.pathconf), or `default`."""
  try:
    return os.pathconf(os.curdir, name)
  except (OSError, ValueError):
    return default


PATH_ROOM = 256
"""Bytes of a path kept for the files a run or a comparison writes under it."""


def check_path(field: str, value: str) -> Path:
  """`value`, the path a flag names, as a Path; refused if empty (it would
  name the current directory) or longer than the file system takes."""
  if not value.strip():
    raise ConfigError(field, value, "a path (an empty one names no file)")
  most = _limit("PC_NAME_MAX", 255)
  longest = max(Path(value).parts, key=lambda p: len(os.fsencode(p)))
  if len(os.fsencode(longest)) > most:
    raise ConfigError(field, value, f"a path whose every name is at most {most} bytes "
                      f"(one has {len(os.fsencode(longest))})")
  whole = len(os.fsencode(os.path.abspath(value)))
  most = _limit("PC_PATH_MAX", 4096) - PATH_ROOM
  if whole > most:
    raise ConfigError(field, value, f"a path of at most {most} bytes from / (this one has "
                      f"{whole})")
  return Path(value)


def _writable(directory: Path) -> bool:
  """Whether a file can be created in `directory`, tried (permission bits
  alone say yes to root where the file system says no)."""
  try:
    fd, name = tempfile.mkstemp(dir=directory, prefix=".jaxdl-probe-")
  except OSError:
    return False
  os.close(fd)
  os.remove(name)
  return True


def check_writable(out: Path, field: str = "out") -> None:
  """Refuses an output dir that is an existing file or cannot be created or
  written (its nearest existing ancestor is tried); leaves nothing."""
  if out.exists() and not out.is_dir():
    raise ConfigError(field, str(out), "a directory, not an existing file")
  existing = out if out.exists() else next(p for p in out.absolute().parents if p.exists())
  if not (existing.is_dir() and _writable(existing)):
    raise ConfigError(field, str(out), f"a writable directory ({existing} is not writable)")


def check_output(out: Path, resume: bool, overwrite: bool) -> None:
  """Refuses an output dir that cannot be written or holds another run; leaves nothing."""
  check_writable(out)
  if out.exists() and any(out.iterdir()) and not (resume or overwrite):
    raise ConfigError("out", str(out), "a new or empty directory; pass --resume to "
                      "continue the run in it, or --overwrite to replace its run files")


@contextlib.contextmanager
def claimed(out: Path, field: str = "out"):
  """Holds directory `out` (made if need be) for this process while it writes
  there: a second run or compare into it at the same time is refused, before
  it writes, rather than mixed into this one's files (a job started twice,
  or requeued while it still runs). The hold is the kernel's (flock on the
  directory), so a killed process leaves none behind. Where the file system
  has no such locks (some network file systems) and on Windows, nothing
  is held."""
  out.mkdir(parents=True, exist_ok=True)
  if fcntl is None:
    yield out
    return
  fd = os.open(out, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
      os.close(fd)
      raise ConfigError(field, str(out), "a directory that no other run or compare is writing "
                        "to (one is running in it now)") from None
  try:
    yield out
  finally:
    os.close(fd)  # the hold goes with it


def finite(data: Any) -> Any:
  """`data` with every NaN or infinite float replaced by None (null): strict
  JSON has no NaN, and a diverged run's losses are NaN."""
  if isinstance(data, float):
    return data if math.isfinite(data) else None
  if isinstance(data, dict):
    return {k: finite(v) for k, v in data.items()}
  if isinstance(data, (list, tuple)):
    return [finite(v) for v in data]
  return data


def dumps(data: Any, **kwargs: Any) -> str:
  """Strict JSON of `data`, non-finite numbers as null; any other NaN that
  slips through (a numpy scalar) raises instead of writing ``NaN``."""
  return json.dumps(finite(data), allow_nan=False, **kwargs)


def temporary(path: Path) -> Path:
  """Where a run file is written before it replaces `path` at once
  (os.replace): a process killed while writing leaves the old file whole."""
  return path.with_name(path.name + ".tmp")


def write_json(path: Path, data: dict[str, Any]) -> None:
  """Atomic write of strict JSON: a reader sees the old file or the new one, never half."""
  temporary(path).write_text(dumps(data, indent=2) + "\n")
  os.replace(temporary(path), path)


def save_trace(path: Path, events, append: bool = False) -> None:
  """A run's trace.jsonl: written whole at once (`temporary`), or `events`
  appended, where a kill midway leaves a last line without its newline,
  which a resumed run's reading leaves out (trace.read_trace's `torn_tail`)."""
  trace.write_trace(path if append else temporary(path), events, append=append)
  if not append:
    os.replace(temporary(path), path)


def clear_run_files(out: Path) -> None:
  """Removes what an earlier run wrote (for --overwrite), with the temporary
  files a write killed midway left beside them; other files stay."""
  for path in (p for name in RUN_FILES for p in (out / name, temporary(out / name))):
    if path.is_dir():
      shutil.rmtree(path)
    elif path.exists():
      path.unlink()


def step_times(path: Path, batch_sizes) -> list[float]:
  """Simulated time at the end of each step of a trace.jsonl, as every engine
  counts steps (`batch_sizes`: the workers', or their number when all are
  equal)."""
  events = list(trace.read_trace(path))
  return [events[i].time for i in trace.step_ends(events, batch_sizes)]


def evaluations(run: Path, summary: dict[str, Any], workers: int) -> list[dict[str, Any]]:
  """Every record of a run's metrics.jsonl: step, epoch, time (simulated, from
  the trace, for a run whose summary has a simulated time; else wall) and
  score, the summary's target metric (None between evaluations). A simulated
  run whose trace is missing (OSError) or ends before its last record
  (ValueError) has no times: its wall seconds are not simulated ones."""
  path = run / METRICS
  if not path.exists():
    return []
  records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
  if "simulated_time_s" not in summary or not records:
    ends = None
  else:
    ends = step_times(run / TRACE, summary.get("batch_sizes") or workers)
    last = max(r["step"] for r in records)
    if last > len(ends):
      raise ValueError(f"{TRACE} ends at step {len(ends)}, before the record of step {last} "
                       "in metrics.jsonl: the simulated times of its steps are not all there")
  metric = summary.get("target_metric", "test_accuracy")
  return [{"step": r["step"], "epoch": r["epoch"], "score": r.get(metric),
           "time": r["wall_time_s"] if ends is None else ends[r["step"] - 1]}
          for r in records]


def first_reaching(points, target: float, higher_is_better: bool = True):
  """The first of `points` (`evaluations`) whose score reaches `target`, or None."""
  reached = (lambda x: x >= target) if higher_is_better else (lambda x: x <= target)
  return next((p for p in points if p["score"] is not None and reached(p["score"])), None)


class MetricsLog:
  """Appends records to metrics.jsonl and scalars to TensorBoard event files."""

  def __init__(self, out: Path, resume_step: int | None):
    self._path = out / METRICS
    self.last: dict[str, Any] = {}  # the newest record kept from an earlier run
    if resume_step is not None and self._path.exists():
      self._truncate_after(resume_step)
    self._file = open(self._path, "a")
    from tensorboardX import SummaryWriter  # slow import, only when a run starts
    self._tb = SummaryWriter(str(out / TENSORBOARD))

  def _truncate_after(self, step: int) -> None:
    # Records past the checkpoint came from the interrupted run and will be
    # written again by the resumed one; so will a last line without its
    # newline (a record that a killed process left half written).
    kept = [line for line in self._path.read_text().splitlines(keepends=True)
            if line.endswith("\n") and line.strip() and json.loads(line)["step"] <= step]
    temporary(self._path).write_text("".join(kept))
    os.replace(temporary(self._path), self._path)
    self.last = json.loads(kept[-1]) if kept else {}

  def write(self, record: dict[str, Any]) -> None:
    record = finite(record)  # a NaN loss is written as null, and not to TensorBoard
    self._file.write(dumps(record) + "\n")
    self._file.flush()
    for key, value in record.items():
      if key != "step" and isinstance(value, (int, float)):
        self._tb.add_scalar(key, value, record["step"])

  def close(self) -> None:
    self._file.close()
    self._tb.close()


class NullLog:
  """The metrics log of processes other than the first: writes nothing."""
  last: dict[str, Any] = {}

  def write(self, record: dict[str, Any]) -> None:
    del record

  def close(self) -> None:
    pass
