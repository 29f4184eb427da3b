"""BSP: M workers x b_m equal one worker x sum(b_m), with a sharded server."""
import pytest

from jaxdl.config import RunConfig, validate
from jaxdl.errors import ConfigError
from tests.helpers import assert_m_workers_equal_one


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_m_workers_equal_one_worker_on_the_concatenated_batch(optimizer):
  engine = assert_m_workers_equal_one("bsp", [8, 8, 8, 8], optimizer)
  assert engine.mesh.devices.size == 4 and engine.axis.local_size == 1


def test_more_workers_than_devices_and_unequal_batches():
  # 16 workers on 8 devices, two per device, unequal batches padded to 6.
  sizes = [6, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 2, 2, 3, 4]
  engine = assert_m_workers_equal_one("bsp", sizes, "adam", steps=10)
  assert engine.mesh.devices.size == 8 and engine.axis.local_size == 2


def test_bsp_with_server_shards_is_the_same_update():
  assert_m_workers_equal_one("bsp", [8, 8, 8, 8], "momentum", servers=2, steps=5)


def test_bsp_server_shards_must_divide_the_workers():
  with pytest.raises(ConfigError, match="--servers=3"):
    validate(RunConfig.make(algorithm="bsp", workers=4, servers=3))
  with pytest.raises(ConfigError, match="--optimizer='lamb'.*ar_sgd"):
    validate(RunConfig.make(algorithm="bsp", workers=4, optimizer="lamb"))
