"""AR-SGD: M workers x b_m equal one worker x sum(b_m)."""
import pytest

from jaxdl.config import RunConfig, batch_sizes
from jaxdl.errors import ConfigError
from tests.helpers import assert_m_workers_equal_one


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_m_workers_equal_one_worker_on_the_concatenated_batch(optimizer):
  engine = assert_m_workers_equal_one("ar_sgd", [8, 8, 8, 8], optimizer)
  assert engine.mesh.devices.size == 4 and engine.axis.local_size == 1


def test_more_workers_than_devices_and_unequal_batches():
  # 16 workers on 8 devices, two per device, unequal batches padded to 6.
  sizes = [6, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 2, 2, 3, 4]
  engine = assert_m_workers_equal_one("ar_sgd", sizes, "adam", steps=10)
  assert engine.mesh.devices.size == 8 and engine.axis.local_size == 2


def test_padding_does_not_change_batch_norm_with_sync_bn():
  # vgg11_bn has batch norm everywhere: with synchronized statistics over the
  # workers and masked padding, the update equals one worker on the whole batch.
  # Batch-norm sums over workers add in another order. With the two-pass
  # variance that is float noise (parameters near zero within 3e-6 after 3
  # steps through 8 conv layers); the one-pass E[x^2] - E[x]^2 cancelled and
  # made it 1.2e-3 on some CPUs.
  assert_m_workers_equal_one("ar_sgd", [3, 5, 8], "momentum", model="vgg11_bn", steps=3,
                             sync_bn=True, atol=2e-5)


def test_batch_sizes_from_worker_speeds():
  config = RunConfig.make(algorithm="ar_sgd", workers=3, batch_size=32,
                          worker_speeds=(1.0, 1.5, 1.5))
  assert batch_sizes(config) == (24, 36, 36)
  with pytest.raises(ConfigError, match="--batch-sizes"):
    batch_sizes(config.replace(batch_sizes=(1, 2)))
