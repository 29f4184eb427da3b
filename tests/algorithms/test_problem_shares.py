"""A script's unweighted task (its loss the batch's mean): a worker's
gradient and metrics count as its share b_m / B of the global batch in a
collective step, and as its own batch's mean when it works alone."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxdl
from jaxdl.algorithms import Batch, Problem, WorkerAxis


def _mean_loss(params, model_state, batch, key):
  del key
  per_example = (batch["x"] @ params["w"] - batch["y"]) ** 2
  return jnp.mean(per_example), (model_state, {"error": jnp.mean(jnp.abs(per_example))})


def test_an_unweighted_tasks_gradients_are_shares_and_alone_its_batch_mean():
  task = jaxdl.Task(init=lambda key: ({"w": jnp.asarray([0.5, -1.0, 2.0])}, {}),
                    loss=_mean_loss)
  problem = Problem(task, optax.sgd(0.1))
  params, model_state = task.init(jax.random.key(0))
  rng = np.random.default_rng(0)
  fields = {"x": rng.normal(size=(4, 3)).astype(np.float32),
            "y": rng.normal(size=4).astype(np.float32)}
  # this worker's 4 examples of a global batch of 16: its share is 1/4
  batch = Batch(fields, np.full(4, np.float32(1 / 16)), np.array([1, 0], np.int32))
  mean, (_, own) = _mean_loss(params, model_state, fields, None)
  mean_grads = jax.grad(lambda p: _mean_loss(p, model_state, fields, None)[0])(params)

  grads, _, metrics = problem.gradients(params, model_state, batch, WorkerAxis(1))
  np.testing.assert_allclose(grads["w"], mean_grads["w"] / 4, rtol=1e-6)
  np.testing.assert_allclose(metrics["loss"], mean / 4, rtol=1e-6)
  np.testing.assert_allclose(metrics["error"], own["error"] / 4, rtol=1e-6)

  grads, _, metrics = problem.own_gradients(params, model_state, batch)
  np.testing.assert_allclose(grads["w"], mean_grads["w"], rtol=1e-6)  # its own batch's mean
  np.testing.assert_allclose(metrics["loss"], mean / 4, rtol=1e-6)     # metrics stay shares
  np.testing.assert_allclose(metrics["error"], own["error"] / 4, rtol=1e-6)
