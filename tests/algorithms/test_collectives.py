"""The worker axis: collectives over D devices x L workers per device, by index."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxdl.algorithms.collectives import WorkerAxis


@pytest.mark.parametrize("devices,local", [(4, 2), (8, 1), (1, 4)])
def test_collectives_follow_the_worker_index(devices, local):
  """Worker w = d * L + l holds w in its first leaf: the gather stacks the
  workers in that order, the scatter leaves worker w the w-th block of the sum."""
  m = devices * local
  axis = WorkerAxis(m, device="d" if devices > 1 else None, local="l" if local > 1 else None,
                    local_size=local)

  def worker(x):  # x: (3,), this worker's index everywhere
    block = jnp.arange(2 * m, dtype=jnp.float32) + x[0]
    return axis.all_gather(x), axis.psum_scatter(block), axis.psum(x)

  def device(x):  # x: (1, L, 3)
    per_worker = jax.vmap(worker, axis_name="l") if local > 1 else (lambda v: jax.tree.map(
        lambda y: y[None], worker(v[0])))
    return jax.tree.map(lambda y: y[None], per_worker(x[0]))

  ids = jnp.broadcast_to(jnp.arange(m, dtype=jnp.float32).reshape(devices, local, 1),
                         (devices, local, 3))
  if devices > 1:
    mesh = jax.make_mesh((devices,), ("d",), devices=jax.devices()[:devices])
    run = jax.shard_map(device, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False)
    ids = jax.device_put(ids, jax.sharding.NamedSharding(mesh, P("d")))
  else:
    run = device
  gathered, scattered, summed = jax.tree.map(
      lambda y: np.asarray(y).reshape(m, *y.shape[2:]), jax.jit(run)(ids))
  rows = np.repeat(np.arange(m, dtype=np.float32)[:, None], 3, 1)
  for w in range(m):  # every worker sees every worker, in index order
    np.testing.assert_array_equal(gathered[w], rows)
  total = m * np.arange(2 * m, dtype=np.float32) + rows[:, 0].sum()
  np.testing.assert_array_equal(scattered, total.reshape(m, 2))
  np.testing.assert_array_equal(summed, np.full((m, 3), rows[:, 0].sum()))
