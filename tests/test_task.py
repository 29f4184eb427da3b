"""A script's own task (jaxdl.task): model, loss and data passed to jaxdl.run."""
from __future__ import annotations

import dataclasses
import json
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxdl
from jaxdl.algorithms import ALGORITHMS
from jaxdl.cli import main
from jaxdl.config import RunConfig
from jaxdl.errors import ConfigError, TaskError
from jaxdl.fingerprint import fingerprint
from jaxdl.task import registered, task_names
from tests import marks

SEED, FEATURES = 3, 5
W_TRUE = np.random.default_rng(0).normal(size=(FEATURES,)).astype(np.float32)


class Regressor(nn.Module):
  """A Linen model of the test's own: dense, relu, dropout, dense."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.relu(nn.Dense(16)(x))
    x = nn.Dropout(0.2, deterministic=not train)(x)
    return nn.Dense(1)(x)[:, 0]


def regression_rows(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
  x = rng.normal(size=(n, FEATURES)).astype(np.float32)
  y = (x @ W_TRUE + 0.05 * rng.normal(size=n)).astype(np.float32)
  return {"x": x, "y": y}


def batch_of(worker: int, step: int, seed: int, size: int = 8) -> dict[str, np.ndarray]:
  """Data as a function: worker's batch at its step."""
  return regression_rows(np.random.default_rng([seed, worker, step]), size)


MODEL = Regressor()
INIT, APPLY = jaxdl.from_linen(MODEL, np.zeros((1, FEATURES), np.float32))


def mse(params, model_state, batch, key):
  pred, model_state = APPLY(params, model_state, batch["x"], train=True,
                            rngs={"dropout": key})
  return jnp.mean((pred - batch["y"]) ** 2), (model_state, {"mae": jnp.mean(jnp.abs(pred - batch["y"]))})


TEST = regression_rows(np.random.default_rng(99), 256)


def task(train=None, **kwargs) -> jaxdl.Task:
  return jaxdl.Task(init=INIT, loss=mse, train=batch_of if train is None else train,
                    test=TEST, name="regression", **kwargs)


def run(tmp_path, name="run", task_=None, **flags):
  flags = {"steps": 30, "batch_size": 8, "lr": 0.05, "momentum": 0.0,
           "schedule": "constant", "seed": SEED, "progress": False, **flags}
  return jaxdl.run(RunConfig.make(out=str(tmp_path / name), **flags), task=task_ or task())


def hand_written_loop(steps: int, lr: float) -> dict:
  """sgd on one worker as optax would be used by hand: the initial key is
  fold_in(key(seed), 0), step t's loss key fold_in(fold_in(fold_in(key(seed),
  1), worker 0), t) (jaxdl.task.Task)."""
  rule = optax.sgd(lr)
  params, model_state = INIT(jax.random.fold_in(jax.random.key(SEED), 0))
  opt_state = rule.init(params)

  @jax.jit
  def step(params, model_state, opt_state, batch, key):
    grads, (model_state, _) = jax.grad(mse, has_aux=True)(params, model_state, batch, key)
    updates, opt_state = rule.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), model_state, opt_state

  base = jax.random.fold_in(jax.random.key(SEED), 1)
  for t in range(steps):
    key = jax.random.fold_in(jax.random.fold_in(base, 0), t)
    params, model_state, opt_state = step(params, model_state, opt_state,
                                          batch_of(0, t, SEED), key)
  return jax.device_get(params)


@pytest.mark.parametrize("engine", [marks.slow("mesh"), "sim"])
def test_sgd_on_a_linen_task_is_the_hand_written_optax_loop(tmp_path, engine):
  flags = {"compute_time": 1e-3} if engine == "sim" else {}
  summary = run(tmp_path, algorithm="sgd", engine=engine, **flags)
  hand = hand_written_loop(30, 0.05)
  if engine == "mesh":  # one device: the step is the hand loop's jit
    assert summary["params_fingerprint"] == fingerprint(hand)
  else:
    # The sim runs the step inside its program over the workers, which XLA
    # fuses its own way: on some CPUs (AVX2) a sum rounds otherwise in its last
    # bit. 30 steps of it move the test loss by about 1 float32 ulp (8e-8
    # relative measured); a wrong rule moves it by far more than 1e-6.
    model_state = INIT(jax.random.fold_in(jax.random.key(SEED), 0))[1]
    expected = float(task().evaluation(hand, model_state, TEST)["loss"])
    assert summary["test_loss"] == pytest.approx(expected, rel=1e-6, abs=0)
  assert summary["task"] == "regression" and summary["target_metric"] == "test_loss"
  # The run directory of a CLI run: config, metrics, trace, checkpoints, summary.
  out = tmp_path / "run"
  assert {p.name for p in out.iterdir()} >= {"config.json", "metrics.jsonl", "trace.jsonl",
                                             "checkpoints", "summary.json"}
  config = json.loads((out / "config.json").read_text())
  assert config["data"]["dataset"] == config["model"]["model"] == "task:regression"
  records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert records[-1]["test_loss"] < 0.5 * _initial_test_loss()
  assert 0 < records[-1]["train_mae"] < 1  # the task's own training metric


def _initial_test_loss() -> float:
  params, model_state = INIT(jax.random.fold_in(jax.random.key(SEED), 0))
  return float(task().evaluation(params, model_state, TEST)["loss"])


# tests/algorithms/test_common.py trains every algorithm; here a few on a
# script's own task: synchronous, asynchronous parameter servers, gossip.
TASK_ALGORITHMS = {"sgd", "local_sgd", "ssp", "dc_asgd", "ad_psgd"}


@pytest.mark.parametrize("algorithm", marks.default_only(sorted(ALGORITHMS), TASK_ALGORITHMS))
def test_every_algorithm_trains_the_task(tmp_path, algorithm):
  flags = dict(workers=1 if algorithm == "sgd" else 4, engine="sim", compute_time=1e-3,
               jitter=0.2, steps=60)
  summary = run(tmp_path, algorithm=algorithm, **flags)
  assert summary["status"] == "completed"
  assert summary["test_loss"] < 0.25 * _initial_test_loss(), summary["test_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["bsp", "ar_sgd", "local_sgd"])
def test_collective_algorithms_run_the_task_on_the_mesh_as_on_the_sim(tmp_path, algorithm):
  mesh = run(tmp_path, "mesh", algorithm=algorithm, workers=4, engine="mesh")
  sim = run(tmp_path, "sim", algorithm=algorithm, workers=4, engine="sim", compute_time=1e-3)
  assert mesh["test_loss"] == pytest.approx(sim["test_loss"], rel=1e-4)


def test_an_nnx_module_trains_through_from_nnx(tmp_path):
  class Net(nnx.Module):
    def __init__(self, rngs):
      self.hidden = nnx.Linear(FEATURES, 16, rngs=rngs)
      self.norm = nnx.BatchNorm(16, rngs=rngs)
      self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x, train):
      self.norm.use_running_average = not train
      return self.out(nnx.relu(self.norm(self.hidden(x))))[:, 0]

  init, apply = jaxdl.from_nnx(Net)
  params, state = init(jax.random.key(0))
  assert set(params) == {"hidden", "norm", "out"} and "mean" in state["norm"]

  def loss(params, model_state, batch, key):
    pred, model_state = apply(params, model_state, batch["x"], True)
    return jnp.mean((pred - batch["y"]) ** 2), (model_state, {})

  def evaluate(params, model_state, batch):
    pred, _ = apply(params, model_state, batch["x"], False)
    return {"loss": jnp.mean((pred - batch["y"]) ** 2)}

  nnx_task = jaxdl.Task(init=init, loss=loss, evaluate=evaluate, train=batch_of, test=TEST,
                        name="nnx")
  before = float(evaluate(params, state, TEST)["loss"])
  summary = run(tmp_path, task_=nnx_task, algorithm="asp", workers=4, engine="sim",
                compute_time=1e-3, steps=60)
  assert summary["test_loss"] < 0.25 * before
  assert summary["model_state_fingerprint"] != fingerprint(state)  # running statistics moved


def test_arrays_iterables_and_functions_give_the_batches_they_describe(tmp_path):
  """A re-iterable of global batches gives worker m its slice of the k-th;
  the same slices from a function train to the same bits, resumed or not."""
  global_batches = [regression_rows(np.random.default_rng([7, k]), 32) for k in range(10)]
  sliced = lambda worker, step, seed: {k: v[8 * worker:8 * worker + 8] for k, v in
                                       global_batches[step % 10].items()}
  flags = dict(algorithm="asp", workers=4, engine="sim", compute_time=1e-3, jitter=0.3,
               steps=25, checkpoint_every=10)
  from_iterable = run(tmp_path, "iterable", task(jaxdl.IterableData(global_batches)), **flags)
  from_function = run(tmp_path, "function", task(jaxdl.FunctionData(sliced, 10)), **flags)
  assert from_iterable["params_fingerprint"] == from_function["params_fingerprint"]
  # Resumed from step 20 (its last checkpoint removed): the same bits.
  shutil.rmtree(tmp_path / "iterable" / "checkpoints" / "25")
  resumed = run(tmp_path, "iterable", task(jaxdl.IterableData(global_batches)), resume=True,
                **flags)
  assert resumed["params_fingerprint"] == from_iterable["params_fingerprint"]
  # Arrays: each worker its own shard, and a lower loss than at the start.
  rows = regression_rows(np.random.default_rng(5), 512)
  arrays = run(tmp_path, "arrays", task(rows), **{**flags, "steps": 60})
  assert arrays["test_loss"] < 0.25 * _initial_test_loss()


def test_a_bad_task_gets_one_clear_message(tmp_path):
  def vector_loss(params, model_state, batch, key):
    pred, _ = APPLY(params, model_state, batch["x"])
    return (pred - batch["y"]) ** 2, (model_state, {})

  def reads_z(params, model_state, batch, key):
    return jnp.mean(batch["z"]), (model_state, {})

  cases = [
      (jaxdl.Task(init=INIT, loss=vector_loss, train=batch_of, name="r"),
       {}, "task 'r', loss: a loss that returns a scalar, the batch's mean; "
           "it returned shape (8,)"),
      (jaxdl.Task(init=INIT, loss=reads_z, train=batch_of, name="r"),
       {}, "task 'r', loss: a loss that reads only the batch's fields (x, y); it read 'z'"),
      (jaxdl.Task(init=INIT, loss=reads_z, train=batch_of, name="r", weighted=True),
       {}, "task 'r', loss: a loss that reads only the batch's fields (x, y, weight); "
           "it read 'z'"),
      (task(), {"algorithm": "ar_sgd", "batch_sizes": (4, 12), "workers": 2},
       "a weighted loss (Task(weighted=True)"),
      (task(), {"dataset": "mnist"}, "--dataset='mnist' is not valid: left unset: "
                                     "task 'regression' brings its own data and model"),
      (task(), {"algorithm": "bsp", "workers": 2, "sync_bn": True},
       "--sync-bn=True is not valid: left unset"),
      (task(lambda w, t, s: {"x": np.zeros((3, FEATURES), np.float32)}), {},
       "task 'regression', the batch of worker 0 at step 0: fields with 8 rows (the batch "
       "size); they have x (3, 5)"),
  ]
  for bad, flags, message in cases:
    with pytest.raises(ConfigError) as error:
      run(tmp_path, "bad", task_=bad, **flags)
    assert message in str(error.value)
    assert not (tmp_path / "bad").exists()  # refused before anything is written
  with pytest.raises(TaskError, match=r"task 'custom', train data: fields with the same "
                     r"number of rows; they have x \(4, 2\), y \(3,\)"):
    jaxdl.Task(init=INIT, loss=mse, train={"x": np.zeros((4, 2)), "y": np.zeros(3)})


def test_a_task_name_on_the_command_line_is_refused(capsys):
  assert main(["run", "--dataset", "task:regression"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("jaxdl run: error: --dataset='task:regression' is not valid: a name from "
                        "`jaxdl list`"), err


@pytest.mark.slow
def test_the_custom_task_example_prints_its_loss_falling(tmp_path, capsys, monkeypatch):
  import importlib.util
  import sys
  from pathlib import Path
  path = Path(__file__).parent.parent / "experiments" / "custom_task.py"
  spec = importlib.util.spec_from_file_location("custom_task", path)
  example = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, "custom_task", example)  # for its dataclass
  spec.loader.exec_module(example)
  summaries = example.main(example.Args(steps=100, out=str(tmp_path)))
  lines = capsys.readouterr().out.splitlines()
  assert [line.split(":")[0] for line in lines] == list(example.RUNS)
  for summary in summaries.values():  # far below the loss of predicting the mean
    assert summary["test_mse"] < 0.05 * summary["mse_of_the_mean"]


def test_a_registered_task_is_a_command_line_name(tmp_path, capsys):
  from jaxdl.task import TASKS

  def make_regression():
    """Noisy linear regression (the test's)."""
    return task()

  TASKS.register("regression")(make_regression)
  try:
    out = tmp_path / "cli"
    assert main(["run", "--dataset", "task:regression", "--steps", "30", "--batch-size", "8",
                 "--lr", "0.05", "--momentum", "0", "--schedule", "constant", "--seed",
                 str(SEED), "--no-progress", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params_fingerprint"] == fingerprint(hand_written_loop(30, 0.05))
    assert main(["list"]) == 0
    assert "task:regression" in capsys.readouterr().out
    # resumed from its config, as any run
    assert main(["run", "--config", str(out / "config.json"), "--resume", "--out", str(out),
                 "--no-progress"]) == 0
  finally:
    TASKS.remove("regression")


def make_plugged() -> jaxdl.Task:
  """An installed package's task (its entry point names this function)."""
  return dataclasses.replace(task(), name="plugged")


def test_an_installed_packages_task_is_found_by_its_entry_point(monkeypatch):
  import importlib.metadata as metadata
  from jaxdl.task import ENTRY_POINTS, TASKS, registered, task_names
  entries = [metadata.EntryPoint("plugged", f"{__name__}:make_plugged", ENTRY_POINTS),
             metadata.EntryPoint("spare", f"{__name__}:task", ENTRY_POINTS),
             metadata.EntryPoint("elsewhere", f"{__name__}:task", "other.group")]
  monkeypatch.setattr(metadata, "entry_points", lambda group, name=None: [
      e for e in entries if e.group == group and name in (None, e.name)])
  names = task_names()
  assert "plugged" in names and "spare" in names and "elsewhere" not in names
  assert "plugged" not in TASKS.names()  # listed, not imported
  try:
    assert registered("plugged").name == "plugged"  # imported when asked for
    assert TASKS.names().count("plugged") == 1 and "spare" not in TASKS.names()
  finally:
    TASKS.remove("plugged")


@pytest.mark.parametrize("made", [lambda: task(), lambda: {"name": "wrong"}],
                         ids=["another name", "not a task"])
def test_a_factory_must_return_a_task_of_its_name(made):
  from jaxdl.task import TASKS, registered
  TASKS.register("wrong")(made)
  try:
    with pytest.raises(TaskError) as error:
      registered("wrong")
    assert str(error.value) == ("task 'wrong', factory: a function that returns a Task "
                                "named 'wrong'")
    assert (error.value.field, error.value.value) == ("task", "wrong")
  finally:
    TASKS.remove("wrong")


class Normed(nn.Module):
  """Dense then batch norm: a Linen model with state besides its parameters."""

  @nn.compact
  def __call__(self, x, train: bool):
    return nn.BatchNorm(use_running_average=not train, momentum=0.5)(nn.Dense(3)(x))


def test_from_linen_passes_the_keywords_and_keeps_batch_norm_state():
  x = np.random.default_rng(0).normal(size=(8, FEATURES)).astype(np.float32)
  # a stateless model: the call's keywords reach it (dropout on, as flax does it)
  params, state = INIT(jax.random.key(0))
  assert state == {}
  rngs = {"dropout": jax.random.key(1)}
  out, _ = APPLY(params, state, x, train=True, rngs=rngs)
  np.testing.assert_array_equal(out, MODEL.apply({"params": params}, x, train=True, rngs=rngs))
  assert not np.allclose(out, APPLY(params, state, x)[0])
  # batch statistics: init's keywords reach init, training updates them by hand's rule
  init, apply = jaxdl.from_linen(Normed(), np.zeros((2, FEATURES), np.float32), train=False)
  params, state = init(jax.random.key(0))
  assert set(state) == {"batch_stats"} and set(params) == {"Dense_0", "BatchNorm_0"}
  out, new = apply(params, state, x, train=True)
  h = x @ np.asarray(params["Dense_0"]["kernel"]) + np.asarray(params["Dense_0"]["bias"])
  stats = new["batch_stats"]["BatchNorm_0"]
  np.testing.assert_allclose(stats["mean"], 0.5 * h.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["var"], 0.5 + 0.5 * h.var(0), rtol=1e-5)
  np.testing.assert_allclose(out, (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-5), rtol=1e-4,
                             atol=1e-5)
  # evaluation reads them and leaves them
  out, same = apply(params, new, x, train=False)
  assert same is new or jax.tree.all(jax.tree.map(np.array_equal, same, new))
  np.testing.assert_allclose(out, (h - stats["mean"]) / np.sqrt(stats["var"] + 1e-5),
                             rtol=1e-4, atol=1e-5)
  # a model without parameters has an empty dict of them
  class Twice(nn.Module):
    def __call__(self, x):
      return 2 * x
  init, apply = jaxdl.from_linen(Twice(), x)
  assert init(jax.random.key(0)) == ({}, {})


def test_a_weighted_tasks_own_loss_evaluates_as_its_batchs_mean():
  """Without `evaluate`, a weighted task's test loss is its loss with every
  example weighted 1/B: the batch's mean, whatever the data's shape."""
  def loss(params, model_state, batch, key):
    per_example = jnp.sum(batch["x"], axis=1) * params["w"]
    return jnp.sum(per_example * batch["weight"]), (model_state, {})

  task = jaxdl.Task(init=lambda key: ({"w": jnp.float32(2.0)}, {}), loss=loss, weighted=True)
  x = np.arange(12, dtype=np.float32).reshape(4, 3)  # rows sum to 3, 12, 21, 30
  metrics = task.evaluation({"w": jnp.float32(2.0)}, {}, {"x": x})
  assert set(metrics) == {"loss"}
  np.testing.assert_allclose(metrics["loss"], 2.0 * 66 / 4, rtol=1e-6)


def test_a_zoo_classifier_is_named_by_its_data_and_model():
  """jaxdl.task.classification(model) for batches given otherwise: no data of
  its own, named images/<model>, evaluated by accuracy (higher is better);
  with a dataset, <dataset>/<model>."""
  from jaxdl.models import build_model
  from jaxdl.task import classification
  from tests.helpers import DIGITS
  model = build_model("mlp", DIGITS.num_classes, DIGITS.image_shape)
  task = classification(model)
  assert (task.name, task.target, task.higher_is_better) == ("images/mlp", "accuracy", True)
  assert task.train is None and task.test is None and task.weighted
  assert classification(model, DIGITS).name == "digits/mlp"  # with its data: named by both


def test_init_shapes_traces_an_initializer_once():
  """A task's (params, model_state) shapes are its initializer's, traced
  once however many parts of a run ask; an initializer that cannot be
  hashed (an instance of a mutable dataclass) is traced each time."""
  traces = []

  def init(key):
    traces.append(key)
    return {"w": jax.random.normal(key, (3, 2))}, {"count": jnp.zeros((), jnp.int32)}

  task = jaxdl.Task(init=init, loss=lambda *a, **k: None)
  shapes = task.init_shapes()
  assert task.init_shapes() is shapes and len(traces) == 1
  assert jax.tree.map(lambda x: (x.shape, x.dtype), shapes) == (
      {"w": ((3, 2), jnp.float32)}, {"count": ((), jnp.int32)})

  @dataclasses.dataclass
  class Init:  # eq=True, not frozen: unhashable
    calls: int = 0

    def __call__(self, key):
      self.calls += 1
      return init(key)

  unhashable = Init()
  other = jaxdl.Task(init=unhashable, loss=lambda *a, **k: None)
  assert jax.tree.map(lambda x: x.shape, other.init_shapes()) == jax.tree.map(
      lambda x: x.shape, shapes)
  other.init_shapes()
  assert unhashable.calls == 2


@pytest.mark.parametrize("name", task_names())
def test_every_registered_task_trains_by_its_name(name, tmp_path):
  """A registered task runs from its command-line name (--dataset task:NAME),
  twice to the same bits, and is evaluated by its target metric."""
  runs = [jaxdl.run(RunConfig.make(dataset=f"task:{name}", algorithm="sgd", steps=4,
                                   progress=False, out=str(tmp_path / str(i))))
          for i in range(2)]
  assert runs[0]["params_fingerprint"] == runs[1]["params_fingerprint"]
  assert np.isfinite(runs[0][registered(name).target_metric])
