"""What every engine shares (jaxdl.engines.base): here, how a real engine
counts a synchronous run's bytes, the simulator's way."""
import pytest

from jaxdl.config import RunConfig
from jaxdl.engines import base
from jaxdl.trace import Event
from tests.helpers import make_setup

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
