"""BSP: M workers x b_m equal one worker x sum(b_m), with a sharded server."""
import jax
import pytest

from jaxdl.config import RunConfig
from jaxdl.validation import validate
from jaxdl.errors import ConfigError
from tests import marks
from tests.helpers import assert_m_workers_equal_one


@pytest.mark.parametrize("optimizer", ["momentum", marks.slow("adam", id="adam")])
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
  with pytest.raises(ConfigError) as error:
    validate(RunConfig.make(algorithm="bsp", workers=4, optimizer="lamb"))
  assert str(error.value) == ("--optimizer='lamb' is not valid: an elementwise optimizer for "
                              "bsp, whose server updates flat slices (use --algorithm ar_sgd "
                              "for layer-wise ones)")


def test_adamw_with_weight_decay_reads_the_servers_own_slice():
  # decoupled weight decay needs the parameters the server updates: its shard
  assert_m_workers_equal_one("bsp", [8, 8, 8, 8], "adamw", steps=5)


# With the slow cases: by default synchronized batch norm over padded
# batches is checked on ar_sgd (test_ar_sgd.py).
@pytest.mark.slow
def test_synchronized_batch_norm_on_bsp_is_one_worker_on_the_whole_batch():
  assert_m_workers_equal_one("bsp", [4, 4], "momentum", model="cnn_bn", steps=1, sync_bn=True,
                             atol=2e-6)


def test_each_worker_holds_the_smallest_equal_shard():
  import math

  from tests.helpers import make_engine
  engine = make_engine(RunConfig.make(algorithm="bsp", workers=3, model="mlp"))
  state = engine.worker_states(engine.init(jax.random.key(0)))
  params = 64 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10  # the mlp on 8x8 digits
  assert state.server_params.shape == (3, 1, math.ceil(params / 3))


def test_the_server_checks_refuse_by_name():
  from jaxdl.algorithms import bsp
  for servers in (0, 3, 8):
    with pytest.raises(ConfigError) as error:
      bsp.check(None, RunConfig.make(algorithm="bsp", workers=4, servers=servers))
    assert str(error.value) == f"--servers={servers} is not valid: a divisor of --workers 4"


def test_bsp_is_scheduled_at_a_server():
  from jaxdl.cluster import synchronous
  from tests.helpers import make_setup
  engine = make_setup(RunConfig.make(algorithm="bsp", workers=4, model="mlp", engine="sim",
                                     compute_time=1e-3, jitter=0.2), total_steps=5).engine
  assert engine.events == list(synchronous(engine.cost, 5, "ps"))
