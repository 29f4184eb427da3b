"""A parameter server sharded into shards (jaxdl.engines.shards)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.algorithms import asp
from jaxdl.build import prepare
from jaxdl.config import RunConfig
from jaxdl.engines.events import initial_state, one_batch, take
from jaxdl.engines.shards import ShardLayout, leaf_dependencies, sharded
from jaxdl.errors import ConfigError
from tests import marks


def _states(setup):
  """(server, worker 0 after a pull and its gradient): every leaf filled."""
  algorithm = setup.algorithm
  server, workers = initial_state(algorithm, jax.random.key(0), 3)
  worker = algorithm.pull(server, take(workers, 0), jnp.float32(0.0))
  worker, _ = algorithm.compute(worker, one_batch(setup.streams, 0, 0))
  # a server some updates on, so that no optimizer state is still zero
  for _ in range(3):
    server, worker = algorithm.apply(server, worker, jnp.float32(0.25))
  return server, worker


def _paths(tree) -> list[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


@pytest.mark.parametrize("name,optimizer,exact", [
    marks.slow("asp", "sgd", True), ("dc_asgd", "sgd", True), marks.slow("lc_asgd", "sgd", True),
    # adam's update fused across all leaves or a shard's alone rounds its
    # bias correction's products in another order: 1 ulp of the parameters
    marks.slow("asp", "adam", False)])
def test_shards_compute_what_one_server_would(name, optimizer, exact):
  setup = prepare(RunConfig.make(algorithm=name, model="mlp", workers=3, optimizer=optimizer))
  algorithm = setup.algorithm
  server, worker = _states(setup)
  layout, shards, pull, apply = sharded(algorithm, server, worker, 2)
  n = len(jax.tree.leaves((server, worker)))
  shared = set(layout.shared)
  own = [set(s) - shared for s in layout.shards]
  assert own[0] and own[1] and not own[0] & own[1]  # each shard its own leaves
  assert own[0] | own[1] | shared == set(range(n))  # and every leaf somewhere
  seconds = jnp.float32(0.5)
  for whole, split in ((jax.jit(algorithm.apply)(server, worker, seconds),
                        apply(server, worker, seconds)),
                       (jax.jit(algorithm.pull)(server, worker, seconds),
                        pull(server, worker, seconds))):
    assert jax.tree.structure(whole) == jax.tree.structure(split)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(split)):
      if exact:
        np.testing.assert_array_equal(a, b)
      else:
        np.testing.assert_allclose(a, b, rtol=2 ** -22, atol=2 ** -26)


def test_counters_are_kept_by_every_shard_and_balance_is_by_bytes():
  setup = prepare(RunConfig.make(algorithm="asp", model="mlp", workers=3, optimizer="adam"))
  server, worker = _states(setup)
  layout = ShardLayout.of(setup.algorithm, server, worker, 2)
  paths = _paths((server, worker))
  # adam's step count, read by every leaf's update, and the learning-rate
  # schedule's; not the server's version, which no other leaf reads
  assert [paths[i] for i in layout.shared] == ["[0].opt_state[0].count",
                                                  "[0].opt_state[1].count"]
  leaves = jax.tree.leaves((server, worker))
  loads = [sum(leaves[i].nbytes for i in s) for s in layout.shards]
  largest = max(leaves[i].nbytes for i in range(len(leaves)))
  # the greedy split's bound: the largest part, a kernel's parameters, adam's
  # two moments, a worker's pulled copy and gradient
  assert abs(loads[0] - loads[1]) <= 5 * largest and min(loads) > 0


def test_an_update_that_mixes_every_leaf_cannot_be_split():
  setup = prepare(RunConfig.make(algorithm="asp", model="mlp", workers=2))
  clipped = asp.parameter_server(
      setup.problem, 2, optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1)))
  server, workers = initial_state(clipped, jax.random.key(0), 2)
  with pytest.raises(ConfigError) as error:
    ShardLayout.of(clipped, server, take(workers, 0), 2)
  assert str(error.value) == (
      "--servers=2 is not valid: at most 1: this parameter server's update splits its leaves "
      "into 1 independent part(s) of more than 4096 elements (an optimizer that reads all of "
      "them, such as a global-norm clip, mixes them into one)")
  # the plain server's: one per layer's kernel of more than 4096 elements, 2
  # of the mlp's 3 (its biases and last kernel are small parts, spread among them)
  server, worker = _states(setup)
  assert len(ShardLayout.of(setup.algorithm, server, worker, 2).shards) == 2
  with pytest.raises(ConfigError, match="--servers=3 is not valid: at most 2"):
    ShardLayout.of(setup.algorithm, server, worker, 3)


def test_dependencies_are_read_inside_nested_calls():
  double = jax.jit(lambda x: (2 * x, x + 1))

  def fn(a, b, c):
    x, y = double(a)
    return x, b * c[0], y + c[1]

  deps = leaf_dependencies(fn, (jnp.ones(3), jnp.ones(2), (jnp.ones(()), jnp.ones(()))))
  assert deps == [{0}, {1, 2}, {0, 3}]
