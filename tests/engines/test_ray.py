"""The ray engine: a parameter server and its workers as real processes.

One local Ray instance serves the module (in a short temporary directory,
authentication off: a test's own instance only); a real run's trace replays
on the sim engine to the same parameters, bit for bit."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import psutil
import pytest

import jaxdl
from jaxdl import trace
from jaxdl.build import prepare
from jaxdl.config import RunConfig
from jaxdl.engines import ray_driver
from jaxdl.engines.sim import message_bytes
from jaxdl.errors import ConfigError
from jaxdl.validation import validate
from tests import marks
from tests.engines.test_own_programs import MEASURED, near_speeds
from tests.helpers import jaxdl_command, make_engine

RUN = dict(dataset="digits", model="mlp", steps=12, batch_size=16, progress=False,
           eval_every=6)


@pytest.fixture(scope="module")
def ray_instance():
  ray = pytest.importorskip("ray")
  temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Unix socket paths stay short
  env = {"RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": temp}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  ray_driver.connect(None)
  yield ray
  ray.shutdown()
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v


def _replayed(tmp_path):
  """The sim engine's run along a ray run's trace, with the ray run's config."""
  config = RunConfig.load(str(tmp_path / "ray" / "config.json")).replace(
      engine="sim", out=str(tmp_path / "sim"), replay=str(tmp_path / "ray" / "trace.jsonl"))
  return jaxdl.run(config)


@pytest.mark.parametrize("name,settings", [
    ("asp", {}), marks.slow("ssp", {"staleness_bound": 1}),
    # a server in 2 shard actors, each applying its leaves of every push
    marks.slow("asp", {"servers": 2, "optimizer": "adam", "lr": 0.003, "pin_workers": True}),
    marks.slow("dc_asgd", {}),
    marks.slow("lc_asgd", {}),
    marks.slow("lc_asgd", {"servers": 2})])
def test_a_ray_run_replays_bit_for_bit_on_the_sim(ray_instance, tmp_path, name, settings):
  m, k = 3, settings.get("servers", 1)
  config = RunConfig.make(algorithm=name, engine="ray", workers=m, out=str(tmp_path / "ray"),
                          **settings, **RUN)
  ray_run = jaxdl.run(config)
  assert ray_run["status"] == "completed" and ray_run["engine"] == "ray"
  events = list(trace.read_trace(tmp_path / "ray" / "trace.jsonl"))
  applies = [e for e in events if e.kind == "apply"]
  # the budget: 12 steps of 3 x 16 samples, every worker working until it is spent
  assert len(applies) == 12 * m and {e.worker for e in applies} == set(range(m))
  assert [e.version for e in applies] == list(range(1, 12 * m + 1))
  assert all(a.time <= b.time for a, b in zip(events, events[1:]))
  assert sum(ray_run["batches_per_worker"]) == 12 * m
  assert ray_run["trace_time_s"] == events[-1].time and ray_run["central_cpu_s"] > 0
  processes = json.loads((tmp_path / "ray" / "cluster.json").read_text())["processes"]
  shards = [f"server shard {s}" for s in range(k)] if k > 1 else []
  assert [p["role"] for p in processes] == ["driver", "server", *shards] + [
      f"worker {w}" for w in range(m)]
  assert len({p["pid"] for p in processes}) == len(processes) == m + 2 + len(shards)
  assert processes[0]["pid"] == os.getpid()
  cores = sorted(os.sched_getaffinity(0))
  for w, p in enumerate(processes[-m:]):  # --pin-workers: worker w on core w mod the cores
    assert p["cores"] == ([cores[w % len(cores)]] if settings.get("pin_workers") else cores)
  assert ray_run["test_accuracy"] > 0.5
  replayed = _replayed(tmp_path)
  assert replayed["params_fingerprint"] == ray_run["params_fingerprint"]
  assert replayed["model_state_fingerprint"] == ray_run["model_state_fingerprint"]
  assert replayed["test_accuracy"] == ray_run["test_accuracy"]
  # killed after its last checkpoint, before its summary: resumed, it runs no
  # step; the figures of its trace are the whole run's, and it says that
  # those counted as it runs (bytes on the wire) are of the steps after 12
  (tmp_path / "ray" / "summary.json").unlink()
  again = jaxdl.run(config.replace(resume=True))
  assert again["params_fingerprint"] == ray_run["params_fingerprint"]
  assert again["measured_from_step"] == 12 and again["bytes_total"] == 0
  for figure in ("batches_per_worker", "staleness_histogram", "wait_s", "trace_time_s"):
    assert again[figure] == ray_run[figure], figure


@pytest.mark.slow
@pytest.mark.parametrize("name,settings", [
    ("ad_psgd", {}), ("gosgd", {"gossip_probability": 0.5}), ("easgd", {"communication_period": 2})])
def test_workers_that_keep_their_own_models_replay_bit_for_bit(ray_instance, tmp_path, name,
                                                                settings):
  """EASGD (the center at the coordinator), GoSGD (messages from worker to
  worker, merged on arrival) and AD-PSGD (workers averaging with each other
  directly, each in one average at a time): every update of the budget is
  in the trace, each worker's events in its own order, and the sim's replay
  gives the same parameters, bit for bit, at the end and at the checkpoint
  halfway (a consistent cut of the workers' models)."""
  m = 3
  config = RunConfig.make(algorithm=name, engine="ray", workers=m, out=str(tmp_path / "ray"),
                          checkpoint_every=6, **settings, **RUN)
  ray_run = jaxdl.run(config)
  # it learned: the workers' last losses or the test loss of their averaged
  # models well below chance's, ln 10 = 2.30. (Not one of them alone: both depend
  # on how the 36 updates and the messages fell among the workers. On a loaded
  # machine, once a test accuracy of 0.14 with a training loss of 1.30, once a
  # training loss of 2.00 with a test loss of 1.62; the replay below checks the
  # run itself, bit for bit.)
  assert ray_run["status"] == "completed" and min(
      ray_run["train_loss"], ray_run["test_loss"]) < 0.8 * np.log(10), {
      k: ray_run[k] for k in ("test_accuracy", "test_loss", "train_loss")}
  events = list(trace.read_trace(tmp_path / "ray" / "trace.jsonl"))
  update = "apply" if name == "ad_psgd" else "local"
  updates = [e for e in events if e.kind == update]
  # the budget is shared: on a loaded machine a worker slow to start may find
  # it spent by the others, so not every worker need have updated
  assert len(updates) == 12 * m and len({e.worker for e in updates}) >= 2
  # every gradient's measured time: the event's duration and the worker's batch times
  computed = [e for e in events if e.kind == ("pull" if name == "ad_psgd" else "local")]
  assert all(e.duration > 0 for e in computed)
  for w in {e.worker for e in computed}:
    assert ray_run["batch_seconds_per_worker"][w] == pytest.approx(
        np.mean([e.duration for e in computed if e.worker == w]), rel=1e-6)
  # each worker's events in its program's order
  order = {"easgd": ["local", "exchange"], "gosgd": ["local", "send"]}.get(
      name, ["pull", "average", "apply"])
  for w in range(m):
    own = [(e.iteration, order.index(e.kind)) for e in events
           if e.worker == w and e.kind in order]
    assert own == sorted(own) and len(own) == len(set(own))
    if name == "ad_psgd":  # one average per iteration, with another worker, then its apply
      assert all(e.peer not in (w, -1) for e in events if e.worker == w and e.kind == "average")
      averages, applies = [i for i, k in own if k == 1], [i for i, k in own if k == 2]
      # (a worker's last average may have no apply: the others' applies spent
      # the budget in between, and the run was over)
      assert averages[:len(applies)] == applies and len(averages) - len(applies) in (0, 1)
    elif name == "gosgd":  # a message after a local step, to another worker, merged once
      sent = [(e.iteration, e.peer) for e in events if e.worker == w and e.kind == "send"]
      assert all(("local", i) in {(e.kind, e.iteration) for e in events if e.worker == w}
                 and k != w for i, k in sent)
      merged = [(e.iteration, e.peer) for e in events if e.worker == w and e.kind == "gossip"]
      assert set(merged) <= set(sent) and len(set(merged)) == len(merged)
      at = {(e.kind, e.iteration): i for i, e in enumerate(events) if e.worker == w}
      assert all(at["send", i] < at["gossip", i] for i, _ in merged)
      # one message in flight: each send after the merge of the worker's last
      mine = [e.kind for e in events if e.worker == w and e.kind in ("send", "gossip")]
      assert mine[::2] == ["send"] * len(mine[::2]) and "send" not in mine[1::2]
    else:  # an exchange after every second local step (but one the run's end cut off)
      exchanges = [i for i, k in own if k == 1]
      second = [i for i, k in own if k == 0 and i % 2 == 1]
      assert exchanges == second[:len(exchanges)] and len(second) - len(exchanges) <= 1
  replayed = _replayed(tmp_path)
  assert replayed["params_fingerprint"] == ray_run["params_fingerprint"]
  assert replayed["model_state_fingerprint"] == ray_run["model_state_fingerprint"]
  # the state at step 6, as the driver gathered it, is the replay's there
  at_6 = [next(r for r in map(json.loads, (tmp_path / run / "metrics.jsonl").open())
               if r["step"] == 6) for run in ("ray", "sim")]
  assert at_6[0]["test_loss"] == at_6[1]["test_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bsp", "local_sgd", "diloco"])
def test_a_collective_algorithm_on_processes_is_the_mesh_run(ray_instance, tmp_path, name):
  """BSP on two processes that jax.distributed joins (the algorithm's own
  step, its collectives across processes): the same parameters, bit for bit,
  as the mesh engine's run on two devices of one process."""
  config = RunConfig.make(algorithm=name, engine="ray", workers=2, out=str(tmp_path / "ray"),
                          checkpoint_every=6, **RUN)
  ray_run = jaxdl.run(config)
  processes = json.loads((tmp_path / "ray" / "cluster.json").read_text())["processes"]
  assert [p["role"] for p in processes] == ["driver", "worker 0", "worker 1"]
  assert len({p["pid"] for p in processes}) == 3
  mesh_run = jaxdl.run(config.replace(engine="mesh", out=str(tmp_path / "mesh")))
  assert mesh_run["devices"] == 2 and ray_run["processes"] == 3
  assert ray_run["params_fingerprint"] == mesh_run["params_fingerprint"]
  assert ray_run["test_accuracy"] == mesh_run["test_accuracy"] > 0.5
  # its figures as an asynchronous run's: each worker's waits, its clock, the
  # bytes its collectives moved as the simulator counts them
  sim = jaxdl.run(config.replace(engine="sim", out=str(tmp_path / "sim")))
  assert ray_run["bytes_total"] == sim["bytes_total"] > 0
  events = list(trace.read_trace(tmp_path / "ray" / "trace.jsonl"))
  assert ray_run["trace_time_s"] == events[-1].time > 0
  assert len(ray_run["wait_s"]) == 2 and 0 <= ray_run["idle_fraction"] < 1
  # resumed from its checkpoint at step 6: the state goes back to the processes
  shutil.rmtree(tmp_path / "ray" / "checkpoints" / "12")
  resumed = jaxdl.run(config.replace(resume=True))
  assert resumed["params_fingerprint"] == ray_run["params_fingerprint"]


class _Late:
  """An actor's method whose calls leave `seconds` late."""

  def __init__(self, method, seconds: float):
    self.method, self.seconds = method, seconds

  def remote(self, *args):
    time.sleep(self.seconds)
    return self.method.remote(*args)


@pytest.mark.slow
def test_a_collective_process_that_begins_its_steps_late_is_waited_for(ray_instance):
  """bsp on two processes (one program across them, `RayCollective`), the
  driver's call to process 1 leaving 0.5 s after its call to process 0 at
  every step: process 0 waits for it at the step's collectives, about 0.5 s
  a step less the time it takes to reach them ("wait" events; wait_s),
  process 1 hardly at all. (Under the slow suite's load process 0 reached a
  step's collectives 0.06 s late: 0.24 s of a delay of 0.3.)"""
  config = RunConfig.make(algorithm="bsp", engine="ray", workers=2, **RUN)
  engine = make_engine(config)
  try:
    actor = engine.workers[1]
    state = engine.init(jax.random.key(0))
    engine.workers[1] = type("Late", (), {"step": _Late(actor.step, 0.5)})()
    for t in range(4):
      state, _ = engine.step(state, t)
    engine.workers[1] = actor
    waits = [[e.duration for e in engine.trace() if e.kind == "wait" and e.worker == w]
             for w in range(2)]
    assert all(0.35 < d < 1.2 for d in waits[0]) and all(d < 0.1 for d in waits[1]), waits
    assert engine.figures()["wait_s"] == pytest.approx([sum(w) for w in waits])
  finally:
    engine.close()


HETEROGENEOUS = dict(algorithm="ar_sgd", engine="ray", workers=3, batch_sizes=(16, 16, 16),
                     worker_speeds=(1.0, 3.0, 3.0), compute_time=0.3, jitter=0.1,
                     **{k: v for k, v in RUN.items() if k != "batch_size"})


@pytest.mark.slow
def test_heterogeneous_workers_are_slowed_and_the_batch_split_by_measured_times(
    ray_instance, tmp_path):
  """Three worker processes of speeds 1:3:3, slowed for real (each sleeps
  until its batch has taken the modelled time), each running the
  algorithm's own step on its own share of the global batch of 48, split
  anew every 4 steps from the measured batch times: the slow worker's share
  falls well below the fast ones' (balanced: 48/7 against 3 x 48/7), the
  splits are in the trace and always sum to 48, and the sim's replay of the
  trace, the same partitions on the simulator's vmapped workers, gives the
  same losses (not bit for bit: each worker's program sums its own padded
  batch)."""
  config = RunConfig.make(partition="adaptive", rebalance_every=4, out=str(tmp_path / "ray"),
                          **HETEROGENEOUS)
  ray_run = jaxdl.run(config)
  assert ray_run["status"] == "completed"
  events = list(trace.read_trace(tmp_path / "ray" / "trace.jsonl"))
  splits = [e for e in events if e.kind == "partition"]
  assert [e.iteration for e in splits][:1] == [1] and all(sum(e.sizes) == 48 for e in splits)
  slow, *fast = splits[-1].sizes
  assert slow <= 12 and min(fast) >= 16, splits[-1].sizes
  assert len([e for e in events if e.kind == "step"]) == 12
  # measured: each worker's batches as long as modelled (0.3 s for the slow
  # worker's 16, then about 48 / 7 x 0.3 / 16 = 0.13 s balanced), its idle time
  assert min(ray_run["batch_seconds_per_worker"]) >= 0.09, ray_run["batch_seconds_per_worker"]
  assert 0 <= ray_run["idle_fraction"] < 1 and ray_run["trace_time_s"] == events[-1].time
  assert ray_run["reduce"] == "host" and ray_run["reduce_s"] > 0
  assert len(ray_run["compile_s_per_worker"]) == 3
  processes = json.loads((tmp_path / "ray" / "cluster.json").read_text())["processes"]
  assert [p["role"] for p in processes] == ["driver", "exchange"] + [
      f"worker {w}" for w in range(3)]
  replayed = _replayed(tmp_path)
  for k in ("test_loss", "train_loss"):
    assert replayed[k] == pytest.approx(ray_run[k], rel=1e-5), k
  assert replayed["test_accuracy"] == ray_run["test_accuracy"] > 0.5


@pytest.mark.slow
def test_measured_splits_on_processes_hold_in_each_of_5_runs(ray_instance, tmp_path):
  """Three worker processes of speeds 1:3:3 made real (--compute-time 0.3),
  B = 96: proportional's split after a warm-up of three steps, from steady
  batch times (each compiled step's first run untimed, before the step), is
  within 5% of (1:3:3) x 96 in each of 5 runs (tests/engines/test_own_programs.py:
  near_speeds), a run whose split is off repeated once and at most two
  repeated (beside the slow suite's other tests a worker's 0.1 s batch was
  once delayed enough to move a split to (16, 34, 46)); adaptive's workers
  (a split after the first step) idle no
  more than proportional's median run (up to three adaptive runs: a loaded
  machine's delays add waits to any run); and each run's summary has its
  workers' waits, its clock and its bytes, the simulator's count for the
  same run."""
  config = RunConfig.make(**{**MEASURED, "engine": "ray", "rebalance_every": 3, "steps": 5})
  sim = jaxdl.run(config.replace(engine="sim", out=str(tmp_path / "sim")))
  idle, repeated = [], []
  for run in range(5):
    for attempt in range(2):
      out = tmp_path / f"{run}-{attempt}"
      summary = jaxdl.run(config.replace(out=str(out)))
      events = list(trace.read_trace(out / "trace.jsonl"))
      splits = [e.sizes for e in events if e.kind == "partition"]
      if len(splits) == 1 and near_speeds(splits[0]):
        break
      repeated.append((run, splits))
    assert len(splits) == 1 and near_speeds(splits[0]), (run, splits)
    assert summary["untimed_runs_per_worker"] == [2, 2, 2]
    assert summary["bytes_total"] == sim["bytes_total"] > 0
    assert summary["trace_time_s"] == events[-1].time and len(summary["wait_s"]) == 3
    idle.append(summary["idle_fraction"])
  assert len(repeated) <= 2, repeated
  adaptive = []
  for run in range(3):
    adaptive.append(jaxdl.run(config.replace(partition="adaptive", out=str(
        tmp_path / f"adaptive{run}")))["idle_fraction"])
    if adaptive[-1] <= np.median(idle):
      return
  pytest.fail(f"adaptive idled more than proportional's median: {adaptive}, {idle}")


@pytest.mark.slow
def test_the_two_reductions_of_slowed_workers_give_the_same_parameters(ray_instance,
                                                                        tmp_path):
  """Equal static shares of slowed workers (--compute-time): summed in host
  memory or on a device, the same parameters bit for bit; and within float
  rounding of the simulator's run of the same config."""
  runs = {r: jaxdl.run(RunConfig.make(reduce=r, out=str(tmp_path / r), **HETEROGENEOUS))
          for r in ("host", "device")}
  assert runs["host"]["params_fingerprint"] == runs["device"]["params_fingerprint"]
  assert runs["device"]["reduce"] == "device" and runs["device"]["reduce_s"] > 0
  sim = jaxdl.run(RunConfig.make(**{**HETEROGENEOUS, "engine": "sim"},
                                 out=str(tmp_path / "sim")))
  assert sim["test_loss"] == pytest.approx(runs["host"]["test_loss"], rel=1e-5)


def _sends_what_it_counts(tmp_path, ray_run) -> None:
  """The ray run's bytes (the serialized messages its actors sent) are
  within 10% of what the sim counts for its trace's messages, and the sim's
  replay of the trace gives its parameters, bit for bit."""
  built = prepare(RunConfig.load(str(tmp_path / "ray" / "config.json")))
  modelled = message_bytes(built.algorithm, built.problem,
                           list(trace.read_trace(tmp_path / "ray" / "trace.jsonl")))
  assert ray_run["bytes_total"] == pytest.approx(modelled, rel=0.1)
  assert _replayed(tmp_path)["params_fingerprint"] == ray_run["params_fingerprint"]


def test_wire_bytes_are_what_ray_serializes():
  """A message's measured size (pickle protocol 5, its buffers out of
  band) is the size of Ray's own pickling of it, within a few bytes: a
  packed top-k payload of the mlp's 6 leaves, 4,088 bytes of values and
  indices, serializes to 4,088 and a header of under 200 bytes."""
  cloudpickle = pytest.importorskip("ray").cloudpickle
  from jaxdl.engines.ray_messages import packed, unpacked, wire_bytes
  rng = np.random.default_rng(0)
  leaves = [x for k in (164, 3, 328, 2, 13, 1) for x in (
      rng.normal(size=k).astype(np.float32), rng.integers(0, 1000, k).astype(np.int32))]
  message = packed(leaves)
  assert message.nbytes == 4_088 < wire_bytes(message) < 4_088 + 200
  assert abs(wire_bytes(message) - len(cloudpickle.dumps(message))) < 16
  for a, b in zip(unpacked(message, leaves), leaves):
    np.testing.assert_array_equal(a, b)


def test_a_compressed_parameter_server_sends_its_payloads(ray_instance, tmp_path):
  """asp with top-k 1% of every push and every reply (--compress-pull) on
  real processes: each message is its payload, 4,088 bytes of values and
  int32 indices, not the dense 203,304 (the run's bytes within 10% of the
  sim's count: 3% over, the serialization's headers), the error-feedback
  residuals and the workers' copies stay with their workers (deposited at
  the checkpoint halfway), and the trace replays bit for bit."""
  ray_run = jaxdl.run(RunConfig.make(algorithm="asp", engine="ray", workers=3,
                                     compress="topk:0.01", compress_pull="topk:0.01",
                                     checkpoint_every=6, out=str(tmp_path / "ray"), **RUN))
  assert ray_run["status"] == "completed"
  assert ray_run["bytes_total"] < 0.03 * 74 * 203_304  # a dense pull or push: 2% of 74
  _sends_what_it_counts(tmp_path, ray_run)


@pytest.mark.slow
@pytest.mark.parametrize("name,settings", [
    ("gosgd", {"gossip_probability": 0.5, "compress": "topk:0.05"}),
    ("ad_psgd", {"compress": "topk:0.05"}), ("ad_psgd", {"compress": "powersgd:2"}),
    ("easgd", {"communication_period": 1, "compress": "qsgd:4"}),
    ("ssp", {"staleness_bound": 1, "compress": "sign", "compress_pull": "randk:0.05"}),
    ("dc_asgd", {"compress": "powersgd:2", "compress_pull": "topk:0.05"}),
    ("lc_asgd", {"servers": 2, "compress": "randk:0.05", "compress_pull": "qsgd:4"}),
    ("asp", {"compress": "none", "compress_pull": "sign"})])
def test_compressed_messages_travel_as_payloads_and_replay_bit_for_bit(ray_instance, tmp_path,
                                                                       name, settings):
  """Every compressed message on real processes as its payload: gossip
  messages and the two halves of an average (a compressed difference from
  the pair's reference), an elastic difference (the center's model read
  first, whole), a parameter server's pushes and replies (its shards' parts
  of them): the bytes sent within 10% of the sim's count, and the sim's
  replay of the trace gives the same parameters, bit for bit (checkpoints
  halfway: the workers' cuts)."""
  config = RunConfig.make(algorithm=name, engine="ray", workers=3, checkpoint_every=6,
                          out=str(tmp_path / "ray"), **settings, **RUN)
  ray_run = jaxdl.run(config)
  assert ray_run["status"] == "completed"
  events = list(trace.read_trace(tmp_path / "ray" / "trace.jsonl"))
  assert any(e.kind in ("gossip", "average", "exchange", "apply") for e in events)
  _sends_what_it_counts(tmp_path, ray_run)


@pytest.mark.slow
def test_a_resumed_gossip_run_replays_bit_for_bit(ray_instance, tmp_path):
  """GoSGD resumed from its checkpoint at step 6 (the last one removed):
  the messages in flight there are not in the checkpoint, and the trace of
  both runs together, which records their sending and no arrival, replays
  to the resumed run's parameters."""
  config = RunConfig.make(algorithm="gosgd", engine="ray", workers=3, gossip_probability=1.0,
                          out=str(tmp_path / "ray"), checkpoint_every=6, **RUN)
  jaxdl.run(config)
  shutil.rmtree(tmp_path / "ray" / "checkpoints" / "12")
  resumed = jaxdl.run(config.replace(resume=True))  # a new real run from step 6 on
  assert resumed["status"] == "completed"
  events = list(trace.read_trace(tmp_path / "ray" / "trace.jsonl"))
  assert sum(e.kind == "local" for e in events) == 12 * 3
  assert _replayed(tmp_path)["params_fingerprint"] == resumed["params_fingerprint"]


@pytest.mark.slow
@pytest.mark.parametrize("bound", [0, 2])
def test_the_server_enforces_ssp_bound_between_real_processes(ray_instance, tmp_path, bound):
  m = 3
  jaxdl.run(RunConfig.make(algorithm="ssp", engine="ray", workers=m, staleness_bound=bound,
                           out=str(tmp_path / "ray"), **RUN))
  clocks = [0] * m
  for e in trace.read_trace(tmp_path / "ray" / "trace.jsonl"):
    if e.kind == "pull":
      assert e.iteration == clocks[e.worker] and min(clocks) >= e.iteration - bound
    elif e.kind == "apply":
      clocks[e.worker] += 1
    assert max(clocks) - min(clocks) <= bound + 1


def test_no_actor_outlives_its_run(ray_instance, tmp_path):
  jaxdl.run(RunConfig.make(algorithm="asp", engine="ray", workers=2, out=str(tmp_path / "r"),
                           **RUN))
  processes = json.loads((tmp_path / "r" / "cluster.json").read_text())["processes"]
  # a server and 2 workers, each its own process (Ray may start an actor in
  # a worker process it had started beforehand, idle)
  actors = {p["pid"] for p in processes[1:]}
  assert len(actors) == 3 and os.getpid() not in actors
  psutil.wait_procs([psutil.Process(p) for p in actors if psutil.pid_exists(p)], timeout=10)
  assert not any(psutil.pid_exists(p) for p in actors)


LOCAL = """
import os, sys, psutil
from jaxdl.engines.ray_driver import connect
import ray
assert connect(None)
me = psutil.Process()
processes = [me, *me.children(recursive=True)]
listening = {c.laddr.ip for p in processes
             for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN}
# Ray's API server runs in any case; the dashboard is its web frontend
dashboard = [p.pid for p in processes[1:] if "dashboard/dashboard.py" in " ".join(p.cmdline())
             and "--disable-frontend" not in p.cmdline()]
ray.shutdown()
print(sorted(listening), dashboard)
"""


def test_a_local_instance_listens_on_the_loopback_address_only(tmp_path):
  temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
  env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": temp}
  out = subprocess.run([sys.executable, "-c", LOCAL], env=env, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  listening, dashboard = out.stdout.strip().splitlines()[-1].split("] ")
  listening = eval(listening + "]")
  assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip in listening)
  assert dashboard == "[]"  # no web frontend


def test_ray_refuses_what_it_cannot_run():
  with pytest.raises(ConfigError, match="--ray-address='localhost:1' is not valid: left unset "
                     "with --engine sim"):
    validate(RunConfig.make(algorithm="asp", engine="sim", workers=2,
                                         ray_address="localhost:1"))
  with pytest.raises(ConfigError, match="--servers=2 is not valid: 1 with --engine ray for "
                     "easgd, whose center is one actor"):
    validate(RunConfig.make(algorithm="easgd", engine="ray", workers=2, servers=2))
  # Ray itself would retry an address where nothing listens for minutes
  for address, why in (("nowhere", ""), ("127.0.0.1:1", "; nothing answers there")):
    with pytest.raises(ConfigError, match=f"--ray-address='{address}' is not valid: the "
                       r"address HOST:PORT of a running Ray cluster \(`ray start --head`\)"
                       + why):
      ray_driver.connect(address)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _processes_of(temp: str) -> list:
  return [p for p in psutil.process_iter(["cmdline"]) if temp in " ".join(p.info["cmdline"] or [])]


def _stop(temp: str) -> None:
  """Stops the Ray processes of the head started in `temp` (`ray stop` would
  stop every Ray instance on the machine, other tests' included)."""
  heads = _processes_of(temp)
  tree = heads + [c for p in heads for c in p.children(recursive=True)]
  for p in tree:
    p.kill()
  psutil.wait_procs(tree, timeout=10)


@pytest.mark.slow
def test_a_run_joins_a_cluster_started_with_ray_start(tmp_path):
  """`ray start --head` on the loopback address, as on a cluster's first
  machine; `jaxdl run --ray-address` runs its actors there."""
  temp, port = tempfile.mkdtemp(prefix="ray", dir="/tmp"), _free_port()
  env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": temp,
         "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
  ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
  subprocess.run([ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                  "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                 env=env, check=True, capture_output=True, timeout=120)
  try:
    out = tmp_path / "run"
    run = subprocess.run(
        [sys.executable, "-m", "jaxdl", "run", "--algorithm", "asp", "--engine", "ray",
         "--workers", "2", "--model", "mlp", "--steps", "6", "--batch-size", "16",
         "--no-progress", "--out", str(out), "--ray-address", f"127.0.0.1:{port}"],
        env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["engine"] == "ray"
    processes = json.loads((out / "cluster.json").read_text())["processes"]
    assert len(processes) == 4 and len({p["pid"] for p in processes}) == 4
    actors = [p["pid"] for p in processes[1:]]
    psutil.wait_procs([psutil.Process(p) for p in actors if psutil.pid_exists(p)], timeout=10)
    assert not any(psutil.pid_exists(p) for p in actors)  # the cluster stays, the actors go
  finally:
    _stop(temp)
  assert not _processes_of(temp)


def _popen(out, temp: str, steps: int, *flags: str, algorithm: str = "asp") -> subprocess.Popen:
  """`jaxdl run --engine ray` with 2 workers, as a process of its own."""
  env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": temp}
  return subprocess.Popen(
      jaxdl_command("run", "--algorithm", algorithm, "--engine", "ray", "--workers", "2",
                    "--model", "mlp", "--steps", str(steps), "--batch-size", "16",
                    "--no-progress", "--out", str(out), *flags), env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_trace(run: subprocess.Popen, out) -> list[dict]:
  """Waits until the run has written its first checkpoint's trace; its processes."""
  deadline = time.time() + 240
  while not (out / "trace.jsonl").exists():
    assert run.poll() is None and time.time() < deadline, run.stderr.read()[-2000:]
    time.sleep(0.2)
  return json.loads((out / "cluster.json").read_text())["processes"]


def _replays(out, tmp_path) -> None:
  summary = json.loads((out / "summary.json").read_text())
  replayed = jaxdl.run(RunConfig.load(str(out / "config.json")).replace(
      engine="sim", out=str(tmp_path / "sim"), replay=str(out / "trace.jsonl"), resume=False))
  assert replayed["params_fingerprint"] == summary["params_fingerprint"]


@pytest.mark.slow
def test_ctrl_c_stops_every_actor(tmp_path):
  """SIGINT to a ray run's driver mid-run: exit code 130, and every process
  cluster.json lists is gone."""
  temp, out = tempfile.mkdtemp(prefix="ray", dir="/tmp"), tmp_path / "run"
  run = _popen(out, temp, 100000)
  try:
    actors = [p["pid"] for p in _wait_for_trace(run, out)]
    run.send_signal(signal.SIGINT)
    try:  # stopping a local Ray instance takes seconds, more on a loaded machine
      code = run.wait(timeout=180)
    except subprocess.TimeoutExpired:  # where the driver waits: its threads' stacks
      run.send_signal(signal.SIGUSR1)
      time.sleep(2)
      run.kill()
      pytest.fail(f"SIGINT did not end the run; its stderr ends: {run.communicate()[1][-6000:]}")
    assert code == 130, run.stderr.read()[-3000:]  # what ended it otherwise
  finally:
    run.kill()
  psutil.wait_procs([psutil.Process(p) for p in actors if psutil.pid_exists(p)], timeout=15)
  assert not any(psutil.pid_exists(p) for p in actors)
  assert not _processes_of(temp)  # nor the local Ray instance


def _kill_worker_1(out, steps: int, algorithm: str, *flags: str) -> list[trace.Event]:
  """A 2-worker run whose worker 1's process gets SIGKILL once the first
  checkpoint is written; asserts it completes with that worker restarted
  once, and returns its trace."""
  # Ray takes about 3.5 s to bring the worker back here, in which the other
  # does hundreds of updates alone: the run is long enough to see it work on
  run = _popen(out, tempfile.mkdtemp(prefix="ray", dir="/tmp"), steps, "--checkpoint-every",
               "50", *flags, algorithm=algorithm)
  try:
    [worker] = [p for p in _wait_for_trace(run, out) if p["role"] == "worker 1"]
    os.kill(worker["pid"], signal.SIGKILL)
    try:  # ad_psgd's 2,000 steps: 1.5 min on an idle 2-core machine, about 3 beside other tests
      _, stderr = run.communicate(timeout=600)
    except subprocess.TimeoutExpired:  # where the driver waits: its threads' stacks
      run.send_signal(signal.SIGUSR1)
      time.sleep(2)
      run.kill()
      pytest.fail(f"the run did not end; its stderr ends: {run.communicate()[1][-6000:]}")
    assert run.returncode == 0, stderr[-2000:]
  finally:
    run.kill()
  summary = json.loads((out / "summary.json").read_text())
  assert summary["restarts_per_worker"] == [0, 1] and summary["steps"] == steps
  return list(trace.read_trace(out / "trace.jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize("servers", [1, 2])
def test_a_killed_worker_is_restarted_and_nothing_is_lost(tmp_path, servers):
  """SIGKILL to a worker's process mid-run: Ray restarts it, it pulls fresh
  parameters at its clock, the run completes with every update of its budget
  at the server (or its shards), the trace and summary record the restart,
  and the trace still replays bit for bit."""
  out, steps = tmp_path / "ray", 1000
  events = _kill_worker_1(out, steps, "asp", "--servers", str(servers))
  restarts = [e for e in events if e.kind == "restart"]
  assert [e.worker for e in restarts] == [1]
  applies = [e for e in events if e.kind == "apply"]
  assert [e.version for e in applies] == list(range(1, 2 * steps + 1))  # none lost
  assert any(e.worker == 1 for e in applies if e.time > restarts[0].time)  # it works on
  _replays(out, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["easgd", "gosgd", "ad_psgd"])
def test_a_killed_worker_that_kept_its_own_model_rejoins_with_a_peers(tmp_path, name):
  """SIGKILL to the process of a worker that keeps its own model: Ray
  restarts it, it rejoins with a copy of the other worker's state (a
  "restart" event naming that peer, at its clock), works on, the run
  completes its budget, and the trace replays bit for bit."""
  # the budget is shared: the live worker alone spends what is left while Ray
  # brings the other back (3.5 s here, several times that on a loaded
  # machine), and a worker back after the end has nothing to rejoin
  out, steps = tmp_path / "ray", 2000
  events = _kill_worker_1(out, steps, name)
  [at] = [i for i, e in enumerate(events) if e.kind == "restart"]
  restart = events[at]
  assert (restart.worker, restart.peer) == (1, 0)
  updates = lambda part: [e.iteration for e in part if e.kind in ("apply", "local")
                          and e.worker == 1]
  assert restart.iteration == len(updates(events[:at]))  # at its clock
  assert updates(events[at:])[:1] == [restart.iteration]  # it works on from there
  if name == "gosgd":  # a message is merged once, by its receiver or back by its sender
    merged = [(e.worker, e.iteration) for e in events if e.kind == "gossip"]
    sent = [(e.worker, e.iteration) for e in events[:at] if e.kind == "send"]
    assert len(set(merged)) == len(merged)
    # none of the live worker's is lost (the dead one's last may have died with it)
    assert {s for s in sent if s[0] == 0} <= set(merged)
  _replays(out, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("servers", [1, 2])
def test_a_killed_driver_resumes_from_its_checkpoint(tmp_path, servers):
  """SIGKILL to the driver mid-run: its local Ray instance and actors go with
  it; --resume continues from the last checkpoint to the full budget (a
  sharded server's shards given their leaves of it), and the trace of the
  two processes together replays bit for bit."""
  temp, out, steps = tempfile.mkdtemp(prefix="ray", dir="/tmp"), tmp_path / "ray", 300
  flags = ("--checkpoint-every", "10", "--servers", str(servers))
  run = _popen(out, temp, steps, *flags)
  try:
    actors = [p["pid"] for p in _wait_for_trace(run, out)]
    run.kill()
    run.wait(timeout=60)
  finally:
    run.kill()
  psutil.wait_procs([psutil.Process(p) for p in actors if psutil.pid_exists(p)], timeout=30)
  assert not any(psutil.pid_exists(p) for p in actors)
  resumed = _popen(out, temp, steps, *flags, "--resume")
  _, stderr = resumed.communicate(timeout=300)
  assert resumed.returncode == 0, stderr[-2000:]
  applies = [e for e in trace.read_trace(out / "trace.jsonl") if e.kind == "apply"]
  assert [e.version for e in applies] == list(range(1, 2 * steps + 1))
  _replays(out, tmp_path)


def _regression_task() -> jaxdl.Task:
  """A script's own task: a linear model, squared error, data from a
  function of (worker, step, seed)."""
  import jax.numpy as jnp
  w_true = np.arange(1.0, 5.0, dtype=np.float32)

  def batch(worker, step, seed):
    x = np.random.default_rng([seed, worker, step]).normal(size=(16, 4)).astype(np.float32)
    return {"x": x, "y": x @ w_true}

  def loss(params, model_state, batch, key):
    return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2), (model_state, {})

  return jaxdl.Task(init=lambda key: ({"w": jnp.zeros(4)}, {}), loss=loss,
                    train=jaxdl.FunctionData(batch, 10), name="regression")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["asp", "bsp", "easgd", "gosgd", "ad_psgd"])
def test_a_scripts_own_task_runs_on_ray_and_replays(ray_instance, tmp_path, name):
  """One algorithm of each family trains a script's own task on ray, and its
  run is the sim's replay of its trace (a collective one: the mesh's run)."""
  # 60 steps: in 30, EASGD's loss fell to 0.19-0.33 of its first in the
  # orders a jittered simulator gives (0.40 once on ray); in 60, to 0.03
  config = RunConfig.make(algorithm=name, engine="ray", workers=2, steps=60, batch_size=16,
                          progress=False, lr=0.05, momentum=0.0, out=str(tmp_path / "ray"))
  ray_run = jaxdl.run(config, task=_regression_task())
  first = json.loads((tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()[0])
  assert ray_run["train_loss"] < 0.3 * first["train_loss"]
  again = (config.replace(engine="mesh", out=str(tmp_path / "mesh")) if name == "bsp" else
           config.replace(engine="sim", out=str(tmp_path / "sim"),
                          replay=str(tmp_path / "ray" / "trace.jsonl")))
  assert jaxdl.run(again, task=_regression_task())["params_fingerprint"] == (
      ray_run["params_fingerprint"])


@pytest.mark.slow
def test_compare_on_ray_gives_the_simulators_tables_with_measured_times(ray_instance,
                                                                         tmp_path):
  from jaxdl.cli import main
  out = tmp_path / "cmp"
  assert main(["compare", "--engine", "ray", "--algorithms", "sgd", "asp", "--workers", "2",
               "--steps", "8", "--out", str(out), "--no-progress"]) == 0
  report = (out / "report.md").read_text()
  assert "### Test accuracy" in report and "| asp ×2 |" in report
  for cell in ("sgd-m1", "asp-m2"):
    summary = json.loads((out / cell / "summary.json").read_text())
    assert summary["engine"] == "ray" and summary["samples_per_s"] > 0
    assert "simulated_time_s" not in summary


def test_a_cut_handed_to_a_process_that_died_is_given_its_restart_model():
  """The coordinator hands a worker the cuts it owes with the grant of its
  next event; if its process dies before depositing them, its rejoin gives
  them the model it restarts with, and the driver's wait for that step ends
  (it used to wait forever)."""
  import asyncio

  import jax

  from jaxdl.engines.base import slice_of
  from jaxdl.engines.events import take
  from jaxdl.engines.ray_coordinator import Coordinator
  from jaxdl.engines.ray_driver import RayFields

  async def scenario():
    config = RunConfig.make(algorithm="easgd", workers=2, **dict(RUN, steps=4))
    coordinator = Coordinator(slice_of(config, RayFields), observed=[0])
    _, workers, _ = coordinator.initialize(np.asarray(jax.random.key_data(jax.random.key(0))))
    coordinator.begin(None, 0)
    for w in (0, 1):  # step 0 ends: each worker owes its model there
      assert (await coordinator.ticket(w, "local", 0, incarnation=0))[0]
    granted, owed = await coordinator.ticket(1, "local", 1, incarnation=0)
    assert granted and owed == {1: [0]}  # ... and worker 1's process dies with them
    _, owed = await coordinator.ticket(0, "local", 1, incarnation=0)
    await coordinator.deposit(owed, {0: take(workers, 0)})
    donor = jax.tree.map(lambda x: x + 1, take(workers, 0))
    assert await coordinator.rejoin(1, 0, donor) == (True, 2, 1)
    state, _ = await asyncio.wait_for(coordinator.step(0), timeout=10)
    assert all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(take(state[1], 1)), jax.tree.leaves(donor)))
    # a call of the dead process's incarnation is refused
    assert await coordinator.ticket(1, "local", 2, incarnation=0) == (False, {})

  asyncio.run(scenario())


def test_a_cut_that_comes_while_a_worker_holds_the_center_precedes_its_exchange():
  """EASGD: worker 0 takes the center for its exchange, and worker 1's local
  step ends step 0, a step the driver reads, before the exchange comes back.
  In the trace the cut precedes the exchange, so the coordinator hands it to
  worker 0 with the exchange's answer, for its model from before the
  exchange (it used to be deposited at worker 0's next event, after the
  exchange: a run resumed from that checkpoint did not replay)."""
  import asyncio

  import jax

  from jaxdl.engines.base import slice_of
  from jaxdl.engines.events import take
  from jaxdl.engines.ray_coordinator import Coordinator
  from jaxdl.engines.ray_driver import RayFields
  from jaxdl.engines.ray_messages import packed

  async def scenario():
    config = RunConfig.make(algorithm="easgd", workers=2, **dict(RUN, steps=4))
    coordinator = Coordinator(slice_of(config, RayFields), observed=[0])
    _, workers, _ = coordinator.initialize(np.asarray(jax.random.key_data(jax.random.key(0))))
    coordinator.begin(None, 0)
    coordinator.warm_up()
    assert (await coordinator.ticket(0, "local", 0, incarnation=0))[0]
    center, owed = await coordinator.lend(0, incarnation=0)
    assert center is not None and owed == {}
    assert (await coordinator.ticket(1, "local", 0, incarnation=0))[0]  # step 0 ends
    _, message = coordinator.programs.meet(take(workers, 0), coordinator.server)
    done, owed = await coordinator.give(0, 0, packed(jax.tree.leaves(message)), incarnation=0)
    assert done and owed == {0: [0]}
    assert [e.kind for e in coordinator.events] == ["local", "local", "exchange"]

  asyncio.run(scenario())
