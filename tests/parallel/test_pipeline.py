"""Pipeline schedules over a stage axis (jaxdl.parallel.pipeline): the same
loss and gradients as the stages run one after the other on one device, for
stages of different shapes, on forced CPU devices."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxdl.parallel.pipeline import Stages, bubble_fraction, scheduled_gradients
from tests import marks

AXIS = "stages"


def _conv(p, x):
  y = jax.lax.conv_general_dilated(x, p["w"], (1, 1), "SAME",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  return jnp.tanh(y + p["b"])


def _dense(p, x):
  return jnp.tanh(x.reshape(x.shape[0], -1) @ p["w"] + p["b"])


def _head(p, x):
  return x @ p["w"] + p["b"]


def _model():
  """Four stages that differ in shape: a 3x3 convolution (4x4x2 -> 4x4x3),
  a dense layer from the flattened map (48 -> 20), dense 20 -> 7, a linear
  head 7 -> 5; 4 to 1,980 parameters a stage."""
  keys = jax.random.split(jax.random.key(0), 4)
  shapes = [(3, 3, 2, 3), (48, 20), (20, 7), (7, 5)]
  params = [{"w": 0.4 * jax.random.normal(k, s), "b": 0.1 * jnp.ones(s[-1])}
            for k, s in zip(keys, shapes)]
  return Stages.of((_conv, _dense, _dense, _head), params, (4, 4, 2)), params


def _loss(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _scheduled(stages, params, x, labels, microbatches, kind):
  """(loss, gradients) of the stages' mean cross-entropy by the schedule
  `kind` on as many devices as stages."""
  p, batch = stages.count, len(labels)
  mesh = jax.make_mesh((p,), (AXIS,), devices=jax.devices()[:p],
                       axis_types=(jax.sharding.AxisType.Auto,))

  def local(rows, micro, micro_labels):
    loss, grad, _ = scheduled_gradients(stages, rows[0], micro, micro_labels,
                                        lambda out, y: _loss(out, y) / microbatches, AXIS, kind)
    return loss, grad[None]

  run = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(AXIS), P(), P()),
                              out_specs=(P(), P(AXIS))))
  rows = jax.device_put(stages.rows(params), jax.sharding.NamedSharding(mesh, P(AXIS)))
  cut = lambda a: a.reshape(microbatches, batch // microbatches, *a.shape[1:])
  loss, grads = run(rows, cut(x), cut(labels))
  return loss, stages.params(grads), grads


# (by default: each schedule with 4 micro-batches, and 1F1B with one)
@pytest.mark.parametrize("microbatches, kind", [
    marks.slow(1, "gpipe", id="1-gpipe"), pytest.param(1, "1f1b", id="1-1f1b"),
    pytest.param(4, "gpipe", id="4-gpipe"), pytest.param(4, "1f1b", id="4-1f1b"),
    marks.slow(6, "gpipe", id="6-gpipe"), marks.slow(6, "1f1b", id="6-1f1b")])
def test_a_schedule_gives_one_devices_loss_and_gradients(kind, microbatches):
  stages, params = _model()
  assert stages.shapes == ((4, 4, 2), (4, 4, 3), (20,), (7,), (5,)) and stages.width == 48
  rng = np.random.default_rng(0)
  x = rng.normal(size=(24, 4, 4, 2)).astype(np.float32)
  labels = rng.integers(0, 5, 24)
  loss, got, grads = _scheduled(stages, params, x, labels, microbatches, kind)
  expected, expected_grads = jax.value_and_grad(
      lambda p: _loss(stages.sequential(p, x), labels))(params)
  assert float(loss) == pytest.approx(float(expected), rel=1e-6)
  for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected_grads)):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
  # the padding of a stage's row has no gradient
  for s, n in enumerate(stages.sizes):
    assert not np.any(np.asarray(grads[s, n:]))


def test_rows_round_trip_and_the_bubble():
  stages, params = _model()
  rows = stages.rows(params)
  assert rows.shape == (4, 48 * 20 + 20) and stages.sizes == (57, 980, 147, 40)
  for a, b in zip(jax.tree.leaves(stages.params(rows)), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
  assert bubble_fraction(1, 8) == 0.0


def test_balanced_groups_minimize_the_largest_stage():
  from jaxdl.parallel.pipeline import balanced_groups
  assert balanced_groups([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
  assert balanced_groups([5, 1, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 6)]
  assert balanced_groups([3, 4, 10, 2, 2], 3) == [range(0, 2), range(2, 3), range(3, 5)]
  assert balanced_groups([7], 1) == [range(0, 1)]
  with pytest.raises(ValueError, match="3 stages of 2 pieces"):
    balanced_groups([1, 2], 3)


def _zoo(name, image_shape, count):
  from jaxdl.models import MODELS, build_model
  from jaxdl.parallel.pipeline import model_stages
  build = lambda rngs: MODELS.get(name)(image_shape, 10, "cifar", rngs=rngs)
  key = jax.random.key(3)
  stages, params, _ = model_stages(build, key, count, image_shape)
  return stages, params, build_model(name, 10, image_shape, stem="cifar"), key


@pytest.mark.parametrize("name, image_shape, count", [
    ("mlp", (8, 8, 1), 3), ("cnn", (8, 8, 1), 4), marks.slow("vit", (8, 8, 1), 4),
    marks.slow("vit", (32, 32, 3), 2)])
def test_a_zoo_model_cut_into_stages_is_the_same_model(name, image_shape, count):
  """The stages hold every parameter of the model's init (same key) and,
  one after the other, compute its logits."""
  from jaxdl.models import count_params
  stages, params, model, key = _zoo(name, image_shape, count)
  assert stages.count == count and sum(stages.sizes) == count_params(model)
  full, state = model.init(key)
  x = np.random.default_rng(1).normal(size=(5, *image_shape)).astype(np.float32)
  expected = model.apply(full, state, x, False)[0]
  np.testing.assert_allclose(stages.sequential(params, x), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name, count", [("cnn_bn", 3), marks.slow("resnet18", 3),
                                         marks.slow("vgg11_bn", 4), ("vgg11", 2)])
def test_a_zoo_model_with_batch_norm_cut_into_stages_is_the_same_model(name, count):
  """Stages of different shapes with batch norm: in training (normalized by
  the batch's statistics, the running ones moved) and then in evaluation
  (by the moved running ones), the model's logits."""
  from jaxdl.models import MODELS, build_model
  from jaxdl.parallel.pipeline import model_stages
  image_shape = (8, 8, 1)
  build = lambda rngs: MODELS.get(name)(image_shape, 10, "cifar", rngs=rngs)
  stages, params, states = model_stages(build, jax.random.key(3), count, image_shape)
  model = build_model(name, 10, image_shape, stem="cifar")
  full, state = model.init(jax.random.key(3))
  assert stages.stateful == bool(jax.tree.leaves(state))
  rng = np.random.default_rng(1)
  x, later = (rng.normal(size=(6, *image_shape)).astype(np.float32) for _ in range(2))
  want, state = model.apply(full, state, x, True)
  got, states = stages.forward(params, states, x, True)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(stages.forward(params, states, later, False)[0],
                             model.apply(full, state, later, False)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", [marks.slow("gpipe"), "1f1b"])
def test_a_schedule_with_batch_norm_is_the_micro_batches_in_turn_on_one_device(kind):
  """The CNN with batch norm in 3 stages, 4 micro-batches: each micro-batch
  normalized by its own statistics, the running ones moved once a
  micro-batch in order: one device's loss, gradients and statistics
  running the micro-batches in turn."""
  from jaxdl.models import MODELS
  from jaxdl.models.layers import BatchStats
  from jaxdl.parallel.pipeline import model_stages
  build = lambda rngs: MODELS.get("cnn_bn")((8, 8, 1), 10, "cifar", rngs=rngs)
  stages, params, states = model_stages(build, jax.random.key(0), 3, (8, 8, 1))
  rng = np.random.default_rng(0)
  m, b = 4, 4
  x = rng.normal(size=(m, b, 8, 8, 1)).astype(np.float32)
  labels = rng.integers(0, 10, (m, b))
  mask = np.ones((m, b), np.float32)
  mask[3, 1] = 0  # padding leaves a micro-batch's statistics out
  mesh = jax.make_mesh((3,), (AXIS,), devices=jax.devices()[:3],
                       axis_types=(jax.sharding.AxisType.Auto,))

  def local(rows, state_rows, micro, micro_labels, masks):
    loss, grad, after = scheduled_gradients(
        stages, rows[0], micro, micro_labels, lambda out, y: _loss(out, y) / m, AXIS, kind,
        state_rows[0], lambda i: BatchStats(mask=masks[i]))
    return loss, grad[None], after[None]

  run = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(AXIS), P(AXIS), P(), P(), P()),
                              out_specs=(P(), P(AXIS), P(AXIS))))
  loss, grads, after = run(stages.rows(params), stages.state_rows(states), x, labels, mask)

  def one_device(params):
    total, moved = 0.0, states
    for i in range(m):
      logits, moved = stages.forward(params, moved, x[i], True, BatchStats(mask=mask[i]))
      total = total + _loss(logits, labels[i]) / m
    return total, moved
  (want, moved), want_grads = jax.value_and_grad(one_device, has_aux=True)(params)
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  for g, e in zip(jax.tree.leaves(stages.params(grads)), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(after, stages.state_rows(moved), rtol=1e-6, atol=1e-7)
  assert not np.allclose(after, stages.state_rows(states))  # the statistics moved


@pytest.mark.slow  # (the ViT in 4 stages, GPipe, 4 micro-batches, trained as on one device:
#                    test_a_pipelined_run_on_the_mesh_trains_as_the_data_parallel_one's sgd case)
def test_a_schedule_trains_the_vit_as_one_device_does():
  """The ViT in 4 stages (patch embedding + block, two blocks, block + head)
  on 4 devices, 4 micro-batches: one device's loss and gradients."""
  stages, params, _, _ = _zoo("vit", (8, 8, 1), 4)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(16, 8, 8, 1)).astype(np.float32)
  labels = rng.integers(0, 10, 16)
  loss, got, _ = _scheduled(stages, params, x, labels, 4, "gpipe")
  expected, expected_grads = jax.value_and_grad(
      lambda p: _loss(stages.sequential(p, x), labels))(params)
  assert float(loss) == pytest.approx(float(expected), rel=1e-6)
  for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected_grads)):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algorithm, model, stages, schedule, extra", [
    # (by default: the mlp with 1F1B, and with GPipe inside diloco)
    marks.slow("ar_sgd", "mlp", 3, "gpipe", {}),
    ("ar_sgd", "mlp", 2, "1f1b", {}),
    marks.slow("bsp", "cnn", 4, "gpipe", {}),                # stages of different shapes
    marks.slow("local_sgd", "mlp", 2, "gpipe", {"communication_period": 2}),
    ("diloco", "mlp", 2, "gpipe", {"inner_steps": 2}),
    marks.slow("sgd", "vit", 4, "gpipe", {"optimizer": "adam", "lr": 1e-3}),
    # (ar_sgd with 1F1B: the mlp's case; the ViT in 4 stages: sgd's)
    marks.slow("ar_sgd", "vit", 4, "1f1b", {}),
    # (bsp with 1F1B: cnn_bn's case; the cnn's stages of different shapes: GPipe's)
    marks.slow("bsp", "cnn", 3, "1f1b", {}),
    # batch norm: with one micro-batch, the whole batch's statistics (2 steps:
    # batch norm over 8 examples of 1x1 maps, ResNet-18 on 8x8 digits, makes a
    # rounding error of the first step's 100 times larger at the third)
    marks.slow("ar_sgd", "resnet18", 2, "1f1b", {"microbatches": 1, "steps": 2}),
    # (ar_sgd pipelined: the mlp's cases; batch norm with one micro-batch: bsp's)
    marks.slow("ar_sgd", "cnn_bn", 3, "gpipe", {"microbatches": 1}),
    marks.slow("bsp", "cnn_bn", 2, "1f1b", {"microbatches": 1}),
])
def test_a_pipelined_run_on_the_mesh_trains_as_the_data_parallel_one(algorithm, model, stages,
                                                                     schedule, extra):
  """--parallelism pipeline (each worker's model over a row of `stages`
  devices, 4 micro-batches unless given, GPipe or 1F1B) inside a
  synchronous algorithm: the same losses step by step, and the same
  evaluation, as the model whole on one device per worker."""
  from jaxdl.config import RunConfig
  from tests.helpers import make_engine, train
  workers = 1 if algorithm == "sgd" else 2
  extra = dict(extra)
  microbatches, steps = extra.pop("microbatches", 4), extra.pop("steps", 6)
  base = dict(algorithm=algorithm, workers=workers, model=model, batch_size=16,
              schedule="constant", **{"optimizer": "sgd", "lr": 0.05, **extra})
  pipelined = make_engine(RunConfig.make(**base, parallelism="pipeline", stages=stages,
                                         microbatches=microbatches, pipeline_schedule=schedule))
  assert pipelined.mesh.devices.shape == (workers, stages)
  whole = make_engine(RunConfig.make(**base))
  (state, history), (expected_state, expected) = train(pipelined, steps), train(whole, steps)
  np.testing.assert_allclose([h["loss"] for h in history], [h["loss"] for h in expected],
                             rtol=1e-5)
  evaluated = pipelined.evaluated(state)
  assert evaluated[0]["stages"].shape[0] == stages  # the stages' rows, gathered
  batch = {"image": np.random.default_rng(0).normal(size=(8, 8, 8, 1)).astype(np.float32),
           "label": np.arange(8) % 10}
  got = pipelined.problem.task.evaluate(*evaluated, batch)
  want = whole.problem.task.evaluate(*whole.evaluated(expected_state), batch)
  # (ResNet-18 evaluated by running statistics still near their start, which
  # leave its activations unnormalized: 2e-3 apart from parameters and
  # statistics 5e-7 apart)
  rel = 1e-2 if model == "resnet18" else 1e-5
  assert float(got["loss"]) == pytest.approx(float(want["loss"]), rel=rel)
  # a device holds its stage's parameters and optimizer state (bsp's server
  # slices are split over the workers either way): less than the whole model's
  memory = [e.figures()["memory_per_device_bytes"]["arguments"] for e in (pipelined, whole)]
  assert memory[0] < memory[1] or algorithm == "bsp", memory
  figures = pipelined.figures()
  ideal = (stages - 1) / (microbatches + stages - 1)
  assert figures["bubble_fraction_ideal"] == pytest.approx(ideal)
  # measured (from the fourth step on): each stage's work timed alone over the
  # step's time, and the devices' mean idle share (on devices that share two
  # cores a timing, not a bound: tests/parallel checks no inequality of it)
  if steps >= 4:
    busy = figures["busy_fraction_per_device"]
    assert len(busy) == stages and min(busy) > 0
    assert busy == pytest.approx([w / figures["step_seconds"] for w in figures["stage_seconds"]])
    assert figures["bubble_fraction_measured"] == pytest.approx(1 - np.mean(busy))


@pytest.mark.parametrize("model, stages, schedule", [
    marks.slow("resnet18", 3, "gpipe"),
    marks.slow("vgg11_bn", 2, "1f1b"), ("cnn_bn", 2, "1f1b")])
def test_a_pipelined_run_with_batch_norm_trains_as_one_device_running_the_micro_batches(
    model, stages, schedule):
  """Batch norm under --parallelism pipeline with 4 micro-batches (each
  normalized by its own statistics): each of 3 steps of sgd with momentum
  on the mesh gives, from the same state, the loss, parameters, momentum
  and running statistics of the same algorithm's step on one device, its
  micro-batches in turn (the task's loss outside the stage axis). (Step by
  step: over steps, batch norm on 8x8 digits makes rounding errors 100 times
  larger a step.)"""
  from jaxdl.algorithms import WorkerAxis
  from jaxdl.config import RunConfig
  from tests.helpers import leaves, make_engine
  engine = make_engine(RunConfig.make(
      algorithm="sgd", model=model, batch_size=16, schedule="constant", lr=0.05,
      parallelism="pipeline", stages=stages, microbatches=4, pipeline_schedule=schedule))
  problem = engine.problem
  worker = lambda state: jax.tree.map(lambda x: x[0], engine.worker_states(state))

  @jax.jit
  def one_device(s, batch):
    grads, model_state, metrics = problem.gradients(s.params, s.model_state, batch,
                                                    WorkerAxis(1))
    return problem.apply_gradients(s, grads, model_state), metrics
  state = engine.init(jax.random.key(0))
  for t in range(3):
    expected, want = one_device(worker(state), jax.device_get(engine.batch(t)))
    state, metrics = engine.step(state, t)
    assert float(metrics["loss"]) == pytest.approx(float(want["loss"]), rel=1e-5)
    for g, e in zip(leaves(worker(state)), leaves(expected)):
      np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages_count, microbatches", [(4, 6), (4, 2), (2, 1), (3, 4), (8, 3),
                                                         (5, 12)])
def test_a_schedule_orders_every_operation_after_what_it_needs(kind, stages_count, microbatches):
  """2 (m + p - 1) slots for both (the same bubble); 1F1B keeps at most p
  micro-batches' inputs a stage, GPipe m."""
  from jaxdl.parallel.pipeline import BACKWARD, FORWARD, IDLE, held, schedule
  p, m = stages_count, microbatches
  table = schedule(kind, p, m)
  assert table.shape == (2 * (m + p - 1), p, 2)
  for s in range(p):
    ops = [(int(o), int(i)) for o, i in table[:, s] if o != IDLE]
    assert sorted(ops) == sorted([(FORWARD, i) for i in range(m)] +
                                 [(BACKWARD, i) for i in range(m)])
    in_flight = np.cumsum([1 if o == FORWARD else -1 for o, _ in ops])
    assert in_flight.max() == (min(p - s, m) if kind == "1f1b" else m)
  slot = {(int(o), int(i), s): t for t in range(len(table)) for s in range(p)
          for o, i in [table[t, s]] if o != IDLE}
  for i in range(m):  # each operation after what it needs
    for s in range(1, p):
      assert slot[(FORWARD, i, s)] > slot[(FORWARD, i, s - 1)]
      assert slot[(BACKWARD, i, s - 1)] > slot[(BACKWARD, i, s)]
    assert slot[(BACKWARD, i, p - 1)] > slot[(FORWARD, i, p - 1)]
  # what a stage holds by micro-batch mod p never collides: the activations and
  # cotangents received and not yet used, and the inputs kept for the backward
  for s in range(p):
    for t in range(len(table)):
      holding = {
          "received": [i for i in range(m) if s > 0 and slot[(FORWARD, i, s - 1)] < t
                       <= slot[(FORWARD, i, s)]],
          "cotangents": [i for i in range(m) if s < p - 1 and slot[(BACKWARD, i, s + 1)] < t
                         <= slot[(BACKWARD, i, s)]],
          "kept": [i for i in range(m) if slot[(FORWARD, i, s)] < t <= slot[(BACKWARD, i, s)]]}
      for what, ids in holding.items():  # consecutive: distinct mod held's rows
        assert ids == list(range(ids[0], ids[0] + len(ids))) if ids else True
        assert len(ids) <= held(table), (what, s, t, ids)


def test_a_pipelined_step_compiles_outside_the_persistent_cache():
  """A pipelined step's executable loaded from JAX's persistent cache crashed
  XLA's CPU runtime in one run in five (jaxdl.engines.mesh.outside_persistent_cache):
  its compile neither reads nor writes the cache, the data parallel step's
  does, and the cache is on again after it. Both compile in `init`, before a
  run's clock starts: the first step compiles nothing."""
  from jaxdl.config import RunConfig
  from tests.helpers import make_engine
  assert jax.config.jax_compilation_cache_dir  # (tests/conftest.py)
  uses, compiles = [], []
  listen = lambda event, **_: uses.append(event) if event.endswith("use_cache") else None
  timed = lambda event, _, **__: compiles.append(event) if "backend_compile" in event else None
  jax.monitoring.register_event_listener(listen)
  jax.monitoring.register_event_duration_secs_listener(timed)
  try:
    counts = []
    for strategy in ({"parallelism": "pipeline", "stages": 2, "microbatches": 2}, {}):
      engine = make_engine(RunConfig.make(algorithm="ar_sgd", workers=2, model="mlp",
                                          batch_size=8, steps=2, lr=0.125, **strategy))
      before = len(uses)
      state = engine.init(jax.random.key(3))  # the initial state's program: the cache's
      compiled = len(compiles)
      jax.block_until_ready(engine.step(state, 0))
      assert len(compiles) == compiled, strategy  # found in memory
      counts.append(len(uses) - before)
  finally:
    jax.monitoring.unregister_event_listener(listen)
    jax.monitoring.unregister_event_duration_listener(timed)
  # the initial states' programs the same, the data parallel step's one more
  assert counts[1] == counts[0] + 1


def test_a_stages_timed_work_follows_its_arithmetic():
  """stage_seconds times each stage's own work of a step on its device: a
  stage of eight 256 x 256 dense layers takes far longer than one that
  scales its input (a thousand times the arithmetic)."""
  from jaxdl.parallel.pipeline import stage_seconds

  def heavy(p, x):
    for _ in range(8):
      x = jnp.tanh(x @ p["w"])
    return x
  params = [{"w": jnp.eye(256) * 0.5}, {"s": jnp.ones(())}]
  stages = Stages.of((heavy, lambda p, x: x * p["s"]), params, (256,))
  heavy_s, light_s = stage_seconds(stages, 4, 64, jax.devices()[:2], repeats=3)
  assert heavy_s > 5 * light_s, (heavy_s, light_s)
