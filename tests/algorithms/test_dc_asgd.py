"""DC-ASGD: ASP with a delay-compensated server update."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdl
from jaxdl import algorithms
from jaxdl.algorithms import ALGORITHMS, Problem
from jaxdl.algorithms.asp import WorkerState
from jaxdl.config import RunConfig
from jaxdl.task import classification
from jaxdl.models import build_model

RUN = dict(model="mlp", epochs=1, workers=4, batch_size=8, progress=False,
           schedule="constant", momentum=0.0, lr=0.1, jitter=0.3)


def test_one_dc_asgd_server_update_by_hand():
  rng = np.random.default_rng(0)
  config = RunConfig.make(algorithm="dc_asgd", workers=2, dc_lambda=0.3)
  problem = Problem(classification(build_model("mlp", 10, (8, 8, 1))), optax.sgd(0.1))
  algorithm = algorithms.build(ALGORITHMS.get("dc_asgd"), config.settings(), problem, 2)
  server = algorithm.init_server(jax.random.key(0))
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32),
                       server.params)
  pulled = jax.tree.map(lambda p: p + 0.1, server.params)
  worker = WorkerState(pulled, {}, grads)
  new, _ = jax.jit(lambda s, w: algorithm.apply(s, w, jnp.float32(1.0)))(server, worker)
  expected = jax.tree.map(lambda w, g, b: w - 0.1 * (g + 0.3 * g * g * (w - b)),
                          *jax.device_get((server.params, grads, pulled)))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               jax.device_get(new.params), expected)
  assert int(new.version) == 1


# Five runs, with the slow cases: by default the update is checked by hand
# above, and one worker against the optax loop in test_families.py.
@pytest.mark.slow
def test_zero_lambda_or_one_worker_is_asp(tmp_path):
  asp = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "asp"), **RUN))
  off = jaxdl.run(RunConfig.make(algorithm="dc_asgd", out=str(tmp_path / "off"),
                                 dc_lambda=0.0, **RUN))
  assert off["params_fingerprint"] == asp["params_fingerprint"]
  on = jaxdl.run(RunConfig.make(algorithm="dc_asgd", out=str(tmp_path / "on"), **RUN))
  assert on["params_fingerprint"] != asp["params_fingerprint"]
  # one worker: zero staleness, nothing to compensate
  one = dict(RUN, workers=1)
  a = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "a1"), **one))
  d = jaxdl.run(RunConfig.make(algorithm="dc_asgd", out=str(tmp_path / "d1"), **one))
  assert a["params_fingerprint"] == d["params_fingerprint"]


def test_every_dc_asgd_setting_reaches_the_update(tmp_path):
  """dc_lambda, dc_adaptive and dc_beta each change the trained parameters
  (with the adaptive lambda, beta sets the mean square's memory)."""
  base = dict(RUN, algorithm="dc_asgd", dc_adaptive=True, dc_lambda=2.0, dc_beta=0.95)
  runs = {name: jaxdl.run(RunConfig.make(out=str(tmp_path / name), **{**base, **change}))
          for name, change in {"base": {}, "lambda": {"dc_lambda": 1.0},
                               "fixed": {"dc_adaptive": False},
                               "beta": {"dc_beta": 0.5}}.items()}
  prints = {name: s["params_fingerprint"] for name, s in runs.items()}
  assert len(set(prints.values())) == 4, prints
