"""Every algorithm's semantics, defined by reference loops over a run's trace.

For each event algorithm a small heterogeneous run on the sim engine (three
workers with batches of 4, 4 and 12 examples, so worker 2 computes 3x slower,
plus jitter) writes its trace.jsonl, and a straightforward loop re-derives
the run's final parameters from that file alone: numpy for every update rule
and the model's gradient of a worker's batch (jax.grad of its mean
cross-entropy), none of the engine's code (no planning, batching, fusion or
handlers). What each event does is jaxdl.trace's table:

  pull      the worker copies the server's parameters (AD-PSGD: its own);
            its gradient is computed on that copy, whenever it is computed
  apply     the server (AD-PSGD: the worker) applies that gradient, as the
            parameters are on arrival
  local     a local step on the worker's own parameters
  exchange  EASGD's elastic update of the worker and the center
  send      GoSGD: the sender halves its weight; the message is its model and
            that half, as they are now
  gossip    the message, as sent, is merged into the peer on arrival
  average   AD-PSGD: both models replaced by their mean, as they are now

The engine must agree with these loops to float tolerance: they are the
definition, and the engine's batching and fusion are an implementation.
Updates are SGD with momentum 0.9 (optax.sgd: v <- g + 0.9 v, x <- x - lr v),
so that optimizer state is part of what must agree. The synchronous
algorithms (sgd, bsp, ar_sgd, local_sgd, diloco) are checked the same way, with
unequal batches (4, 4, 4, 12) on every engine that runs them.
"""
from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdl.algorithms import lc_asgd
from jaxdl.config import RunConfig
from jaxdl.runner import setup
from jaxdl.trace import read_trace, write_trace
from tests import marks
from tests.helpers import train, zoo_model

LR, MU, KEY = 0.05, 0.9, 0
CONFIG = RunConfig.make(model="mlp", schedule="constant", lr=LR, momentum=MU, workers=3,
                        batch_sizes=(4, 4, 12), steps=8, engine="sim", compute_time=1e-3,
                        jitter=0.2)
# float32 throughout; the engine's gradients are reduced in another order
# (weighted sums, vmapped or not), ~1e-7 relative, which 30-odd momentum
# updates grow to ~1e-6. A wrong version read moves parameters by ~1e-3.
CLOSE = dict(rtol=1e-5, atol=2e-6)
# LC-ASGD's loss predictor amplifies its input: reported losses 1e-7 off (one
# float32 rounding of the mean) moved the final parameters by up to 4.6e-5,
# and the engine's mean loss is a weighted sum divided by the weights' sum.
# A wrong delay, k or loss moved them by more than 0.9.
LC_CLOSE = dict(rtol=1e-4, atol=1e-4)


class Run:
  """A run of `algorithm` for CONFIG's steps: its final state, and its trace
  read back from trace.jsonl; plus the model's initial parameters and the
  gradient of a worker's batch, for the reference loops."""

  def __init__(self, tmp_path, algorithm: str, **flags):
    if flags.get("engine") == "mesh":  # real devices: no simulated cluster
      flags = {"compute_time": None, "jitter": 0.0, **flags}
    self.setup = setup(CONFIG.replace(algorithm=algorithm, **flags))
    self.state, _ = train(self.setup.engine, CONFIG.train.steps, key=KEY)
    write_trace(tmp_path / "trace.jsonl", self.setup.engine.trace())
    self.events = list(read_trace(tmp_path / "trace.jsonl"))
    model, streams = zoo_model(self.setup), self.setup.streams
    params, model_state = model.init(jax.random.key(KEY))
    self.initial = jax.tree.map(np.asarray, params)

    def loss(params, images, labels):
      logits, _ = model.apply(params, model_state, images, True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    value_and_grad = jax.jit(jax.value_and_grad(loss))

    def gradient(params, worker: int, iteration: int):
      """(mean loss, gradient) of `worker`'s batch of `iteration` at `params`."""
      batch = streams.batch(worker, iteration)
      value, grads = value_and_grad(params, batch["image"], batch["label"])
      return np.float32(value), jax.tree.map(np.asarray, grads)
    self.gradient = gradient
    # an asynchronous run is heterogeneous: the fast workers made more updates
    counts = collections.Counter(e.worker for e in self.events if e.kind in ("apply", "local"))
    assert not counts or (counts[0] > counts[2] and counts[1] > counts[2]), counts

  def copy(self):
    return jax.tree.map(np.copy, self.initial)


def zeros(tree):
  return jax.tree.map(np.zeros_like, tree)


def sgd(params, velocity, grads):
  """optax.sgd(LR, momentum=MU) in numpy -> (params, velocity)."""
  velocity = jax.tree.map(lambda v, g: g + np.float32(MU) * v, velocity, grads)
  return jax.tree.map(lambda x, v: x - np.float32(LR) * v, params, velocity), velocity


def close(actual, expected, tolerance=CLOSE):
  for a, e in zip(jax.tree.leaves(jax.device_get(actual)), jax.tree.leaves(expected),
                  strict=True):
    np.testing.assert_allclose(np.asarray(a), e, **tolerance)


# Parameter servers -------------------------------------------------------------


def server_loop(run: Run, compensate=None):
  """ASP's loop; `compensate(g, w, w_bak, event) -> g` for the DC/LC rules."""
  server, velocity, pulled, version = run.copy(), zeros(run.initial), {}, 0
  for e in run.events:
    if e.kind == "pull":
      assert e.version == version
      pulled[e.worker] = (jax.tree.map(np.copy, server), e)
    elif e.kind == "apply":
      w_bak, pull = pulled.pop(e.worker)
      loss, g = run.gradient(w_bak, e.worker, e.iteration)
      if compensate is not None:
        g = compensate(g, server, w_bak, loss, pull, e)
      server, velocity = sgd(server, velocity, g)
      version += 1
  return server


@pytest.mark.parametrize("algorithm, flags", [("asp", {}), ("ssp", {"staleness_bound": 1})])
def test_asp_and_ssp_apply_the_gradient_of_what_was_pulled(tmp_path, algorithm, flags):
  run = Run(tmp_path, algorithm, **flags)
  if algorithm == "ssp":
    assert any(e.kind == "wait" for e in run.events)  # the bound did bind
  close(run.state.server.params, server_loop(run))


@pytest.mark.parametrize("adaptive", marks.default_first([False, True]))
def test_dc_asgd_compensates_with_the_pulled_version(tmp_path, adaptive):
  lam, beta = (2.0, 0.95) if adaptive else (0.04, None)
  run = Run(tmp_path, "dc_asgd", dc_lambda=lam, dc_adaptive=adaptive)
  mean_square = zeros(run.initial)

  def compensate(g, w, w_bak, loss, pull, apply):
    nonlocal mean_square
    if adaptive:
      mean_square = jax.tree.map(lambda v, g: np.float32(beta) * v + np.float32(1 - beta) * g * g,
                                 mean_square, g)
      lams = jax.tree.map(lambda v: np.float32(lam) / np.sqrt(v + np.float32(1e-7)), mean_square)
    else:
      lams = jax.tree.map(lambda g: np.float32(lam), g)
    return jax.tree.map(lambda g, l, w, b: g + l * g * g * (w - b), g, lams, w, w_bak)
  close(run.state.server.params, server_loop(run, compensate))


def test_lc_asgd_compensates_with_the_delay_and_loss_it_was_sent_with(tmp_path):
  # The predictors are the algorithm's own (unit-tested in test_predictors);
  # what is checked here is what the engine feeds them: the worker's loss at
  # what it pulled, its pull's transfer time and its iteration's compute time,
  # and the updates that landed in between.
  run = Run(tmp_path, "lc_asgd")
  settings = run.setup.config.settings()
  pieces = lc_asgd.default_pieces(settings, 3)
  steps, losses = pieces.steps.init(3), pieces.losses.init()
  # The report's sums: |k - delay|, k, delay, updates, |loss error|, losses seen
  sums, next_loss = np.zeros(6), 0.0

  def compensate(g, w, w_bak, loss, pull, apply):
    nonlocal steps, losses, sums, next_loss
    delay = jnp.float32(apply.version - 1 - pull.version)
    t_comm, t_comp = jnp.float32(pull.duration), jnp.float32(apply.duration)
    k = pieces.steps.predict(steps, apply.worker, t_comm, t_comp)
    steps = pieces.steps.update(steps, apply.worker, t_comm, t_comp, delay)
    seen = float(losses.seen > 0)  # a prediction of this loss exists
    sums += [abs(float(k) - float(delay)), float(k), float(delay), 1.0,
             seen * abs(next_loss - float(loss)), seen]
    losses = pieces.losses.update(losses, jnp.float32(loss))
    next_loss = float(pieces.losses.predict_next(losses, jnp.float32(loss)))
    _, slope = pieces.losses.compensation(losses, jnp.float32(loss), k)
    factor = np.float32(1 + settings.lc_lambda * slope)
    return jax.tree.map(lambda g: factor * g, g)
  close(run.state.server.params, server_loop(run, compensate), LC_CLOSE)
  n = max(sums[3], 1)
  expected = {"lc_delay_mae": sums[0] / n, "lc_delay_predicted_mean": sums[1] / n,
              "lc_delay_actual_mean": sums[2] / n, "lc_loss_mae": sums[4] / max(sums[5], 1)}
  assert run.setup.engine.report(run.state) == pytest.approx(expected, rel=1e-4, abs=1e-5)
  assert sums[3] > 10 and sums[5] == sums[3] - 1  # every report but the first was predicted


# Local steps: elastic and gossip ------------------------------------------------


def test_easgd_exchanges_the_worker_as_sent_with_the_center_on_arrival(tmp_path):
  run = Run(tmp_path, "easgd", communication_period=2)
  alpha = np.float32(0.9 / 3)
  center, x = run.copy(), [run.copy() for _ in range(3)]
  velocity = [zeros(run.initial) for _ in range(3)]
  for e in run.events:
    w = e.worker
    if e.kind == "local":
      x[w], velocity[w] = sgd(x[w], velocity[w], run.gradient(x[w], w, e.iteration)[1])
    elif e.kind == "exchange":
      d = jax.tree.map(lambda a, c: alpha * (a - c), x[w], center)
      x[w] = jax.tree.map(lambda a, di: a - di, x[w], d)
      center = jax.tree.map(lambda c, di: c + di, center, d)
  assert sum(e.kind == "exchange" for e in run.events) >= 6
  close(run.state.server.params, center)
  for w in range(3):
    close(jax.tree.map(lambda a: a[w], run.state.workers.params), x[w])


def test_gosgd_merges_the_message_as_it_was_sent(tmp_path):
  # a slow network: messages are in flight for several of the sender's steps
  run = Run(tmp_path, "gosgd", gossip_probability=0.5, network="2gbps")
  x, a = [run.copy() for _ in range(3)], [np.float32(1 / 3)] * 3
  velocity, flying = [zeros(run.initial) for _ in range(3)], {}
  for e in run.events:
    w = e.worker
    if e.kind == "local":
      x[w], velocity[w] = sgd(x[w], velocity[w], run.gradient(x[w], w, e.iteration)[1])
    elif e.kind == "send":
      a[w] = a[w] / np.float32(2)
      flying[w, e.iteration] = (jax.tree.map(np.copy, x[w]), a[w])
    elif e.kind == "gossip":
      xm, am = flying.pop((w, e.iteration))
      k, total = e.peer, a[e.peer] + am
      x[k] = jax.tree.map(lambda xk, xs: (a[k] * xk + am * xs) / total, x[k], xm)
      a[k] = total
  # some messages were in flight while their sender took further steps
  sent_at = {(e.worker, e.iteration): i for i, e in enumerate(run.events) if e.kind == "send"}
  assert any(f.kind == "local" and f.worker == e.worker
             for i, e in enumerate(run.events) if e.kind == "gossip"
             for f in run.events[sent_at[e.worker, e.iteration]:i])
  np.testing.assert_allclose(np.asarray(run.state.workers.weight), a, rtol=1e-6)
  for w in range(3):
    close(jax.tree.map(lambda p: p[w], run.state.workers.params), x[w])


# Decentralized ------------------------------------------------------------------


def test_ad_psgd_applies_the_gradient_of_its_snapshot_after_the_average(tmp_path):
  run = Run(tmp_path, "ad_psgd")
  x, snapshot = [run.copy() for _ in range(3)], {}
  velocity = [zeros(run.initial) for _ in range(3)]
  for e in run.events:
    w = e.worker
    if e.kind == "pull":
      snapshot[w] = jax.tree.map(np.copy, x[w])
    elif e.kind == "average":
      mean = jax.tree.map(lambda p, q: (p + q) / np.float32(2), x[w], x[e.peer])
      x[w], x[e.peer] = mean, jax.tree.map(np.copy, mean)
    elif e.kind == "apply":
      g = run.gradient(snapshot.pop(w), w, e.iteration)[1]
      x[w], velocity[w] = sgd(x[w], velocity[w], g)
  for w in range(3):
    close(jax.tree.map(lambda p: p[w], run.state.workers.params), x[w])


def close_but_ties(actual, expected, share: float = 1e-3):
  """`close`, but for at most `share` of the coordinates of each leaf: top-k
  of x - r computed from gradients ~1e-7 apart picks the other of two
  near-equal coordinates now and then, and the one left out goes later
  (measured: 2 coordinates of 16,384, 1.4e-3 apart). Float tolerance 1e-5:
  the compressed rules' rounding reached 6e-6. A wrong rule moves most
  coordinates, by far more."""
  for a, e in zip(jax.tree.leaves(jax.device_get(actual)), jax.tree.leaves(expected),
                  strict=True):
    a = np.asarray(a)
    off = ~np.isclose(a, e, rtol=1e-5, atol=1e-5)
    assert off.mean() <= share, (off.mean(), np.abs(a - e).max())


def top_k(tree, percent: int):
  """Each leaf with all but its ceil(percent / 100 d) largest |x_i| set to 0
  (ties: the lower index), in numpy."""
  def leaf(x):
    k = -(-x.size * percent // 100)
    keep = np.argsort(-np.abs(x.ravel()), kind="stable")[:k]
    out = np.zeros_like(x.ravel())
    out[keep] = x.ravel()[keep]
    return out.reshape(x.shape)
  return jax.tree.map(leaf, tree)


def add(a, b):
  return jax.tree.map(lambda x, y: x + y, a, b)


def sub(a, b):
  return jax.tree.map(lambda x, y: x - y, a, b)


@pytest.mark.slow
def test_compressed_gosgd_merges_the_reference_its_pair_holds(tmp_path):
  """--compress topk:5%: a message from m to k is q = top_k(x_m - r_{m->k})
  as m is at the send, r_{m->k} (both ends' copies, from the initial model)
  grows by q, at m when sent and at k on arrival, and k merges its copy of
  r_{m->k} with the weights as sent."""
  run = Run(tmp_path, "gosgd", gossip_probability=0.5, network="2gbps", compress="topk:0.05")
  x, a = [run.copy() for _ in range(3)], [np.float32(1 / 3)] * 3
  velocity, flying = [zeros(run.initial) for _ in range(3)], {}
  sent = {(m, k): run.copy() for m in range(3) for k in range(3)}      # r_{m->k} at m
  received = {(m, k): run.copy() for m in range(3) for k in range(3)}  # r_{m->k} at k
  for e in run.events:
    w = e.worker
    if e.kind == "local":
      x[w], velocity[w] = sgd(x[w], velocity[w], run.gradient(x[w], w, e.iteration)[1])
    elif e.kind == "send":
      a[w] = a[w] / np.float32(2)
      q = top_k(sub(x[w], sent[w, e.peer]), 5)
      sent[w, e.peer] = add(sent[w, e.peer], q)
      flying[w, e.iteration] = (q, a[w])
    elif e.kind == "gossip":
      q, am = flying.pop((w, e.iteration))
      k, total = e.peer, a[e.peer] + am
      received[w, k] = add(received[w, k], q)
      x[k] = jax.tree.map(lambda xk, r: (a[k] * xk + am * r) / total, x[k], received[w, k])
      a[k] = total
  assert sum(e.kind == "gossip" for e in run.events) >= 6
  np.testing.assert_allclose(np.asarray(run.state.workers.weight), a, rtol=1e-6)
  links = run.state.workers.links
  for m in range(3):
    close_but_ties(jax.tree.map(lambda p: p[m], run.state.workers.params), x[m])
    for k in range(3):
      close_but_ties(jax.tree.map(lambda r: r[m, k], links.sent), sent[m, k])
      close_but_ties(jax.tree.map(lambda r: r[k, m], links.received), received[m, k])


def scaled_sign(tree):
  """Each leaf as (||x||_1 / d) sign(x), sign(0) = +1, in numpy."""
  return jax.tree.map(lambda x: (np.abs(x).sum(dtype=np.float32) / np.float32(x.size)
                                 * np.where(x >= 0, 1, -1)).astype(np.float32), tree)


@pytest.mark.slow
def test_compressed_ad_psgd_takes_the_consensus_step_between_references(tmp_path):
  """--compress sign: at an average of m and k, each sends the scaled sign
  of its own x - r, both references grow by them, then CHOCO-SGD's step at
  the default gamma = 0.05, x_m <- x_m + gamma (r_{k->m} - r_{m->k}) and
  x_k <- x_k + gamma (r_{m->k} - r_{k->m}). Larger steps are no reference
  here: a compressor's edges (top-k's ties, sign's zeros), crossed apart by
  ~1e-7, cascade, and 3-80% of a kernel's coordinates ended up 0.005-0.02
  apart after 8 steps (measured: top-k 5% at 0.25 and 0.3, sign at 0.3);
  the rule at any gamma is checked by hand in
  tests/algorithms/test_gossip_compression.py."""
  run = Run(tmp_path, "ad_psgd", compress="sign")
  step = np.float32(0.05)
  C = scaled_sign
  x, snapshot = [run.copy() for _ in range(3)], {}
  velocity = [zeros(run.initial) for _ in range(3)]
  reference = {(m, k): run.copy() for m in range(3) for k in range(3)}  # r_{m->k}
  for e in run.events:
    w = e.worker
    if e.kind == "pull":
      snapshot[w] = jax.tree.map(np.copy, x[w])
    elif e.kind == "average":
      k = e.peer
      q_wk, q_kw = C(sub(x[w], reference[w, k])), C(sub(x[k], reference[k, w]))
      reference[w, k], reference[k, w] = add(reference[w, k], q_wk), add(reference[k, w], q_kw)
      d = jax.tree.map(lambda r_kw, r_wk: step * (r_kw - r_wk), reference[k, w], reference[w, k])
      x[w], x[k] = add(x[w], d), sub(x[k], d)
    elif e.kind == "apply":
      g = run.gradient(snapshot.pop(w), w, e.iteration)[1]
      x[w], velocity[w] = sgd(x[w], velocity[w], g)
  links = run.state.workers.links
  for m in range(3):
    close_but_ties(jax.tree.map(lambda p: p[m], run.state.workers.params), x[m])
    for k in range(3):
      close_but_ties(jax.tree.map(lambda r: r[m, k], links.sent), reference[m, k])
      close_but_ties(jax.tree.map(lambda r: r[k, m], links.received), reference[m, k])


# Synchronous: one reference per algorithm, on every engine that runs it --------

SYNC = dict(workers=4, batch_sizes=(4, 4, 4, 12), jitter=0.0)


def sync_run(tmp_path, algorithm: str, engine: str, **flags) -> Run:
  return Run(tmp_path, algorithm, engine=engine, **{**SYNC, **flags})


def global_gradient(run: Run, params, step: int):
  """The global batch's mean gradient: the workers' means weighted by b_m / B."""
  sizes = run.setup.streams.batch_sizes
  grads = [run.gradient(params, m, step)[1] for m in range(len(sizes))]
  return jax.tree.map(lambda *g: sum(np.float32(b / sum(sizes)) * x
                                     for b, x in zip(sizes, g)), *grads)


def test_sgd_is_the_sequential_loop(tmp_path):
  run = Run(tmp_path, "sgd", workers=1, batch_sizes=None, batch_size=8, engine="mesh")
  x, velocity = run.copy(), zeros(run.initial)
  for e in run.events:
    x, velocity = sgd(x, velocity, run.gradient(x, 0, e.iteration)[1])
  close(run.setup.engine.evaluated(run.state)[0], x)


@pytest.mark.parametrize("algorithm, engine", [("bsp", "mesh"), ("bsp", "sim"), ("ar_sgd", "mesh"),
                                               marks.slow("ar_sgd", "sim")])
def test_bsp_and_ar_sgd_take_the_weighted_global_gradient(tmp_path, algorithm, engine):
  run = sync_run(tmp_path, algorithm, engine)
  x, velocity = run.copy(), zeros(run.initial)
  steps = [e.iteration for e in run.events if e.kind == "step"]
  assert steps == list(range(CONFIG.train.steps))
  for t in steps:
    x, velocity = sgd(x, velocity, global_gradient(run, x, t))
  close(run.setup.engine.evaluated(run.state)[0], x)


@pytest.mark.parametrize("engine", marks.default_first(["mesh", "sim"]))
def test_local_sgd_averages_with_the_batch_shares(tmp_path, engine):
  run = sync_run(tmp_path, "local_sgd", engine, communication_period=2)
  sizes = run.setup.streams.batch_sizes
  x = [run.copy() for _ in sizes]
  velocity = [zeros(run.initial) for _ in sizes]
  for t in range(CONFIG.train.steps):  # 8 steps: the last one averages
    for m in range(len(sizes)):
      x[m], velocity[m] = sgd(x[m], velocity[m], run.gradient(x[m], m, t)[1])
    if (t + 1) % 2 == 0:
      mean = jax.tree.map(lambda *p: sum(np.float32(b / sum(sizes)) * q
                                         for b, q in zip(sizes, p)), *x)
      x = [jax.tree.map(np.copy, mean) for _ in sizes]
  close(run.setup.engine.evaluated(run.state)[0], x[0])


@pytest.mark.parametrize("engine", [marks.slow("mesh"), "sim"])
def test_diloco_applies_nesterov_to_the_weighted_delta(tmp_path, engine):
  """Douillard et al. 2023, Algorithm 1: H = 2 inner steps of momentum SGD
  per worker (its own velocity, kept across outer steps), then theta moves by
  outer Nesterov SGD (lr 0.7, momentum 0.9) on Delta = theta - sum_m (b_m/B)
  theta_m, and every worker restarts from theta."""
  run = sync_run(tmp_path, "diloco", engine, optimizer="sgd", inner_steps=2)
  sizes = run.setup.streams.batch_sizes
  theta, outer_velocity = run.copy(), zeros(run.initial)
  x = [run.copy() for _ in sizes]
  velocity = [zeros(run.initial) for _ in sizes]
  for t in range(CONFIG.train.steps):  # 8 steps: the last one is an outer step
    for m in range(len(sizes)):
      x[m], velocity[m] = sgd(x[m], velocity[m], run.gradient(x[m], m, t)[1])
    if (t + 1) % 2 == 0:
      mean = jax.tree.map(lambda *p: sum(np.float32(b / sum(sizes)) * q
                                         for b, q in zip(sizes, p)), *x)
      delta = jax.tree.map(lambda a, b: a - b, theta, mean)
      outer_velocity = jax.tree.map(lambda d, v: d + np.float32(0.9) * v, delta,
                                    outer_velocity)
      theta = jax.tree.map(lambda w, d, v: w - np.float32(0.7) * (d + np.float32(0.9) * v),
                           theta, delta, outer_velocity)
      x = [jax.tree.map(np.copy, theta) for _ in sizes]
  close(run.setup.engine.evaluated(run.state)[0], theta)
