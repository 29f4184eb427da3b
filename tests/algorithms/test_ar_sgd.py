"""AR-SGD: M workers x b_m equal one worker x sum(b_m)."""
import pytest

from jaxdl.config import RunConfig
from jaxdl.data import batch_sizes
from jaxdl.errors import ConfigError
from tests import marks
from tests.helpers import assert_m_workers_equal_one


@pytest.mark.parametrize("optimizer", ["momentum", marks.slow("adam", id="adam")])
def test_m_workers_equal_one_worker_on_the_concatenated_batch(optimizer):
  engine = assert_m_workers_equal_one("ar_sgd", [8, 8, 8, 8], optimizer)
  assert engine.mesh.devices.size == 4 and engine.axis.local_size == 1


# With the slow cases: by default two workers per device are checked on bsp
# (test_bsp.py), unequal padded batches below.
@pytest.mark.slow
def test_more_workers_than_devices_and_unequal_batches():
  # 16 workers on 8 devices, two per device, unequal batches padded to 6.
  sizes = [6, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 2, 2, 3, 4]
  engine = assert_m_workers_equal_one("ar_sgd", sizes, "adam", steps=10)
  assert engine.mesh.devices.size == 8 and engine.axis.local_size == 2


def test_padding_does_not_change_batch_norm_with_sync_bn():
  # cnn_bn has batch norm after each conv: with synchronized statistics over
  # the workers and masked padding (batches of 3 and 5 padded to 8), the
  # update equals one worker on the whole batch. Batch-norm sums over workers
  # add in another order: float noise, which batch norm on 8x8 images
  # amplifies over steps, so one step is compared. Padding counted in the
  # statistics would move the step's update itself. (Every layer of vgg11_bn
  # padded and synchronized: tests/models/test_layers.py.)
  assert_m_workers_equal_one("ar_sgd", [3, 5, 8], "momentum", model="cnn_bn", steps=1,
                             sync_bn=True, atol=2e-6)


def test_batch_sizes_from_worker_speeds():
  config = RunConfig.make(algorithm="ar_sgd", workers=3, batch_size=32,
                          worker_speeds=(1.0, 1.5, 1.5))
  assert batch_sizes(config) == (24, 36, 36)
  with pytest.raises(ConfigError, match="--batch-sizes"):
    batch_sizes(config.replace(batch_sizes=(1, 2)))


@pytest.mark.parametrize("sync_bn", [False, marks.slow(True, id="True")])
def test_batch_statistics_are_each_workers_own_unless_synchronized(sync_bn):
  """After a step on different batches, two workers' batch-norm statistics
  differ (each its own batch's), and with --sync-bn they are the same (all
  workers' batches together)."""
  import jax
  import numpy as np

  from jaxdl.config import RunConfig
  from tests.helpers import make_engine, train

  config = RunConfig.make(algorithm="ar_sgd", engine="sim", workers=2, batch_size=8,
                          model="cnn_bn", sync_bn=sync_bn, schedule="constant")
  engine = make_engine(config, total_steps=2)
  stats = jax.device_get(train(engine, 1)[0].workers.model_state)
  same = all(np.allclose(x[0], x[1]) for x in jax.tree.leaves(stats))
  assert same == sync_bn
