"""Synchronous algorithms: M workers x b_m equal one worker x sum(b_m)."""
import numpy as np
import pytest

from jaxdl.config import RunConfig
from jaxdl.errors import ConfigError
from tests.helpers import ConcatenatedStreams, leaves, make_engine, train

OPTIMIZERS = {"momentum": dict(optimizer="sgd", lr=0.05, momentum=0.9),
              "adam": dict(optimizer="adam", lr=1e-3)}


def _equivalent(algorithm, sizes, optimizer, model="mlp", steps=20, atol=1e-6, **extra):
  config = RunConfig.make(algorithm=algorithm, workers=len(sizes), batch_sizes=tuple(sizes),
                          model=model, schedule="constant", **OPTIMIZERS[optimizer], **extra)
  many = make_engine(config)
  single = make_engine(config.replace(algorithm="sgd", workers=1, batch_sizes=None),
                       streams=ConcatenatedStreams(many.streams))
  a = many.evaluated(train(many, steps)[0])
  b = single.evaluated(train(single, steps)[0])
  for x, y in zip(leaves(a), leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=atol)
  return many


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("algorithm", ["bsp", "ar_sgd"])
def test_m_workers_equal_one_worker_on_the_concatenated_batch(algorithm, optimizer):
  engine = _equivalent(algorithm, [8, 8, 8, 8], optimizer)
  assert engine.mesh.devices.size == 4 and engine.axis.local_size == 1


@pytest.mark.parametrize("algorithm", ["bsp", "ar_sgd"])
def test_more_workers_than_devices_and_unequal_batches(algorithm):
  # 16 workers on 8 devices, two per device, unequal batches padded to 6.
  sizes = [6, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 2, 2, 3, 4]
  engine = _equivalent(algorithm, sizes, "adam", steps=10)
  assert engine.mesh.devices.size == 8 and engine.axis.local_size == 2


def test_bsp_with_server_shards_is_the_same_update():
  _equivalent("bsp", [8, 8, 8, 8], "momentum", servers=2, steps=5)


def test_padding_does_not_change_batch_norm_with_sync_bn():
  # vgg11_bn has batch norm everywhere: with synchronized statistics over the
  # workers and masked padding, the update equals one worker on the whole batch.
  # Batch-norm sums over workers add in another order. With the two-pass
  # variance that is float noise (parameters near zero within 3e-6 after 3
  # steps through 8 conv layers); the one-pass E[x^2] - E[x]^2 cancelled and
  # made it 1.2e-3 on some CPUs.
  _equivalent("ar_sgd", [3, 5, 8], "momentum", model="vgg11_bn", steps=3, sync_bn=True,
              atol=2e-5)


def test_local_sgd_with_period_one_and_plain_sgd_is_ar_sgd():
  base = dict(workers=4, model="mlp", schedule="constant", lr=0.1, momentum=0.0,
              communication_period=1)
  local = make_engine(RunConfig.make(algorithm="local_sgd", **base))
  ar = make_engine(RunConfig.make(algorithm="ar_sgd", **base))
  local_params = local.worker_states(train(local, 10)[0]).params
  ar_params = ar.worker_states(train(ar, 10)[0]).params
  for x, y in zip(leaves(local_params), leaves(ar_params)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=4e-6)


def test_local_sgd_workers_diverge_between_averagings_and_agree_after():
  config = RunConfig.make(algorithm="local_sgd", workers=4, model="mlp",
                          communication_period=3, schedule="constant")
  engine = make_engine(config)
  state, _ = train(engine, 2)
  w = leaves(engine.worker_states(state).params)[0]
  assert not np.allclose(w[0], w[1])  # two local steps: the replicas differ
  state, _ = train(engine, 3)
  for w in leaves(engine.worker_states(state).params):
    np.testing.assert_allclose(w[0], w[3], rtol=1e-6)  # averaged after step 3


def test_bsp_server_shards_must_divide_the_workers():
  from jaxdl.config import validate
  with pytest.raises(ConfigError, match="--servers=3"):
    validate(RunConfig.make(algorithm="bsp", workers=4, servers=3))
  with pytest.raises(ConfigError, match="--optimizer='lamb'.*ar_sgd"):
    validate(RunConfig.make(algorithm="bsp", workers=4, optimizer="lamb"))


def test_batch_sizes_from_worker_speeds():
  from jaxdl.config import batch_sizes
  config = RunConfig.make(algorithm="ar_sgd", workers=3, batch_size=32,
                          worker_speeds=(1.0, 1.5, 1.5))
  assert batch_sizes(config) == (24, 36, 36)
  with pytest.raises(ConfigError, match="--batch-sizes"):
    batch_sizes(config.replace(batch_sizes=(1, 2)))


@pytest.mark.parametrize("algorithm", ["bsp", "ar_sgd", "local_sgd"])
def test_sim_engine_matches_the_mesh_engine(algorithm):
  config = RunConfig.make(algorithm=algorithm, workers=4, batch_sizes=(8, 12, 8, 4),
                          model="mlp", schedule="constant", optimizer="adam", lr=1e-3,
                          communication_period=2)
  results = []
  for engine in ("mesh", "sim"):
    e = make_engine(config.replace(engine=engine), total_steps=10)
    results.append(leaves(e.evaluated(train(e, 10)[0])))
  for x, y in zip(*results):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=4e-6)
