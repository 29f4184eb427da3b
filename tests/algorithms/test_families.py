"""The registry-driven common test of each family's invariants.

Every registered algorithm is checked against the invariants of its family
(jaxdl.algorithms.families), as optax's common test checks every optimizer: a
newly registered algorithm is covered here without a line of its own. Each
check runs the algorithm through the sim engine, replaying a small
hand-written trace (jaxdl.trace: the event kinds of each family), built as a
run builds it (jaxdl.runner.setup with --replay), under the algorithm's
default settings, which are ones where the property can fail (local SGD
averages within the steps, DC/LC-ASGD compensate, EASGD's elasticity is
not 0).

  Collective     one worker for 5 steps is the sequential optax loop.
  Centralized    one worker under a zero-delay schedule is the sequential
                 optax loop; the server's version counts the applies.
  Elastic        local steps never move the center; an exchange conserves
                 center + worker (a worker's state keeps its parameters as
                 `.params`, as a TrainState does).
  Gossip         a gossip leaves the evaluated (weighted) model unchanged;
                 gossip weights, where a worker has one, sum to 1; a message
                 carries what was sent, whatever the sender does in flight.
  Decentralized  an averaging leaves the evaluated (mean) model unchanged.
"""
import chex
import jax
import numpy as np
import optax
import pytest

from jaxdl.algorithms import (ALGORITHMS, FAMILIES, Centralized, Collective, Decentralized, Elastic,
                              Gossip)
from jaxdl.config import RunConfig
from jaxdl.runner import Setup, setup
from jaxdl.trace import Event, write_trace
from tests import marks
from tests.helpers import train, zoo_model

CONFIG = RunConfig.make(model="mlp", schedule="constant", batch_size=16, engine="sim")
# The update rules, as flags and by hand, and how close a hand-written loop
# comes to the engine's: the loop sums the loss in another order than the
# engine's weighted shares, float noise that Adam's g / (sqrt(v) + eps)
# amplifies where gradients cancel to ~1e-8 (with eps 1e-8, ~4e-6 on one
# weight after 5 steps; with eps 1e-6, ~4e-7: the synchronous tests' atol).
FLAGS = {"momentum": dict(optimizer="sgd", lr=0.05, momentum=0.9),
         "adam": dict(optimizer="adam", lr=1e-3, opt_args='{"eps": 1e-6}')}
RULES = {"momentum": optax.sgd(0.05, momentum=0.9), "adam": optax.adam(1e-3, eps=1e-6)}
CLOSE = {"momentum": dict(rtol=1e-5, atol=1e-7), "adam": dict(rtol=1e-5, atol=1e-6)}
KEY = 0
# DiLoCo's one worker takes the sequential loop's steps when its outer step
# makes the worker's model theta (outer SGD at lr 1 without momentum; its
# default Nesterov step extrapolates past it), every step, with the inner
# optimizer's state kept across outer steps.
ONE_WORKER = {"diloco": dict(inner_steps=1, outer_optimizer="sgd", outer_lr=1.0,
                             outer_momentum=0.0)}


def names(family: type) -> list[str]:
  """The registered algorithms of `family`."""
  return [name for name in ALGORITHMS if ALGORITHMS.get(name).family is family]


def built_in(name: str) -> bool:
  """Whether the package defines the algorithm (not a script or a plugin)."""
  return ALGORITHMS.get(name).build.__module__.startswith("jaxdl.")


def cases(family: type, default: set, optimizers: bool = False, only=lambda name: True) -> list:
  """The parametrization over `family`'s algorithms (`only` those that it
  allows; by optimizer, each name with each of RULES): the cases in
  `default` run by default, a representative few; the others with the slow
  ones."""
  chosen = [name for name in names(family) if only(name)]
  every = ([(name, optimizer) for name in chosen for optimizer in sorted(RULES)]
           if optimizers else chosen)
  return marks.default_only(every, default)


def test_every_registered_algorithm_has_a_family_checked_here():
  assert all(ALGORITHMS.get(name).family in FAMILIES for name in ALGORITHMS)
  assert sorted(n for family in FAMILIES for n in names(family)) == sorted(ALGORITHMS)


def _replay(tmp_path, name: str, events: list[Event], workers: int, **flat) -> Setup:
  """Everything a run of `name` builds, its sim engine replaying `events`
  (written as a trace file in `tmp_path`) for as many steps as they hold."""
  max_workers = ALGORITHMS.get(name).max_workers
  if max_workers is not None and workers > max_workers:
    pytest.skip(f"{name} runs at most {max_workers} workers; the check needs {workers}")
  path = tmp_path / f"trace-{len(list(tmp_path.iterdir()))}.jsonl"
  write_trace(path, events)
  done = sum(workers if e.kind == "step" else e.kind in ("apply", "local") for e in events)
  return setup(CONFIG.replace(algorithm=name, workers=workers, replay=str(path),
                              steps=done // workers, **flat))


def _sequential(run: Setup, rule: optax.GradientTransformation, steps: int):
  """The hand-written optax loop: one model from the same key, step t on
  worker 0's batch t, the gradient of the batch's mean loss."""
  model = zoo_model(run)

  def loss(params, model_state, images, labels):
    logits, model_state = model.apply(params, model_state, images, True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), model_state

  @jax.jit
  def step(params, model_state, opt_state, images, labels):
    grads, model_state = jax.grad(loss, has_aux=True)(params, model_state, images, labels)
    updates, opt_state = rule.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), model_state, opt_state

  params, model_state = model.init(jax.random.key(KEY))
  opt_state = rule.init(params)
  for t in range(steps):
    params, model_state, opt_state = step(params, model_state, opt_state,
                                          *run.streams.batch(0, t).values())
  return jax.device_get(params)


def _differs(a, b) -> bool:
  """Whether two trees of the same structure differ anywhere."""
  return any(not np.array_equal(x, y) for x, y in
             zip(jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b)),
                 strict=True))


# Collective ------------------------------------------------------------------


@pytest.mark.parametrize("name,optimizer", cases(
    Collective, {("ar_sgd", "adam"), ("ar_sgd", "momentum"), ("bsp", "momentum")}, True))
def test_collective_one_worker_is_the_sequential_optax_loop(tmp_path, name, optimizer):
  steps = 5
  events = [Event(float(t), "step", -1, t) for t in range(steps)]
  run = _replay(tmp_path, name, events, 1, **FLAGS[optimizer], **ONE_WORKER.get(name, {}))
  state, _ = train(run.engine, steps, key=KEY)
  chex.assert_trees_all_close(run.engine.evaluated(state)[0],
                              _sequential(run, RULES[optimizer], steps), **CLOSE[optimizer])


# Centralized -----------------------------------------------------------------


def _zero_delay(iterations: int) -> list[Event]:
  """One worker: pull version c, apply it (version c + 1), and so on; the
  transfer and compute times are not zero, as in a run."""
  events = []
  for c in range(iterations):
    events += [Event(2.0 * c, "pull", 0, c, duration=0.25, version=c),
               Event(2.0 * c + 1.0, "apply", 0, c, duration=0.75, version=c + 1)]
  return events


# (the package's parameter servers apply the run's optax rule, which delay
# compensation leaves as it is at zero delay; a script's or a plugin's server
# may have a rule of its own, as the README's asp_clip does)
@pytest.mark.parametrize("name,optimizer", cases(
    Centralized, {("asp", "momentum"), ("ssp", "momentum"), ("dc_asgd", "momentum")}, True,
    only=built_in))
def test_centralized_one_worker_without_delay_is_the_sequential_optax_loop(
    tmp_path, name, optimizer):
  steps = 5
  run = _replay(tmp_path, name, _zero_delay(steps), 1, **FLAGS[optimizer])
  state, _ = train(run.engine, steps, key=KEY)
  chex.assert_trees_all_close(run.engine.evaluated(state)[0],
                              _sequential(run, RULES[optimizer], steps), **CLOSE[optimizer])
  assert int(state.server.version) == steps


@pytest.mark.parametrize("name", cases(Centralized, {"asp", "ssp"}))
def test_centralized_server_version_counts_the_applies(tmp_path, name):
  # Two workers, stale: both pull version 0, and each gradient lands on a
  # server that the other's has moved.
  events = [Event(0, "pull", 0, 0), Event(0, "pull", 1, 0),
            Event(1, "apply", 0, 0), Event(1, "pull", 0, 1),
            Event(2, "apply", 1, 0), Event(2, "pull", 1, 1),
            Event(3, "apply", 0, 1), Event(4, "apply", 1, 1)]
  run = _replay(tmp_path, name, events, 2)
  state = run.engine.init(jax.random.key(KEY))
  assert int(state.server.version) == 0
  for step in range(2):
    state, _ = run.engine.step(state, step)
    assert int(state.server.version) == 2 * (step + 1)


# Elastic ---------------------------------------------------------------------


@pytest.mark.parametrize("name", names(Elastic))
def test_elastic_local_steps_leave_the_center_where_it_started(tmp_path, name):
  events = [Event(float(c), "local", w, c) for c in range(3) for w in range(2)]
  run = _replay(tmp_path, name, events, 2)
  initial = run.engine.init(jax.random.key(KEY))
  state, _ = train(run.engine, 3, key=KEY)
  chex.assert_trees_all_equal(run.engine.evaluated(state)[0], run.engine.evaluated(initial)[0])
  assert _differs(state.workers, initial.workers)  # the workers did move


@pytest.mark.parametrize("name", names(Elastic))
def test_elastic_exchange_conserves_center_plus_worker(tmp_path, name):
  # Step 0: both workers step; step 1: worker 0 exchanges with the center,
  # and worker 1's local steps (which touch neither) end the step.
  events = [Event(0, "local", 0, 0), Event(0, "local", 1, 0),
            Event(1, "exchange", 0, 0),
            Event(1, "local", 1, 1), Event(2, "local", 1, 2)]
  run = _replay(tmp_path, name, events, 2)

  def center_and_sum(state):
    """(the center, center + worker 0), as host arrays (the engine may donate
    the state's buffers to its next step)."""
    center, _ = run.engine.evaluated(state)
    worker = jax.tree.map(lambda x: x[0], jax.device_get(state.workers.params))
    return center, jax.tree.map(lambda c, x: c + x, center, worker)

  state, _ = train(run.engine, 1, key=KEY)
  center, total = center_and_sum(state)
  state, _ = train(run.engine, 1, state=state, start=1)
  center_after, total_after = center_and_sum(state)
  assert _differs(center_after, center)  # the exchange did move the center
  chex.assert_trees_all_close(total_after, total, rtol=1e-5, atol=1e-7)


# Gossip ----------------------------------------------------------------------


@pytest.mark.parametrize("name", names(Gossip))
def test_gossip_leaves_the_evaluated_model_unchanged(tmp_path, name):
  # The same local steps, with and without two gossips between workers 0 and
  # 1 (after their steps, before worker 2's, which ends the step).
  local = [Event(0, "local", w, 0) for w in range(3)]
  gossips = [Event(0.5, "send", 0, 0, peer=1), Event(0.55, "gossip", 0, 0, peer=1),
             Event(0.6, "send", 1, 0, peer=0), Event(0.65, "gossip", 1, 0, peer=0)]
  plain = _replay(tmp_path, name, local, 3)
  gossiped = _replay(tmp_path, name, local[:2] + gossips + local[2:], 3)
  a, _ = train(plain.engine, 1, key=KEY)
  b, _ = train(gossiped.engine, 1, key=KEY)
  assert _differs(a.workers, b.workers)  # the gossips did change the workers
  chex.assert_trees_all_close(gossiped.engine.evaluated(b), plain.engine.evaluated(a),
                              rtol=1e-5, atol=1e-7)
  if hasattr(b.workers, "weight"):  # gossip weights (GoSGD's a_m) sum to 1
    weights = np.asarray(b.workers.weight)
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-6)
    assert len(set(weights.tolist())) > 1


@pytest.mark.parametrize("name", names(Gossip))
def test_a_gossip_message_carries_what_was_sent(tmp_path, name):
  # Worker 0 sends after its step 0; its step 1 happens before the message
  # arrives at worker 1 (in flight) or after it: the same message either way.
  first = [Event(0, "local", w, 0) for w in range(3)]
  send = Event(0.5, "send", 0, 0, peer=1)
  arrive = Event(0.7, "gossip", 0, 0, peer=1)
  step0, rest = Event(0.6, "local", 0, 1), [Event(0.8, "local", w, 1) for w in (1, 2)]
  in_flight = _replay(tmp_path, name, first + [send, step0, arrive] + rest, 3)
  after = _replay(tmp_path, name, first + [send, arrive, step0] + rest, 3)
  resent = [Event(0.65, "send", 0, 1, peer=1), Event(0.7, "gossip", 0, 1, peer=1)]
  later = _replay(tmp_path, name, first + [step0] + resent + rest, 3)
  a, _ = train(in_flight.engine, 2, key=KEY)
  b, _ = train(after.engine, 2, key=KEY)
  c, _ = train(later.engine, 2, key=KEY)
  chex.assert_trees_all_equal(a.workers, b.workers)
  assert _differs(a.workers, c.workers)  # a message sent after step 1 is another one


# Decentralized ---------------------------------------------------------------


@pytest.mark.parametrize("name", names(Decentralized))
def test_decentralized_averaging_leaves_the_evaluated_model_unchanged(tmp_path, name):
  # The same iterations, with and without an averaging of workers 0 and 1
  # (after their updates, before worker 2's, which ends the step).
  pulls = [Event(0, "pull", w, 0) for w in range(3)]
  applies = [Event(1 + w, "apply", w, 0) for w in range(3)]
  average = [Event(2.5, "average", 0, 0, peer=1)]
  plain = _replay(tmp_path, name, pulls + applies, 3)
  averaged = _replay(tmp_path, name, pulls + applies[:2] + average + applies[2:], 3)
  a, _ = train(plain.engine, 1, key=KEY)
  b, _ = train(averaged.engine, 1, key=KEY)
  assert _differs(a.workers, b.workers)  # the averaging did change the workers
  chex.assert_trees_all_close(averaged.engine.evaluated(b), plain.engine.evaluated(a),
                              rtol=1e-5, atol=1e-7)
