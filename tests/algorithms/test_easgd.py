"""EASGD on the sim engine."""
import chex
import jax

from jaxdl.config import RunConfig
from tests.helpers import WorkerOfStreams, make_engine, make_setup, train

CONFIG = RunConfig.make(model="mlp", schedule="constant", lr=0.05, batch_size=16, workers=4,
                        momentum=0.0, algorithm="easgd", elasticity=0.0,
                        communication_period=2)


def test_easgd_without_elasticity_leaves_workers_independent():
  built = make_setup(CONFIG, total_steps=6)
  engine = built.engine
  state, _ = train(engine, 6)
  initial = engine.init(jax.random.key(0)).server.params
  # nothing ever reaches the center
  chex.assert_trees_all_equal(jax.device_get(state.server.params), jax.device_get(initial))
  for w in range(4):  # each worker is one-worker SGD on its own shard
    steps = sum(e.kind == "local" and e.worker == w for e in engine.trace())
    assert steps > 0
    sgd = make_engine(built.config.replace(algorithm="sgd", workers=1, steps=None),
                      streams=WorkerOfStreams(built.streams, w))
    alone = sgd.evaluated(train(sgd, steps)[0])[0]
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[w], state.workers.params), alone,
                                rtol=1e-5, atol=1e-6)


def test_a_worker_exchanges_after_every_period_of_local_steps():
  engine = make_setup(CONFIG.replace(communication_period=3), total_steps=12).engine
  events = engine.trace()
  for w in range(4):
    local = [e.iteration for e in events if e.kind == "local" and e.worker == w]
    exchanges = [e.iteration for e in events if e.kind == "exchange" and e.worker == w]
    assert exchanges and exchanges == [i for i in local if (i + 1) % 3 == 0][:len(exchanges)]
    assert len(exchanges) >= len(local) // 3 - 1  # the last may not have arrived
