"""What every engine shares (jaxdl.engines.base): how a real engine counts
a synchronous run's bytes, the simulator's way; and what every engine
reads of the config, its declaration alone (Engine.fields)."""
import dataclasses
import typing

import chex
import pytest

import jaxdl
from jaxdl.algorithms import ALGORITHMS
from jaxdl.build import prepare, resolve_task
from jaxdl.config import RunConfig, field_types
from jaxdl.engines import ENGINES, SimEngine, base
from jaxdl.engines.ray_driver import RayFields
from jaxdl.engines.sim import SimFields
from jaxdl.trace import Event
from tests import marks
from tests.helpers import make_setup
from tests.test_task import task as regression_task

RUN = dict(engine="sim", workers=3, batch_size=16, dataset="digits", model="mlp", steps=7,
           progress=False)


@pytest.mark.parametrize("name, settings, rounds", [
    # (rounds by hand: "allreduce" at each of the 7 steps, "local" at steps 1, 3, 5)
    ("ar_sgd", {}, lambda mb, msg: 7 * 2 * 2 * mb),
    ("ar_sgd", {"compress": "topk:0.1"}, lambda mb, msg: 7 * 3 * 2 * msg),
    ("local_sgd", {"communication_period": 2}, lambda mb, msg: 3 * 2 * 2 * mb),
    ("diloco", {"inner_steps": 3}, lambda mb, msg: 2 * 2 * 2 * mb),
    # 3 pushes a step, 3 pulls after each step but the last
    ("bsp", {}, lambda mb, msg: 3 * (7 * msg + 6 * mb)),
    ("bsp", {"compress": "topk:0.1"}, lambda mb, msg: 3 * (7 * msg + 6 * mb))])
def test_a_real_engines_bytes_are_the_simulators(name, settings, rounds):
  """The bytes of a synchronous run's steps, counted from its "step" events
  as a real engine counts them, equal the simulator's (its links' count of
  the same run) and the count by hand: a ring all-reduce is 2 (M - 1) model
  bytes, a compressed one M (M - 1) messages, a parameter server's step M
  pushes and M pulls."""
  run = make_setup(RunConfig.make(algorithm=name, **RUN, **settings))
  simulated = run.engine.bytes_total
  mb, msg = run.problem.model_bytes(), run.problem.message_bytes()
  assert (msg < mb) == ("compress" in settings)
  counted = base.collective_bytes(run.algorithm, run.problem, 3, run.engine.events, 7)
  assert counted == simulated == rounds(mb, msg) > 0


def test_a_resumed_runs_steps_count_as_their_steps():
  """Steps 4, 5 and 6 of 7 (a run resumed at step 4): local SGD's averages
  at steps 5 (period 2) are its only ones; bsp pulls after 4 and 5, not 6."""
  steps = [Event(0.0, "step", -1, g) for g in (4, 5, 6)]
  run = make_setup(RunConfig.make(algorithm="local_sgd", communication_period=2, **RUN))
  mb = run.problem.model_bytes()
  assert base.collective_bytes(run.algorithm, run.problem, 3, steps, 7) == 2 * 2 * mb
  run = make_setup(RunConfig.make(algorithm="bsp", **RUN))
  assert base.collective_bytes(run.algorithm, run.problem, 3, steps, 7) == 3 * (3 + 2) * mb


def test_a_synchronous_steps_events_are_its_waits_then_the_step():
  events = base.synchronous_events(2.5, 7, [0.0, 0.25])
  assert [(e.kind, e.worker, e.iteration, e.duration, e.time) for e in events] == [
      ("wait", 0, 7, 0.0, 2.5), ("wait", 1, 7, 0.25, 2.5), ("step", -1, 7, 0.0, 2.5)]
  assert base.trace_figures(events, 2, None)["wait_s"] == [0.0, 0.25]


# --- What an engine reads: its declaration (Engine.fields), nothing else ---

SMALL = dict(batch_size=8, dataset="digits", model="mlp", steps=2, log_every=1,
             optimizer="sgd", lr=0.05, schedule="constant", progress=False)


def _algorithm_for(engine: type) -> str:
  """An algorithm the engine runs, of two workers: asp where it can (a real
  engine's actors then run it), else the first registered of a family it runs."""
  return next(name for name in ("asp", *ALGORITHMS) if ALGORITHMS.get(name).family
              in engine.families and (ALGORITHMS.get(name).max_workers or 2) >= 2)


def _read_in_a_run(name: str, monkeypatch, out) -> set[str]:
  """The names the engine `name` reads of its slice of the config in a small
  run from validation to summary (its `check`, construction, every call of
  the runner, `close`): its declaration records every attribute asked of it,
  through getattr with a default too (which a plain dataclass answers
  silently)."""
  engine, read = ENGINES.get(name), set()

  class Recorded(engine.fields):
    def __getattribute__(self, field):
      if not field.startswith("__"):
        read.add(field)
      return object.__getattribute__(self, field)
  monkeypatch.setattr(engine, "fields", Recorded)
  config = RunConfig.make(algorithm=_algorithm_for(engine), workers=2, engine=name, **SMALL)
  summary = jaxdl.run(config, out=str(out))
  assert summary["status"] == "completed" and summary["steps"] == 2
  return read


ENGINE_CASES = [name if ENGINES.get(name).deterministic else marks.slow(name)
                for name in ENGINES]
"""A real engine's run costs its processes' start-up: with the slow cases
(the common test runs it by default, tests/algorithms/test_common.py)."""


@pytest.mark.parametrize("name", ENGINE_CASES)
def test_an_engine_reads_only_the_fields_it_declares(name, monkeypatch, tmp_path):
  read = _read_in_a_run(name, monkeypatch, tmp_path / "run")
  assert read <= {*base.reads(ENGINES.get(name)), base.RECIPE}, read


@pytest.mark.parametrize("name", list(ENGINES))
def test_an_engines_declaration_is_config_fields_with_their_types(name):
  """Each declared field is a config field by its flat name, of the
  config's type for it (the run's recipe aside); the fields the engine
  alone reads (Engine.own_fields) are among them."""
  engine = ENGINES.get(name)
  reads = base.reads(engine)
  assert dataclasses.is_dataclass(engine.fields) and engine.fields.__dataclass_params__.frozen
  hints = typing.get_type_hints(engine.fields)
  assert {k: hints[k] for k in reads} == {k: field_types()[k] for k in reads}
  assert hints.get(base.RECIPE, base.Recipe) is base.Recipe
  assert set(engine.own_fields) <= set(reads)


@pytest.mark.parametrize("read", [lambda fields: getattr(fields, "lr", 0.05),
                                  lambda fields: fields.lr], ids=["default", "attribute"])
def test_an_undeclared_read_is_caught(read, monkeypatch, tmp_path):
  """An engine that reads a field outside its declaration (the sim engine,
  reading --lr) fails the check above: through getattr with a default, by
  what its slice recorded; as an attribute, in its run (its slice has none)."""

  class Undeclared(SimEngine):
    def __init__(self, algorithm, problem, streams, fields, total_steps):
      read(fields)
      super().__init__(algorithm, problem, streams, fields, total_steps)
  ENGINES.register("undeclared", "the sim engine, reading --lr")(Undeclared)
  try:
    with pytest.raises((AssertionError, AttributeError), match="'lr'"):
      test_an_engine_reads_only_the_fields_it_declares("undeclared", monkeypatch, tmp_path)
  finally:
    ENGINES.remove("undeclared")


def test_a_slice_holds_the_configs_values_and_names_only_config_fields():
  config = RunConfig.make(worker_speeds=(1.0, 2.0), workers=2, replay="run/trace.jsonl")
  fields = base.slice_of(config, SimFields)
  assert (fields.worker_speeds, fields.replay, fields.seed) == ((1.0, 2.0), "run/trace.jsonl", 0)
  assert not hasattr(fields, "lr")

  @dataclasses.dataclass(frozen=True)
  class Misnamed:
    learning_rate: float
  with pytest.raises(TypeError, match="Misnamed.learning_rate: not a config field"):
    base.slice_of(config, Misnamed)


def test_the_recipe_rebuilds_the_run_as_the_driver_built_it():
  """A ray actor's run, rebuilt from the recipe of its slice (the config as
  JSON, and a script's own task): the same config field for field (the
  algorithm's settings and tuples included), the same task object, the same
  batches."""
  task = regression_task()  # a script's own
  config, task = resolve_task(RunConfig.make(
      algorithm="ssp", staleness_bound=3, workers=3, schedule="step", lr_milestones=(0.5, 1.0),
      compute_time=0.01, jitter=0.2, batch_size=8, steps=3, engine="ray"), task)
  driver = prepare(config, task=task)
  recipe = base.slice_of(config, RayFields, task).recipe
  rebuilt = recipe.rebuild()
  settled = lambda c: dataclasses.replace(c, algorithm=dataclasses.replace(
      c.algorithm, settings=c.settings()))  # (unset settings: the defaults)
  assert settled(rebuilt.config) == settled(config) and rebuilt.task is task
  assert rebuilt.config.optim.lr_milestones == (0.5, 1.0)
  assert (rebuilt.total_steps, rebuilt.streams.batch_sizes) == (
      driver.total_steps, driver.streams.batch_sizes)
  chex.assert_trees_all_equal(rebuilt.streams.stacked_batch(2),
                              driver.streams.stacked_batch(2))
