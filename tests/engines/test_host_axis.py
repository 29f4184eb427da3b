"""Per-worker programs whose collectives go through the host
(jaxdl.engines.host_axis): each worker compiles its own step for its own
batch shape, and the algorithm's own step gives what the sim engine's
vmapped workers give."""
import threading

import chex
import jax
import numpy as np
import pytest

from jaxdl.algorithms import Batch
from jaxdl.config import RunConfig
from jaxdl.engines.events import initial_state, stack, take
from jaxdl.engines.host_axis import Exchange, HostAxis
from tests import marks
from tests.helpers import make_engine, train

SIZES = (8, 12, 4)
STEPS = 6


def per_worker_programs(sim, reduce: str = "host"):
  """The sim engine's algorithm run as one thread per worker, each with its
  own compiled step (its own batch shape) and a HostAxis: the workers'
  evaluated model after STEPS steps, and each worker's seconds inside
  collectives per step."""
  algorithm, streams, m = sim.algorithm, sim.streams, sim.num_workers
  total = sum(streams.batch_sizes)
  exchange = Exchange(m, reduce)
  workers = initial_state(algorithm, jax.random.key(0), m)[1]
  final, errors = [None] * m, []

  def work(w):
    try:
      axis = HostAxis(m, w, exchange)
      step = jax.jit(lambda state, batch, t: algorithm.step(state, batch, t, axis.bind(t)))
      state = take(workers, w)
      for t in range(STEPS):
        fields = streams.batch(w, t)
        b = len(next(iter(fields.values())))
        batch = Batch(fields, np.full(b, np.float32(1.0 / total)), np.array([w, t], np.int32))
        state, _ = step(state, batch, np.int32(t))
      final[w] = jax.device_get(state)
    except Exception as e:  # noqa: BLE001 - reported by the test
      errors.append(e)
      raise

  threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(m)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not errors and all(s is not None for s in final), errors
  return jax.device_get(algorithm.evaluated(jax.device_put(stack(final)))), exchange.inside


@pytest.mark.parametrize("algorithm, model, extra", [
    marks.slow("ar_sgd", "mlp", {}),
    ("bsp", "mlp", {}),
    marks.slow("local_sgd", "mlp", {"communication_period": 2}),
    marks.slow("diloco", "mlp", {"inner_steps": 2}),
    # batch statistics over all workers' batches, psum'd inside the gradient
    # (sgd: adam's normalization would magnify float rounding in ~0 gradients)
    marks.slow("ar_sgd", "cnn_bn", {"sync_bn": True, "optimizer": "sgd", "lr": 0.05}),
])
def test_each_worker_its_own_program_equals_the_sim_engine(algorithm, model, extra):
  config = RunConfig.make(algorithm=algorithm, engine="sim", workers=3, batch_sizes=SIZES,
                          model=model, schedule="constant", **{"optimizer": "adam", "lr": 1e-3,
                                                               **extra})
  sim = make_engine(config, total_steps=STEPS)
  expected = sim.evaluated(train(sim, STEPS)[0])
  got, inside = per_worker_programs(sim)
  chex.assert_trees_all_close(got, expected, rtol=2e-5, atol=2e-6)
  # every step meets at the exchange; local SGD's and DiLoCo's only every 2nd
  # (the averaging, the outer step)
  meets = list(range(1, STEPS, 2) if algorithm in ("local_sgd", "diloco") else range(STEPS))
  assert all(sorted(steps) == meets for steps in inside)


def test_the_two_reductions_give_the_same_bits():
  config = RunConfig.make(algorithm="ar_sgd", engine="sim", workers=3, batch_sizes=SIZES,
                          model="mlp", schedule="constant", optimizer="sgd", lr=0.05)
  sim = make_engine(config, total_steps=STEPS)
  host, _ = per_worker_programs(sim, "host")
  device, _ = per_worker_programs(sim, "device")
  chex.assert_trees_all_equal(host, device)
  with pytest.raises(ValueError, match="reduce 'gpu'"):
    Exchange(3, "gpu")
