"""DiLoCo: H inner steps per worker, then the averaged parameter delta as the
outer optimizer's gradient (Douillard et al. 2023)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.algorithms import TrainState, WorkerAxis, diloco
from jaxdl.cli import main
from jaxdl.config import RunConfig
from jaxdl.validation import validate
from tests.helpers import leaves, make_engine, train

# Unequal batches, so that the b_m / B weights matter.
PLAIN = dict(workers=4, batch_sizes=(8, 16, 8, 4), model="mlp", schedule="constant",
             optimizer="sgd", lr=0.1, momentum=0.0)


def test_one_inner_step_of_plain_sgd_and_outer_lr_one_is_bsp():
  config = RunConfig.make(algorithm="diloco", inner_steps=1, outer_lr=1.0, outer_momentum=0.0,
                          **PLAIN)
  ours, bsp = make_engine(config), make_engine(config.replace(algorithm="bsp"))
  params = ours.evaluated(train(ours, 10)[0])[0]
  expected = bsp.evaluated(train(bsp, 10)[0])[0]
  # Not bit for bit: theta - (theta - sum_m (b_m/B) theta_m), with each
  # worker's gradient divided by its share and multiplied back, rounds
  # otherwise than bsp's one update of the summed gradient: measured 6e-8
  # after one step, 3.9e-7 after ten (parameters of magnitude up to 0.29).
  chex.assert_trees_all_close(params, expected, rtol=0, atol=5e-7)
  # and the outer rule matters: outer lr 0.5 halves every step
  half = make_engine(config.replace(outer_lr=0.5))
  distance = jax.tree.map(lambda a, b: jnp.abs(a - b).max(),
                          half.evaluated(train(half, 10)[0])[0], expected)
  assert max(jax.tree.leaves(distance)) > 1e-3


def _outer_steps(outer_name, outer_lr, outer_momentum, theta, workers, shares, steps=2,
                 compress=None):
  """`steps` outer steps of len(shares) vmapped workers; worker params
  `workers[s]` at step s (`compress`: a --compress value for their outer
  gradients)."""
  from jaxdl.algorithms import compression
  settings = diloco.DiLoCoSettings(outer_optimizer=outer_name, outer_lr=outer_lr,
                                   outer_momentum=outer_momentum)
  outer = settings.outer()
  axis = WorkerAxis(len(shares), local="w")
  thetas = jnp.stack([jnp.asarray(theta, jnp.float32)] * len(shares))
  transform = compression.compression(compress or "none")
  state = diloco.DiLoCoState(TrainState(thetas, (), ()), thetas, jax.vmap(outer.init)(thetas),
                             jax.vmap(transform.init)(thetas))
  send = transform.update if compress else None
  step = jax.vmap(lambda s, share: diloco.outer_step(outer, s, share, axis, send),
                  axis_name="w")
  history = []
  for models in workers[:steps]:
    inner = TrainState(jnp.asarray(models, jnp.float32), (), ())
    state = step(state._replace(inner=inner), jnp.asarray(shares, jnp.float32))
    history.append(state)
  return history


THETA = [1.0, 2.0]
WORKERS = [[[0.5, 1.0], [0.0, 3.0]],   # the workers' models after the first H steps
           [[0.0, 0.0], [-1.0, 4.0]]]  # ... and after the second
SHARES = [0.25, 0.75]


def test_compressed_outer_gradients_with_error_feedback_by_hand():
  """--compress topk:0.5 (one coordinate of two), outer SGD at lr 1: each
  worker sends the larger coordinate of theta - theta_m + e_m and keeps the
  other in e_m; Delta is the sent messages' weighted sum."""
  workers = [[[0.5, 1.0], [0.0, 3.5]], [[0.0, 0.0], [-1.0, 4.0]]]
  first, second = _outer_steps("sgd", 1.0, 0.0, THETA, workers, SHARES, compress="topk:0.5")
  # step 1: theta - theta_m = [0.5, 1], [1, -1.5]: sent [0, 1], [0, -1.5]; e = [0.5, 0],
  # [1, 0]; Delta = 0.25 [0, 1] + 0.75 [0, -1.5] = [0, -0.875]
  np.testing.assert_allclose(first.outer_params[0], [1.0, 2.875], rtol=1e-6)
  np.testing.assert_allclose(first.outbox.residual, [[0.5, 0.0], [1.0, 0.0]])
  # step 2: theta - theta_m + e_m = [1.5, 2.875], [3, -1.125]: sent [0, 2.875], [3, 0];
  # Delta = [2.25, 0.71875]
  np.testing.assert_allclose(second.outer_params[0], [-1.25, 2.15625], rtol=1e-6)
  np.testing.assert_allclose(second.outbox.residual, [[1.5, 0.0], [0.0, -1.125]])


def test_the_outer_step_is_nesterov_on_the_weighted_delta_by_hand():
  first, second = _outer_steps("nesterov", 0.7, 0.9, THETA, WORKERS, SHARES)
  # step 1: mean = 0.25 [0.5, 1] + 0.75 [0, 3] = [0.125, 2.5]; Delta = [0.875, -0.5];
  # m = Delta; theta <- theta - 0.7 (Delta + 0.9 m) = theta - 1.33 Delta
  np.testing.assert_allclose(first.outer_params[0], [-0.16375, 2.665], rtol=1e-6)
  # step 2: mean = 0.25 [0, 0] + 0.75 [-1, 4] = [-0.75, 3]; Delta = theta - mean =
  # [0.58625, -0.335]; m = Delta + 0.9 [0.875, -0.5] = [1.37375, -0.785];
  # theta <- theta - 0.7 (Delta + 0.9 m) = theta - 0.7 [1.822625, -1.0415]
  np.testing.assert_allclose(second.outer_params[0], [-1.4395875, 3.39405], rtol=1e-6)
  # every worker restarts from theta
  np.testing.assert_array_equal(second.inner.params, second.outer_params)


@pytest.mark.parametrize("name,reference", [
    ("nesterov", optax.sgd(0.7, momentum=0.9, nesterov=True)),
    ("sgd", optax.sgd(0.7, momentum=0.9)),
    ("adam", optax.adam(0.7, b1=0.9)),
])
def test_the_outer_optimizer_is_optax_on_the_delta(name, reference):
  history = _outer_steps(name, 0.7, 0.9, THETA, WORKERS, SHARES)
  theta, opt_state = jnp.asarray(THETA), reference.init(jnp.asarray(THETA))
  for models, state in zip(WORKERS, history):
    delta = theta - (SHARES[0] * jnp.asarray(models[0]) + SHARES[1] * jnp.asarray(models[1]))
    updates, opt_state = reference.update(delta, opt_state, theta)
    theta = optax.apply_updates(theta, updates)
    np.testing.assert_allclose(state.outer_params[0], theta, rtol=1e-6)
    np.testing.assert_allclose(state.outer_params[1], theta, rtol=1e-6)


def engine_shares(num_workers: int, batch_size: int = 16) -> list:
  """Each worker's b_m / B as a step computes it: the float32 sum of its
  examples' weights 1 / B (not 1 / M exactly: 0.20000003 at 5 workers)."""
  weight = np.float32(1) / np.float32(num_workers * batch_size)
  return [float(jnp.sum(jnp.full(batch_size, weight)))] * num_workers


@pytest.mark.parametrize("outer_name", list(diloco.OUTER_OPTIMIZERS))
@pytest.mark.parametrize("num_workers", [3, 5, 6, 7])
def test_a_coordinate_that_no_worker_moved_stays_bit_for_bit(num_workers, outer_name):
  """Delta is exactly 0 where every worker left theta as it was, whatever the
  outer optimizer. (theta minus the weighted sum of the models was an ulp
  off there for about 30% of values at 3 workers, which adam turned into a
  step of up to 0.8 x the outer lr.)"""
  rng = np.random.default_rng(num_workers)
  theta = rng.standard_normal(4096).astype(np.float32)
  untouched = rng.random(4096) < 0.5
  workers = [np.where(untouched, theta, rng.standard_normal((num_workers, 4096)))
             for _ in range(3)]  # three outer steps' models: theta moved elsewhere
  history = _outer_steps(outer_name, 0.7, 0.9, theta, workers, engine_shares(num_workers),
                         steps=3)
  for state in history:
    for leaf in (state.outer_params, state.inner.params):
      np.testing.assert_array_equal(np.asarray(leaf)[:, untouched],
                                    np.broadcast_to(theta[untouched], (num_workers,
                                                                       untouched.sum())))
  assert (np.asarray(history[-1].outer_params)[0, ~untouched] != theta[~untouched]).all()


def test_the_outer_state_is_the_same_on_every_worker_and_inner_states_are_their_own():
  config = RunConfig.make(algorithm="diloco", inner_steps=3, workers=4, model="mlp",
                          batch_sizes=(8, 16, 8, 4), schedule="constant")
  engine = make_engine(config)
  state, _ = train(engine, 2)
  workers = engine.worker_states(state)
  inner = leaves(workers.inner.params)[0]
  assert not np.allclose(inner[0], inner[1])  # two inner steps: the models differ
  state, _ = train(engine, 4, state=state, start=2)  # outer steps after steps 3 and 6
  workers = engine.worker_states(state)
  for leaf in leaves((workers.outer_params, workers.outer_opt_state)):
    for m in range(1, 4):
      np.testing.assert_array_equal(leaf[m], leaf[0])
  for theta, model in zip(leaves(workers.outer_params), leaves(workers.inner.params)):
    np.testing.assert_array_equal(model, theta)  # every worker restarted from theta
  # the outer momentum moved: not all zeros
  assert any(np.abs(leaf).max() > 0 for leaf in leaves(workers.outer_opt_state))
  # each worker keeps its own inner AdamW moments across the outer steps
  moments = leaves(workers.inner.opt_state[0].mu)[0]
  assert np.abs(moments[0]).max() > 0 and not np.allclose(moments[0], moments[1])
  # the evaluated model is theta
  params, _ = engine.evaluated(state)
  chex.assert_trees_all_equal(params, jax.tree.map(lambda x: x[0], workers.outer_params))


def test_the_papers_recipe_unless_the_user_sets_the_optimizer():
  recipe = validate(RunConfig.make(algorithm="diloco", workers=4)).optim
  assert (recipe.optimizer, recipe.lr, recipe.weight_decay) == ("adamw", 3e-3, 0.1)
  settings = RunConfig.make(algorithm="diloco").settings()
  assert (settings.outer_optimizer, settings.outer_lr, settings.outer_momentum) == (
      "nesterov", 0.7, 0.9)
  # what the user sets is kept; another optimizer gets the run-wide defaults
  assert validate(RunConfig.make(algorithm="diloco", workers=4, lr=0.01)).optim.lr == 0.01
  sgd = validate(RunConfig.make(algorithm="diloco", workers=4, optimizer="sgd")).optim
  assert (sgd.optimizer, sgd.lr, sgd.weight_decay) == ("sgd", 0.05, 0.0)
  adamw = validate(RunConfig.make(algorithm="diloco", workers=4, optimizer="adamw")).optim
  assert (adamw.lr, adamw.weight_decay) == (3e-3, 0.1)
  # the other algorithms keep sgd
  assert validate(RunConfig.make(algorithm="local_sgd", workers=4)).optim.optimizer == "sgd"


RUN = ["run", "--algorithm", "diloco", "--workers", "2", "--model", "mlp", "--steps", "2",
       "--no-progress"]


@pytest.mark.parametrize("args,allowed", [
    (["--inner-steps", "0"], "an integer >= 1"),
    (["--outer-optimizer", "adamw"], "one of nesterov, sgd, adam"),
    (["--outer-lr", "-0.1"], "a number > 0"),
    (["--outer-lr", "0"], "a number > 0"),
    (["--outer-momentum", "1"], "a number in [0, 1)"),
    (["--outer-momentum", "-0.5"], "a number in [0, 1)"),
])
def test_bad_settings_are_one_line_exit_2(tmp_path, capsys, args, allowed):
  out = tmp_path / "run"
  assert main([*RUN, "--out", str(out), *args]) == 2
  captured = capsys.readouterr()
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1 and f"{args[0]}=" in lines[0]
  assert f"is not valid: {allowed}" in lines[0]
  assert "Traceback" not in captured.err + captured.out
  assert not out.exists()

