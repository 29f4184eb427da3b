"""ASP and SSP on the sim engine: the invariants of REFERENCE.md."""
import chex
import jax
import optax
import pytest

import jaxdl
from jaxdl.algorithms import Batch, WorkerAxis
from jaxdl.config import RunConfig
from jaxdl.runner import setup
from jaxdl.trace import Event, write_trace
from tests.helpers import RoundRobinStreams, make_engine, train

CONFIG = RunConfig.make(model="mlp", schedule="constant", lr=0.05, momentum=0.9, batch_size=32)


def _sim(tmp_path, name, events, workers, config=CONFIG):
  """The sim engine replaying `events` (written as a trace file in `tmp_path`)."""
  path = tmp_path / f"{name}-trace.jsonl"
  write_trace(path, events)
  steps = sum(e.kind == "apply" for e in events) // workers
  return setup(config.replace(algorithm=name, workers=workers, engine="sim",
                              replay=str(path), steps=steps)).engine


def _round_robin(workers, iterations):
  """Zero delay: each worker pulls right after the previous update."""
  events, t = [], 0.0
  for c in range(iterations):
    for m in range(workers):
      events += [Event(t, "pull", m, c), Event(t + 0.5, "apply", m, c)]
      t += 1.0
  return events


# With the slow cases: by default one worker under a zero-delay schedule is
# checked against the optax loop in tests/algorithms/test_families.py.
@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 3])
def test_asp_under_a_zero_delay_schedule_is_sequential_sgd(tmp_path, workers):
  steps = 6
  sim = _sim(tmp_path, "asp", _round_robin(workers, steps), workers)
  params = sim.evaluated(train(sim, steps)[0])[0]
  sgd = make_engine(CONFIG.replace(algorithm="sgd"), streams=RoundRobinStreams(sim.streams))
  reference = sgd.evaluated(train(sgd, steps * workers)[0])[0]
  chex.assert_trees_all_close(params, reference, rtol=1e-5, atol=1e-7)


def test_stale_gradients_are_applied_exactly(tmp_path):
  # Two workers pull version 0; worker 0's update lands first, so worker 1's
  # gradient, computed on version 0, is applied to version 1 (staleness 1).
  events = [Event(0, "pull", 0, 0), Event(0, "pull", 1, 0),
            Event(1, "apply", 0, 0), Event(2, "apply", 1, 0)]
  sim = _sim(tmp_path, "asp", events, 2)
  state, _ = train(sim, 1)
  problem, streams = sim.problem, sim.streams
  params, _ = problem.init_model(jax.random.key(0))
  opt = problem.optimizer.init(params)

  def grad(worker):
    batch = Batch(*jax.tree.map(lambda x: x[0], streams.stacked_batches([(worker, 0)])))
    g, _, _ = problem.gradients(params, {}, batch, WorkerAxis(1))
    return jax.tree.map(lambda x: x / batch.weights.sum(), g)

  w = params
  for worker in (0, 1):  # both gradients at version 0, applied in order
    updates, opt = problem.optimizer.update(grad(worker), opt, w)
    w = optax.apply_updates(w, updates)
  chex.assert_trees_all_close(sim.evaluated(state)[0], w, rtol=1e-5, atol=1e-7)
  assert int(state.server.version) == 2


RUN = dict(model="mlp", epochs=1, workers=4, batch_size=8, progress=False,
           schedule="constant", momentum=0.0, lr=0.1, jitter=0.3)


def test_ssp_with_an_unreachable_bound_is_asp(tmp_path):
  asp = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "asp"), **RUN))
  ssp = jaxdl.run(RunConfig.make(algorithm="ssp", staleness_bound=10**6,
                                 out=str(tmp_path / "ssp"), **RUN))
  assert ssp["params_fingerprint"] == asp["params_fingerprint"]
  tight = jaxdl.run(RunConfig.make(algorithm="ssp", staleness_bound=0,
                                   out=str(tmp_path / "s0"), **RUN))
  assert tight["staleness_max"] <= asp["staleness_max"]
  assert tight["params_fingerprint"] != asp["params_fingerprint"]
