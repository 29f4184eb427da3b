"""`jaxdl.run(config)`: one training run, from a validated config to a run directory."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxdl import distributed, rundir, trace
from jaxdl.build import Setup, assemble, build_task, prepare, resolve_task
from jaxdl.cadence import Cadence
from jaxdl.checkpoint import Checkpointer, abstract, placed_like
from jaxdl.config import (ENVIRONMENT, RESOLVED, RUN_CONTROL_FIELDS, TASK_PREFIX, OptimConfig,
                          RunConfig, recorded)
from jaxdl.data import Streams
from jaxdl.engines import ENGINES
from jaxdl.engines.base import slice_of, trace_figures
from jaxdl.engines.sim import compute_as_recorded
from jaxdl.errors import ConfigError
from jaxdl.evaluation import Evaluator
from jaxdl.fingerprint import fingerprint
from jaxdl.models import count_params
from jaxdl.task import Task
from jaxdl.validation import validate

__all__ = ["Setup", "build_task", "prepare", "resolve_task", "run", "setup", "with_engine"]


def default_out(config: RunConfig) -> Path:
  """runs/<algorithm>-<dataset>-<model>-seed<seed>, or for a script's task
  runs/<algorithm>-<task>-seed<seed>."""
  what = (config.data.dataset if config.data.dataset == config.model.model
          else f"{config.data.dataset}-{config.model.model}")
  name = what.replace(":", "-").replace("/", "_")
  return Path("runs") / f"{config.algorithm.algorithm}-{name}-seed{config.train.seed}"


def setup(config: RunConfig, streams: Streams | None = None, task: Task | None = None) -> Setup:
  """Validates `config` and builds its task (`task`, or the config's dataset
  and model), data streams, algorithm and engine; writes nothing.

  Args:
    config: the run's config.
    streams: every worker's data stream, in place of the task's (tests).
    task: a script's own task, in place of --dataset and --model.

  Returns:
    The Setup, with its engine, to close when done (`Engine.close`).

  Raises:
    ConfigError: the first field the validation refuses.
  """
  return with_engine(prepare(config, streams, task))


def with_engine(built: Setup) -> Setup:
  """`built` with its engine, constructed with the slice of the config that
  it declares (Engine.fields; its recipe carries a script's own task)."""
  engine = ENGINES.get(built.engine_name)
  task = built.task if built.config.data.dataset.startswith(TASK_PREFIX) else None
  built.engine = engine(built.algorithm, built.problem, built.streams,
                        slice_of(built.config, engine.fields, task), built.total_steps)
  return built


def _check_resumable(out: Path, config: RunConfig) -> None:
  stored = RunConfig.load(str(out / rundir.CONFIG)).flat()
  for field, value in config.flat().items():
    if field not in RUN_CONTROL_FIELDS and stored.get(field) != value:
      raise ConfigError(field, value, f"{stored.get(field)!r}, as in the run being "
                        "resumed (use another --out for a different run)")


def run(config: RunConfig | None = None, *, task: Task | None = None,
        announce: Callable[[Path], None] | None = None, **overrides: Any) -> dict[str, Any]:
  """Trains as `config` says and returns the run's summary (also in summary.json).
  `announce(run_directory)` is called once the config is accepted, before
  training (the CLI prints it).

  ``jaxdl.run(RunConfig.make(dataset="digits", epochs=5))`` or
  ``jaxdl.run(dataset="digits", epochs=5)``. Bad input raises ConfigError
  before anything is written. A run whose training loss diverges (see
  `divergence`) stops and returns, without raising, a summary whose
  ``"status"`` is ``"diverged"`` (else ``"completed"``).

  Args:
    config: the run's config (None: the defaults).
    task: a script's own `jaxdl.Task` (model, loss, data, evaluation) in
      place of --dataset and --model, which then name it ``task:NAME``; a
      resume passes the same task again.
    announce: called with the run directory once the config is accepted.
    **overrides: flat fields replacing `config`'s (``lr=0.1``).

  Returns:
    The summary (summary.json's content).

  Raises:
    ConfigError: bad input, or an `out` that another run or compare is writing
      to now; before anything is written.
  """
  config, task = resolve_task((config or RunConfig()).replace(**overrides), task)
  plan = validate(config)
  if config.output.replay:
    warning = compute_as_recorded(config.output.replay)
    if warning:
      warnings.warn(warning, stacklevel=3)  # at the caller of jaxdl.run
  distributed.initialize(config.distributed)
  out = Path(config.output.out) if config.output.out else default_out(config)
  if distributed.is_main():
    rundir.check_output(out, config.output.resume, config.output.overwrite)
  built = with_engine(assemble(plan, task))
  try:
    with rundir.claimed(out) if distributed.is_main() else contextlib.nullcontext():
      return _run_in(out, built, config, plan.optim, announce)
  finally:
    built.engine.close()


def _run_in(out: Path, built: Setup, config: RunConfig, optim: OptimConfig,
            announce: Callable[[Path], None] | None) -> dict[str, Any]:
  """The run, its directory `out` held by this process (its main one)."""
  resume = config.output.resume
  resuming = resume and (out / rundir.CONFIG).exists()
  if resuming:
    _check_resumable(out, config)
  source = out / rundir.CONFIG if resuming else config.output.config
  warning = source and rundir.environment_warning(Path(source))
  if warning and distributed.is_main():
    print(warning, file=sys.stderr)
  if distributed.is_main():  # the other processes only take part in checkpoints
    if config.output.overwrite or (resume and not resuming):
      rundir.clear_run_files(out)
    chosen = {"engine": built.engine_name, "batch_sizes": list(built.streams.batch_sizes),
              "steps": built.total_steps}
    rundir.write_json(out / rundir.CONFIG, {**recorded(config, optim), RESOLVED: chosen,
                                            ENVIRONMENT: rundir.environment()})
    rundir.write_json(out / rundir.CLUSTER, {"processes": built.engine.processes()})
    if announce is not None:
      announce(out)
  if config.output.dry_run:
    return _dry_run(built, out)
  return _Training(built, out, resuming).run()


def _dry_run(setup: Setup, out: Path) -> dict[str, Any]:
  """The schedule's timing alone: no parameters, no math."""
  figures = setup.engine.figures()
  samples = setup.total_steps * setup.global_batch
  summary = {"status": "completed", **figures, "steps": setup.total_steps, "samples": samples,
             "samples_per_simulated_s": samples / figures["simulated_time_s"],
             "algorithm": setup.spec.name, "workers": setup.config.algorithm.workers,
             "model": setup.config.model.model, "dry_run": True}
  rundir.save_trace(out / rundir.TRACE, setup.engine.trace())
  rundir.write_json(out / rundir.SUMMARY, summary)
  return summary


DIVERGENCE_FACTOR = 1e3
"""A run diverges at the first step whose training loss is NaN, infinite, or
over this factor times the run's first finite loss (its first step's)."""


def divergence(losses: np.ndarray, initial: float | None,
               params_finite: Callable[[], bool]) -> int | None:
  """Index in `losses` (consecutive steps' training losses) of the step at
  which the run diverged, or None.

  Engines report NaN for a step that computed no gradient, so a NaN is
  divergence only in a run of NaN that ends `losses` while the parameters
  (`params_finite()`, asked only then) are no longer finite.
  """
  limit = DIVERGENCE_FACTOR * initial if initial and initial > 0 else np.inf
  bad = np.flatnonzero(np.isinf(losses) | (losses > limit))
  if bad.size:
    return int(bad[0])
  known = np.flatnonzero(~np.isnan(losses))
  nan_tail = int(known[-1]) + 1 if known.size else 0
  if nan_tail < len(losses) and not params_finite():
    return nan_tail
  return None


class _Training:
  """The host loop: steps, logging, evaluation, checkpoints, summary."""

  def __init__(self, setup: Setup, out: Path, resuming: bool):
    self.s, self.out = setup, out
    c = setup.config.train
    self.cadence = Cadence.of(setup.config.train, setup.streams.steps_per_epoch,
                              setup.total_steps)
    self.state = setup.engine.init(jax.random.fold_in(jax.random.key(c.seed), 0))
    self.ckpt = Checkpointer(out / rundir.CHECKPOINTS, c.keep_checkpoints)
    self.start, self.wall_offset = 0, 0.0
    self.initial_loss: float | None = None  # the first finite training loss
    if resuming:
      restored = self.ckpt.restore_latest(abstract(self.state))
      if restored is not None:
        self.state, meta = placed_like(restored[0], self.state), restored[1]
        self.start, self.wall_offset = meta["step"], meta["wall_time_s"]
        self.initial_loss = meta.get("initial_loss")
    self.previous = self._previous_trace() if self.start else []
    self.written: list[trace.Event] = []  # what trace.jsonl holds, once this process wrote it
    self.log = (rundir.MetricsLog(out, self.start if resuming else None)
                if distributed.is_main() else rundir.NullLog())
    self.evaluator = Evaluator(setup.task)
    self.last_eval: dict[str, float] = {}
    last_loss = self.log.last.get("train_loss")
    self.last_train = {"loss": float("nan") if last_loss is None else last_loss}
    self.diverged: dict[str, Any] | None = None

  def _finished(self) -> dict[str, Any] | None:
    """The summary of a run resumed after its last step, where it had written
    one: as it is (a real engine's figures were measured in the process
    that ran the steps; a process that runs none would measure nothing)."""
    path = self.out / rundir.SUMMARY
    # (with several processes, each would have to find it: they compute it again)
    if self.start < self.s.total_steps or not path.exists() or jax.process_count() > 1:
      return None
    try:
      summary = json.loads(path.read_text())
    except ValueError:
      return None
    return summary if summary.get("status") == "completed" and \
        summary.get("steps") == self.s.total_steps else None

  def _elapsed(self) -> float:
    return self.wall_offset + time.perf_counter() - self.t0

  def run(self) -> dict[str, Any]:
    s = self.s
    finished = self._finished()
    if finished is not None:
      return finished
    self.t0 = time.perf_counter()
    bar = tqdm(total=s.total_steps, initial=self.start, unit="step", dynamic_ncols=True,
               disable=not (s.config.output.progress and distributed.is_main()),
               desc=s.spec.name)
    pending, window_t, window_step = [], self._elapsed(), self.start
    done = self.start
    try:
      for step in range(self.start, s.total_steps):
        self.state, metrics = s.engine.step(self.state, step)
        pending.append(metrics)
        done = step + 1
        evaluate, log, checkpoint = (self.cadence.evaluates(done), self.cadence.logs(done),
                                     self.cadence.checkpoints(done))
        if log or checkpoint:
          # Fetching the metrics also bounds how far dispatch runs ahead; a
          # checkpoint waits for the state anyway, and is never of a diverged one.
          fetched = jax.device_get(jax.tree.map(lambda *x: list(x), *pending))
          self._check_divergence(np.asarray(fetched["loss"], np.float64), done - len(pending))
        if log or self.diverged:
          with warnings.catch_warnings():  # a window of NaN losses is NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            self.last_train = {k: float(np.nanmean(v)) for k, v in fetched.items()}
          pending = []
          evaluate = evaluate and not self.diverged
          if evaluate:
            self.last_eval = self._evaluate()
          now = self._elapsed()
          rate = (done - window_step) * s.global_batch / max(now - window_t, 1e-9)
          window_t, window_step = now, done
          self._log(done, now, rate, evaluate)
          target = self.last_eval.get(s.task.target_metric, float("nan"))
          bar.set_postfix({"loss": f"{self.last_train['loss']:.4f}",
                           s.task.target_metric: f"{target:.4f}",
                           "samples_s": f"{rate:.0f}"}, refresh=False)
        bar.update(1)
        if self.diverged:
          break
        if checkpoint:
          self._checkpoint(done)
    finally:
      bar.close()
      self.ckpt.close()
      self.log.close()
    return self._summary(done)

  def _check_divergence(self, losses: np.ndarray, before: int) -> None:
    """Sets `self.diverged` if one of `losses`, those of the steps after
    `before`, shows the run diverged."""
    if self.initial_loss is None and np.isfinite(losses).any():
      self.initial_loss = float(losses[np.isfinite(losses)][0])
    params_finite = lambda: all(np.isfinite(x).all() for x in jax.tree.leaves(
        self.s.engine.evaluated(self.state)[0]))
    index = divergence(losses, self.initial_loss, params_finite)
    if index is None:
      return
    step, loss = before + index + 1, float(losses[index])
    over = (f" (over {DIVERGENCE_FACTOR:g} x the first loss, {self.initial_loss:.4g})"
            if np.isfinite(loss) else "")
    self.diverged = {"diverged_at_step": step,
                     "divergence": f"train loss {loss:.4g} at step {step}{over}"}

  def _evaluate(self) -> dict[str, float]:
    return self.evaluator(*self.s.engine.evaluated(self.state))

  def _log(self, step: int, wall: float, rate: float, evaluated: bool) -> None:
    record = {"step": step, "epoch": step / self.s.streams.steps_per_epoch,
              "samples": step * self.s.global_batch,
              "train_loss": self.last_train["loss"],
              **{f"train_{k}": v for k, v in self.last_train.items() if k != "loss"},
              "wall_time_s": wall, "samples_per_s": rate}
    if evaluated:
      record.update(self.last_eval)
    self.log.write(record)

  def _previous_trace(self) -> list[trace.Event]:
    """The events of the steps before the checkpoint resumed from, from the
    trace.jsonl written with it."""
    path = self.out / rundir.TRACE
    events = list(trace.read_trace(path, torn_tail=True)) if path.exists() else []
    ends = trace.step_ends(events, self.s.streams.batch_sizes)
    return events[:ends[self.start - 1] + 1] if len(ends) >= self.start else events

  def _trace(self) -> list[trace.Event]:
    """The run's events from step 0. An engine's trace holds either the
    whole run (a simulated schedule) or this process's steps (a real run's
    wall times, which continue after the resumed run's last event)."""
    current = list(self.s.engine.trace())
    if current[:len(self.previous)] == self.previous:
      return current
    offset = self.previous[-1].time  # this process's clock starts after the last event
    return self.previous + [dataclasses.replace(e, time=e.time + offset) for e in current]

  def _write_trace(self) -> None:
    """Writes trace.jsonl: the events since the last write appended where
    those written are still the trace's first (a real run's trace only
    grows), else the whole."""
    events, n = self._trace(), len(self.written)
    grown = 0 < n <= len(events) and events[:n] == self.written
    rundir.save_trace(self.out / rundir.TRACE, events[n:] if grown else events, append=grown)
    self.written = list(events)

  def _checkpoint(self, step: int) -> None:
    # The trace first: a checkpoint's steps are then always in trace.jsonl.
    if distributed.is_main():
      self._write_trace()
    self.ckpt.save(step, self.state, {"wall_time_s": self._elapsed(),
                                      "initial_loss": self.initial_loss})

  def _summary(self, steps: int) -> dict[str, Any]:
    """The summary after `steps` steps (all of them, unless the run diverged)."""
    s = self.s
    if self.diverged:  # its parameters are no result: no test figures
      self.last_eval = {}
    elif not self.last_eval:  # a resumed run that had already finished
      self.last_eval = self._evaluate()
    params, model_state = s.engine.evaluated(self.state)
    wall = self._elapsed()
    samples = steps * s.global_batch
    summary = {
        "status": "diverged" if self.diverged else "completed",
        **(self.diverged or {}),
        **self.last_eval,
        "train_loss": self.last_train["loss"],
        "steps": steps, "samples": samples,
        "epochs": steps / s.streams.steps_per_epoch,
        "wall_time_s": wall, "samples_per_s": samples / wall if wall else float("nan"),
        "params_fingerprint": fingerprint(params),
        "model_state_fingerprint": fingerprint(model_state),
        "num_params": count_params(s.task.init),
        "algorithm": s.spec.name, "workers": s.config.algorithm.workers,
        "dataset": s.config.data.dataset, "model": s.config.model.model,
        "task": s.task.name, "target_metric": s.task.target_metric,
        "higher_is_better": s.task.higher_is_better, **s.task.info,
        "seed": s.config.train.seed,
        "jax_version": jax.__version__, "backend": jax.default_backend(),
        **self._figures(),
        **s.engine.report(self.state),
    }
    summary = rundir.finite(summary)  # as summary.json holds it: NaN is null
    if distributed.is_main():
      self._write_trace()
      summary.update(self._time_figures(summary))
      rundir.write_json(self.out / rundir.SUMMARY, summary)
    return summary

  def _figures(self) -> dict[str, Any]:
    """The engine's figures. A real engine's trace and counts are its
    process's: resumed, the figures of its trace (waits, staleness, batches
    per worker, trace time) are taken from the whole run's instead, and
    `measured_from_step` says that those it counts as it runs (bytes, batch
    times, CPU seconds) are of the steps after the checkpoint's."""
    figures = self.s.engine.figures()
    if not self.start or self.s.engine.simulated:
      return figures
    whole = self._trace()
    from_trace = trace_figures(whole, self.s.config.algorithm.workers,
                               figures.get("bytes_total"))
    from_trace["trace_time_s"] = whole[-1].time if whole else 0.0
    return {**figures, **{k: v for k, v in from_trace.items() if k in figures},
            "measured_from_step": self.start}

  def _time_figures(self, summary: dict[str, Any]) -> dict[str, Any]:
    """Seconds per epoch, and --target-accuracy's and --price-per-device-hour's
    figures, from the run's evaluations (metrics.jsonl: the whole run's,
    after a resume too) and its time (simulated on the sim engine, else
    wall)."""
    c = self.s.config.train
    simulated = "simulated_time_s" in summary
    seconds = summary["simulated_time_s" if simulated else "wall_time_s"]
    figures = {"seconds_per_epoch": seconds / summary["epochs"] if summary["epochs"] else None}
    hit = None
    at = lambda key: None if hit is None else hit[key]
    if c.target_accuracy is not None:
      if not self.diverged:
        points = rundir.evaluations(self.out, summary, self.s.config.algorithm.workers)
        hit = rundir.first_reaching(points, c.target_accuracy, self.s.task.higher_is_better)
      figures.update(target_accuracy=c.target_accuracy,
                     steps_to_target=at("step"), epochs_to_target=at("epoch"),
                     time_to_target_s=at("time"))
    if c.price_per_device_hour is not None:
      devices = self.s.config.algorithm.workers if simulated else summary["devices"]
      rate = devices * c.price_per_device_hour / 3600  # per second
      figures.update(cost=rate * seconds, cost_devices=devices,
                     cost_to_target=None if hit is None else rate * hit["time"])
    return figures
