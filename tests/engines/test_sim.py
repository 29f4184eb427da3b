"""The sim engine: reproducible runs, replayed traces, resumption, and the
same math as the mesh engine for collective algorithms."""
import json
import os
import shutil
import subprocess
import sys

import chex
import pytest

import jaxdl
from jaxdl.config import RunConfig
from tests import marks
from tests.helpers import make_engine, train

RUN = dict(model="mlp", epochs=1, workers=4, batch_size=8, progress=False,
           schedule="constant", momentum=0.0, lr=0.1, jitter=0.3)


@pytest.mark.slow
def test_sim_runs_are_reproducible_and_replayable(tmp_path):
  a = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "a"), **RUN))
  b = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "b"), **RUN))
  trace = (tmp_path / "a" / "trace.jsonl").read_text()
  assert a["params_fingerprint"] == b["params_fingerprint"]
  assert trace == (tmp_path / "b" / "trace.jsonl").read_text()
  replayed = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "r"),
                                      replay=str(tmp_path / "a" / "trace.jsonl"), **RUN))
  assert replayed["params_fingerprint"] == a["params_fingerprint"]
  fast = jaxdl.run(RunConfig.make(algorithm="asp", out=str(tmp_path / "f"),
                                  network="56gbps", **RUN))
  assert (tmp_path / "f" / "trace.jsonl").read_text() != trace
  assert fast["simulated_time_s"] < a["simulated_time_s"]
  assert a["staleness_max"] >= 1 and a["simulated_time_s"] > 0 and a["bytes_total"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ssp", "ad_psgd"])
def test_sim_resume_equals_the_uninterrupted_run(tmp_path, name):
  config = RunConfig.make(algorithm=name, out=str(tmp_path / "run"), checkpoint_every=20,
                          **dict(RUN, epochs=2))
  full = jaxdl.run(config)
  steps = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()
                 if p.name.isdigit())
  shutil.rmtree(tmp_path / "run" / "checkpoints" / str(steps[-1]))  # as if killed
  (tmp_path / "run" / "summary.json").unlink()
  resumed = jaxdl.run(config.replace(resume=True))
  assert resumed["params_fingerprint"] == full["params_fingerprint"]
  assert resumed["simulated_time_s"] == full["simulated_time_s"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["bsp", "ar_sgd", "local_sgd", "diloco"])
def test_sim_engine_matches_the_mesh_engine(algorithm):
  settings = {"local_sgd": dict(communication_period=2),
              "diloco": dict(inner_steps=2)}.get(algorithm, {})
  config = RunConfig.make(algorithm=algorithm, workers=4, batch_sizes=(8, 12, 8, 4),
                          model="mlp", schedule="constant", optimizer="adam", lr=1e-3,
                          **settings)
  results = []
  for engine in ("mesh", "sim"):
    e = make_engine(config.replace(engine=engine), total_steps=10)
    results.append(e.evaluated(train(e, 10)[0]))
  chex.assert_trees_all_close(*results, rtol=1e-5, atol=4e-6)


@pytest.mark.slow
def test_dry_run_shows_the_parameter_server_bottleneck(tmp_path):
  """F3 of IPDPS'21, timing only: ResNet-50 on Titan Vs at 10 Gbps, 4 -> 24 workers."""
  speedup = {}
  for algorithm in ("bsp", "asp", "ar_sgd", "ad_psgd"):
    rate = {}
    for workers in (4, 24):
      summary = jaxdl.run(RunConfig.make(
          algorithm=algorithm, workers=workers, dry_run=True, model="resnet50",
          dataset="synthetic", image_size=224, batch_size=32, compute_time=0.066,
          network="10gbps", steps=30, progress=False,
          out=str(tmp_path / f"{algorithm}-{workers}")))
      assert summary["dry_run"] and not (tmp_path / f"{algorithm}-{workers}" /
                                         "checkpoints").exists()
      rate[workers] = summary["samples_per_simulated_s"]
    speedup[algorithm] = rate[24] / rate[4]
  assert max(speedup["bsp"], speedup["asp"]) < min(speedup["ar_sgd"], speedup["ad_psgd"])


@pytest.mark.parametrize("name", [marks.slow("easgd"), "gosgd", marks.slow("ad_psgd")])
def test_a_restart_naming_a_peer_replays_as_a_copy_of_its_state(name):
  """A real engine's worker that rejoined with a peer's state: the replay
  gives it a copy of that peer's whole state at that point, nothing else."""
  import jax
  import numpy as np

  from jaxdl.build import prepare
  from jaxdl.engines.events import EventReplay, initial_state, take
  from jaxdl.trace import Event
  built = prepare(RunConfig.make(algorithm=name, **dict(RUN, workers=3)))
  replay = EventReplay(built.algorithm, built.streams)
  server, workers = initial_state(built.algorithm, jax.random.key(0), 3)
  first = "pull" if name == "ad_psgd" else "local"
  events = [Event(0.0, first, 0, 0), Event(0.1, "restart", 2, 5, peer=0)]
  server, after, _ = replay(server, workers, events, ["loss", "accuracy"])
  same = lambda a, b: all(np.array_equal(x, y) for x, y in
                          zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert same(take(after, 2), take(after, 0))
  assert not same(take(after, 0), take(workers, 0))  # the event before it changed worker 0
  assert same(take(after, 1), take(workers, 1))
  # a parameter server's restart is no math
  built = prepare(RunConfig.make(algorithm="asp", **dict(RUN, workers=3)))
  server, workers = initial_state(built.algorithm, jax.random.key(0), 3)
  _, after, _ = EventReplay(built.algorithm, built.streams)(
      server, workers, [Event(0.0, "restart", 2, 0)], [])
  assert same(after, workers)


@pytest.mark.parametrize("name", [marks.slow("asp"), "dc_asgd", marks.slow("lc_asgd")])
def test_a_parameter_servers_messages_carry_what_the_gradient_reads_and_changes(name):
  """The ray engine's pull carries only the leaves `message_parts` says the
  gradient reads, its push only those it changes: the gradient computed on
  those leaves (the others arbitrary) changes exactly those, to the bits of
  the gradient computed on the whole state, and leaves the others as given."""
  import jax
  import numpy as np

  from jaxdl.build import prepare
  from jaxdl.engines.events import EventPrograms, initial_state, one_batch, take
  built = prepare(RunConfig.make(algorithm=name, **dict(RUN, model="cnn_bn", workers=2)))
  p = EventPrograms(built.algorithm, built.streams)
  server, workers = initial_state(built.algorithm, jax.random.key(0), 2)
  state = p.pull(server, take(workers, 1), np.float32(0.0))
  batch = one_batch(built.streams, 1, 0)
  parts = p.message_parts(state, batch)
  reads, changes = parts.reads, parts.changes
  leaves, treedef = jax.tree.flatten(state)
  assert 0 < len(reads) < len(leaves) and 0 < len(changes) < len(leaves)
  other = [x if i in reads else np.full(np.shape(x), 7, np.asarray(x).dtype)
           for i, x in enumerate(leaves)]
  whole = jax.tree.leaves(p.compute(state, batch)[0])
  part = jax.tree.leaves(p.compute(jax.tree.unflatten(treedef, other), batch)[0])
  for i in range(len(leaves)):
    if i in changes:
      np.testing.assert_array_equal(part[i], whole[i])
    else:
      np.testing.assert_array_equal(part[i], other[i])


def test_a_leaf_the_gradient_moves_elsewhere_is_read():
  """A gradient that returns one input leaf in another's place reads it,
  though no operation takes it; the leaf it passes through is not changed."""
  import numpy as np

  from jaxdl.algorithms import Centralized
  from jaxdl.build import prepare
  from jaxdl.engines.events import EventPrograms, one_batch
  built = prepare(RunConfig.make(algorithm="asp", **RUN))
  unused = lambda *args: None
  moved = Centralized(init_server=unused, init=unused, pull=unused, apply=unused,
                      evaluated=unused,
                      compute=lambda s, batch: ({"a": s["b"], "b": s["b"], "c": s["c"] + 1}, {}))
  state = {"a": np.zeros(2, np.float32), "b": np.ones(2, np.float32),
           "c": np.ones(3, np.float32)}
  parts = EventPrograms(moved, built.streams).message_parts(state, one_batch(built.streams, 0, 0))
  assert (parts.reads, parts.changes) == ((1, 2), (0, 2))


@pytest.mark.parametrize("name", marks.default_first(["asp", "gosgd", "lc_asgd"]))
def test_fused_steps_and_gathered_gradients_give_the_bits_of_one_call_per_segment(
    name, monkeypatch):
  """A step run as one program and a step run segment by segment give the
  same bits, and so do gradients of the computing workers gathered (K rows)
  and of all M workers masked: which way a step runs is the engine's
  choice, never the result's."""
  import jax
  import numpy as np

  from jaxdl.engines.sim import plan

  config = RunConfig.make(algorithm=name, **dict(RUN, workers=8, batch_size=4))
  runs = []
  for fuse, gather in ((True, True), (False, True), (False, False)):
    if not gather:  # every batched op over all M workers, masked
      monkeypatch.setattr(plan, "batch_size", lambda count, m: m)
    engine = make_engine(config, total_steps=6)
    signatures = plan.plan_sizes(engine.events, engine.step_ends[:6], 8, False,
                             engine.slots).signatures
    engine.runner.fused = frozenset(signatures) if fuse else frozenset()
    if fuse and gather and name == "gosgd":  # its local steps: a few workers at a time
      assert any(size and size < 8 for s in signatures for _, size in s)
    runs.append(train(engine, 6))
  for state, history in runs[1:]:
    assert history == runs[0][1]
    for a, b in zip(jax.tree.leaves(jax.device_get(state)),
                    jax.tree.leaves(jax.device_get(runs[0][0]))):
      np.testing.assert_array_equal(a, b)


def test_a_batched_op_lists_the_workers_it_computes_for_not_all_of_them():
  """A step's plan names, in each batched op, the K workers that compute
  and their data steps: a step of gossip among thousands of workers plans
  thousands of ops of a few workers each, and M entries an op made plans
  grow as M squared. Only an op over more than a quarter of the workers
  runs over (and lists) all M, masked. Each local step queued in the step
  is run once."""
  import numpy as np

  from jaxdl.engines.sim import plan

  m, steps = 64, 4
  engine = make_engine(RunConfig.make(algorithm="gosgd", **dict(RUN, workers=m)),
                       total_steps=steps)
  iteration, computed = np.full(m, -1), np.zeros(m, bool)
  ends = engine.step_ends[:steps]
  gathered = 0
  for start, end in zip([0] + [e + 1 for e in ends], ends):
    ops = plan.plan(engine.events, start, end, iteration, computed, False, engine.slots)
    local = [op for op in ops if op.kind == "local"]
    for op in local:
      k = plan.computing(op)
      assert len(op.workers) == len(op.steps)
      if op.mask is None:
        assert len(op.workers) == k and plan.batch_size(k, m) < m
        gathered += 1
      else:
        assert len(op.workers) == m and plan.batch_size(k, m) == m
    assert sum(len(op.workers) for op in local) <= 8 * sum(map(plan.computing, local))
    queued = sorted((e.worker, e.iteration) for e in engine.events[start:end + 1]
                    if e.kind == "local")
    ran = sorted((int(w), int(s)) for op in local for w, s in zip(op.workers, op.steps)
                 if op.mask is None or op.mask[w])
    assert ran == queued
  assert gathered


@pytest.mark.parametrize("name", marks.default_first(["asp", "gosgd"]))
def test_a_batched_gradient_in_chunks_gives_the_bits_of_the_whole_op(name):
  """A batched op of many rows, computed a chunk at a time (K gathered rows
  with padding: 64 rows, the last chunk overlapping the one before; all M
  workers, masked: only the computing rows, PENDING_ROWS at a time), gives
  every row, and the step's metric sums, the bits of the op computed whole.
  What its program holds beside the (donated) states is a chunk's, whatever
  K: twice the rows add less than one worker's state to it, and at least 50
  to the whole op's."""
  import jax
  import numpy as np

  from jaxdl.engines.events import event_functions, initial_state
  from jaxdl.engines.sim.batches import DeviceBatches
  from jaxdl.engines.sim.handlers import BatchArrays, handlers
  from jaxdl.engines.sim.runner import _zero_sums, metric_names, trace_gradient
  from tests.helpers import make_setup

  setup = make_setup(RunConfig.make(algorithm=name, **RUN))
  batches, m, rng = DeviceBatches(setup.streams, 1), 150, np.random.default_rng(0)
  server, workers = initial_state(setup.algorithm, jax.random.key(0), m)
  workers = jax.tree.map(  # every worker's parameters its own
      lambda x: x + rng.normal(0, 0.1, x.shape).astype(x.dtype)
      if np.issubdtype(x.dtype, np.floating) else x, workers)
  kind = "compute" if "compute" in event_functions(setup.algorithm) else "local"
  sums = _zero_sums(metric_names(trace_gradient(setup.problem, setup.streams.example, 1)))
  whole = (10**6, 10**6)  # (chunk_rows, pending_from): no chunks
  fn = lambda m, limits=(): handlers(setup.algorithm, m, sum(setup.streams.batch_sizes),
                                     batches.pad, *limits)[kind]

  def op(k):
    if k == m:  # 150 = 2 x 64 + 22
      rows, mask = np.arange(m, dtype=np.int32), rng.random(m) < 0.8
    else:  # 136 = 2 x 64 + 8 rows, 5 of them padding (worker M)
      rows = np.sort(rng.choice(m, k - 5, replace=False)).astype(np.int32)
      rows, mask = np.concatenate([rows, np.full(5, m, np.int32)]), np.arange(k) < k - 5
    index = rng.integers(0, batches.pad, (k, batches.b_max)).astype(np.int32)
    index[~mask] = batches.pad
    return BatchArrays(mask, rows, index, np.stack([rows, rows % 3], 1), np.int32(0))

  def temp(k, limits, times):
    """The bytes beside its arguments of the program of an op of `times` x k
    rows, with `times` x M workers."""
    scale = lambda x: jax.ShapeDtypeStruct(
        (x.shape[0] * times, *x.shape[1:]) if np.ndim(x) else (), x.dtype)
    program = jax.jit(fn(m * times, limits), donate_argnums=(0, 1)).lower(
        server, jax.tree.map(scale, workers), sums, jax.tree.map(scale, op(k)), batches.data)
    return program.compile().memory_analysis().temp_size_in_bytes

  row = sum(x[0].nbytes for x in jax.tree.leaves(workers))  # one worker's state
  for k in (m, 136):
    arrays = op(k)
    at_once, chunked = (jax.device_get(jax.jit(fn(m, limits))(
        server, workers, sums, arrays, batches.data)) for limits in (whole, ()))
    for a, b in zip(jax.tree.leaves(at_once), jax.tree.leaves(chunked)):
      np.testing.assert_array_equal(a, b)
    assert temp(k, (), 2) < temp(k, (), 1) + row  # (K metrics and batch rows grow)
    assert temp(k, whole, 2) > temp(k, whole, 1) + 50 * row


_CORES_AFTER = """
import json, os, sys
import jax
if sys.argv[2] == "started":
  jax.devices()
from jaxdl.engines.sim import compute_as_recorded
print(json.dumps([compute_as_recorded(sys.argv[1]), len(os.sched_getaffinity(0))]))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a process that may run on two cores or more")
@pytest.mark.parametrize("worker_cores, started", [(1, "fresh"), (2, "fresh"), (1, "started")])
def test_a_replay_computes_on_as_many_cores_as_the_recorded_workers(tmp_path, worker_cores,
                                                                    started):
  """(Run in a process of its own: the affinity is the process's.)"""
  cores = sorted(os.sched_getaffinity(0))
  processes = [{"role": "driver", "cores": cores}, {"role": "server", "cores": cores}] + [
      {"role": f"worker {w}", "cores": [cores[(w + i) % len(cores)] for i in range(worker_cores)]}
      for w in range(2)]
  (tmp_path / "cluster.json").write_text(json.dumps({"processes": processes}))
  (tmp_path / "trace.jsonl").write_text("")
  result = subprocess.run([sys.executable, "-c", _CORES_AFTER, str(tmp_path / "trace.jsonl"),
                           started], capture_output=True, text=True, check=True)
  warning, after = json.loads(result.stdout.strip().splitlines()[-1])
  if started == "started":  # too late to change the threads jax runs: said so
    assert after == len(cores) and "may not give the run's bits" in warning
  else:
    assert warning is None and after == (1 if worker_cores == 1 else len(cores))


@pytest.mark.parametrize("name,settings", [
    ("asp", {"compress": "topk:0.01", "compress_pull": "qsgd:4"}),
    marks.slow("gosgd", {"compress": "sign", "gossip_probability": 0.5}),
    ("ad_psgd", {"compress": "topk:0.01"}),
    marks.slow("easgd", {"compress": "topk:0.01", "communication_period": 2})])
def test_a_traces_messages_are_counted_as_the_schedule_counts_them(name, settings):
  """`message_bytes` of a schedule's events (what a real run's trace is
  held to) is the bytes its network counted: pulls and pushes (each
  compressed its own way), gossip messages, both halves of each average,
  each exchange's center and elastic difference."""
  from jaxdl.engines.sim import message_bytes
  engine = make_engine(RunConfig.make(algorithm=name, engine="sim", compute_time=1e-3,
                                      **dict(RUN, steps=12), **settings))
  counted = message_bytes(engine.algorithm, engine.problem, engine.events)
  assert counted == pytest.approx(engine.bytes_total, rel=0.01)
  assert counted > 0
