"""GoSGD on the sim engine: a gossip conserves the weights (those in flight
included) and the weighted model."""
import chex
import jax
import numpy as np
import optax

from jaxdl.algorithms import Problem, gosgd
from jaxdl.config import RunConfig
from jaxdl.engines.sim.plan import message_slots
from tests.helpers import make_setup, train

CONFIG = RunConfig.make(model="mlp", schedule="constant", lr=0.05, batch_size=16, workers=4,
                        momentum=0.0, algorithm="gosgd", gossip_probability=1.0)
PLAIN = Problem(task=None, optimizer=optax.sgd(0.1))  # no compression


def _take(workers, i):
  return jax.tree.map(lambda x: x[i], workers)


def _weighted_sum(sender, receiver):
  return jax.tree.map(lambda x, y: sender.weight * x + receiver.weight * y,
                      sender.params, receiver.params)


def test_gosgd_conserves_weight_and_the_weighted_model():
  engine = make_setup(CONFIG, total_steps=6).engine
  state, _ = train(engine, 6)
  weights = np.asarray(state.workers.weight)
  # The messages still in flight at the end carry the rest of the weight.
  events = engine.trace()
  slots, _ = message_slots(events)
  flying = {(e.worker, e.iteration): slots[i] for i, e in enumerate(events) if e.kind == "send"}
  for e in events:
    if e.kind == "gossip":
      del flying[e.worker, e.iteration]
  assert flying and len(flying) < sum(e.kind == "send" for e in events)
  in_flight = sum(float(state.server.weight[s]) for s in flying.values())
  assert abs(weights.sum() + in_flight - 1.0) < 1e-6 and len(set(weights.tolist())) > 1
  sender, receiver = _take(state.workers, 0), _take(state.workers, 1)
  before = _weighted_sum(sender, receiver)
  sender2, message = gosgd.send(PLAIN, sender, 1)
  receiver2 = gosgd.receive(PLAIN, receiver, message)
  chex.assert_trees_all_close(before, _weighted_sum(sender2, receiver2), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(sender2.weight + receiver2.weight,
                             sender.weight + receiver.weight, rtol=1e-6)


def _worker(params, stats, weight):
  return gosgd.GossipWorker({"w": np.float32(params)}, {"bn": np.float32(stats)}, (),
                            np.float32(weight))


def test_a_message_merges_parameters_and_statistics_by_weight():
  receiver = _worker(1.0, 10.0, 0.25)
  _, message = gosgd.send(PLAIN, _worker(3.0, 30.0, 0.5), 0)  # half of 0.5 travels
  merged = gosgd.receive(PLAIN, receiver, message)
  # (0.25 * x_r + 0.25 * x_m) / 0.5, for the parameters and the batch-norm state
  assert float(merged.params["w"]) == 2.0 and float(merged.model_state["bn"]) == 20.0
  assert float(merged.weight) == 0.5


def test_the_evaluated_model_is_the_weighted_mean_even_with_weight_in_flight():
  # weights 0.375 and 0.125 (0.5 is in flight): the normalized mean
  workers = gosgd.GossipWorker({"w": np.array([1.0, 5.0], np.float32)},
                               {"bn": np.array([2.0, 6.0], np.float32)}, (),
                               np.array([0.375, 0.125], np.float32))
  params, stats = gosgd.evaluated(workers)
  assert float(params["w"]) == 2.0 and float(stats["bn"]) == 3.0


def test_a_merge_keeps_what_both_models_agree_on_bit_for_bit():
  """Where the message's model equals the receiver's, the merge leaves the
  receiver's as it is, for the weights gossip gives 3 workers; elsewhere it
  is the weighted mean. ((a_k x + a_m x) / (a_k + a_m) was another value for
  30% of these x at a_k = 1/3, a_m = 1/6.)"""
  rng = np.random.default_rng(0)
  x = rng.standard_normal(4096).astype(np.float32)
  agree = rng.random(4096) < 0.5
  other = np.where(agree, x, rng.standard_normal(4096).astype(np.float32))
  third = np.float32(1) / np.float32(3)
  for a_k, a_m in [(third, third), (third / 4, third), (third + third / 4, third / 2)]:
    _, message = gosgd.send(PLAIN, _worker(other, other, a_m), 0)  # a_m / 2 travels
    merged = gosgd.receive(PLAIN, _worker(x, x, a_k), message)
    for leaf in (merged.params["w"], merged.model_state["bn"]):
      np.testing.assert_array_equal(np.asarray(leaf)[agree], x[agree])
      part = np.float64(a_m / 2) / (np.float64(a_k) + np.float64(a_m / 2))
      np.testing.assert_allclose(np.asarray(leaf), x + part * (other - np.float64(x)),
                                 rtol=1e-6, atol=1e-6)
