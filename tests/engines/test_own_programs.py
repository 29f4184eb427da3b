"""Workers that each run their own program (jaxdl.engines.own_programs) on the
mesh engine: threads of one process, each on its own device and its own
share of the global batch, their collectives meeting at an in-memory
exchange. (The ray engine's processes: tests/engines/test_ray.py.)"""
import time

import jax
import pytest

import jaxdl
from jaxdl import trace
from jaxdl.config import RunConfig
from jaxdl.validation import validate
from jaxdl.engines.own_programs import MeshOwnPrograms, ProgramWorker
from jaxdl.errors import ConfigError
from tests.helpers import make_engine, train
from tests.marks import default_first

RUN = dict(algorithm="ar_sgd", engine="mesh", workers=3, batch_sizes=(16, 16, 16),
           dataset="digits", model="mlp", steps=12, progress=False, eval_every=6)


@pytest.mark.slow
def test_slowed_workers_on_the_mesh_are_split_by_measured_times(tmp_path):
  """Speeds 1:3:3 emulated (--compute-time: each worker sleeps until its
  batch has taken the modelled time), B = 48 split anew every 4 steps: the
  slow worker's share falls to about 48/7, the splits (in the trace, each
  summing to 48) replay on the simulator to the same losses, and the
  summary has each worker's batch times, its idle share and the reduction's
  seconds."""
  config = RunConfig.make(worker_speeds=(1.0, 3.0, 3.0), compute_time=0.3, jitter=0.1,
                          partition="adaptive", rebalance_every=4, out=str(tmp_path / "mesh"),
                          **RUN)
  run = jaxdl.run(config)
  assert run["status"] == "completed" and run["engine"] == "mesh"
  events = list(trace.read_trace(tmp_path / "mesh" / "trace.jsonl"))
  splits = [e for e in events if e.kind == "partition"]
  # after the first step, then every 4 (where the split changes), none after the last
  assert splits[0].iteration == 1 and {e.iteration for e in splits} <= {1, 4, 8}
  assert all(sum(e.sizes) == 48 for e in splits)
  slow, *fast = splits[-1].sizes
  assert slow <= 10 and min(fast) >= 17, splits[-1].sizes
  # each worker's batches as long as modelled (0.3 s for the slow worker's 16,
  # then about 48 / 7 x 0.3 / 16 = 0.13 s balanced)
  assert min(run["batch_seconds_per_worker"]) >= 0.09, run["batch_seconds_per_worker"]
  assert 0 <= run["idle_fraction"] < 1 and run["trace_time_s"] == events[-1].time
  assert run["reduce"] == "host" and run["reduce_s"] > 0
  replayed = jaxdl.run(config.replace(engine="sim", out=str(tmp_path / "sim"),
                                      replay=str(tmp_path / "mesh" / "trace.jsonl")))
  for k in ("test_loss", "train_loss"):
    assert replayed[k] == pytest.approx(run[k], rel=1e-5), k
  assert replayed["test_accuracy"] == run["test_accuracy"] > 0.5


def test_a_slowed_workers_batch_takes_the_simulators_modelled_time():
  """--compute-time on a real engine: each batch lasts what the simulator
  models for it (speeds 1:2:4, jitter, stragglers), its compute included."""
  config = RunConfig.make(**{**RUN, "batch_sizes": (8, 12, 4)}, worker_speeds=(1.0, 2.0, 4.0),
                          compute_time=0.04, jitter=0.3, straggler_prob=0.2)
  engine = make_engine(config)
  train(engine, 6)
  for w, worker in enumerate(engine.workers):
    modelled = [worker.cost.compute_time(w, t) for t in range(6)]
    for t, (got, want) in enumerate(zip(engine.seconds[w], modelled)):
      assert want <= got < want + 0.05, (w, t, got, want)
  assert len({round(t, 6) for w in engine.seconds for t in w}) == 18  # jitter: all differ


SPEEDS = (1.0, 3.0, 3.0)
MEASURED = dict(RUN, batch_sizes=(32, 32, 32), worker_speeds=SPEEDS, compute_time=0.3,
                partition="proportional", rebalance_every=2, steps=4)
"""Speeds 1:3:3 made real (a batch of 32 takes 0.3 s at speed 1, 0.1 s at 3:
far above the mlp's own few milliseconds, even on a loaded machine), B = 96:
proportional's warm-up of two steps, then its split."""


def near_speeds(sizes, speeds=SPEEDS, within=0.05) -> bool:
  """Whether every worker's share of B = sum(sizes) is within `within` x B
  of B x its speed's share: |b_m - B s_m / sum(s)| <= 0.05 B (B = 96: the
  ideal (13.7, 41.1, 41.1), each within 4.8 examples)."""
  total = sum(sizes)
  return all(abs(b - total * s / sum(speeds)) <= within * total for b, s in zip(sizes, speeds))


FIRST_RUN_DELAY = 1.0
"""Seconds measured_run adds to every compiled program's first run: far
above a fast worker's modelled 0.1 s and a loaded machine's delays."""


def measured_run(monkeypatch=None, **settings):
  """(the engine, closed, and its figures) after a run of MEASURED (and
  `settings`) on the mesh. With `monkeypatch`, the first run of every
  compiled program sleeps FIRST_RUN_DELAY more: a first run far from a
  steady one."""
  if monkeypatch is not None:
    compile_ = jax.stages.Lowered.compile

    def compiled_slow_at_first(lowered, *args, **kwargs):
      compiled, calls = compile_(lowered, *args, **kwargs), []

      def call(*arguments):
        if not calls:
          time.sleep(FIRST_RUN_DELAY)
        calls.append(1)
        return compiled(*arguments)
      return call
    monkeypatch.setattr(jax.stages.Lowered, "compile", compiled_slow_at_first)
  engine = make_engine(RunConfig.make(**{**MEASURED, **settings}))
  try:
    train(engine, engine.total_steps)
    return engine, engine.figures()
  finally:
    engine.close()


@pytest.mark.parametrize("run", default_first(range(5)))
def test_a_proportional_split_of_measured_speeds_holds_in_each_of_5_runs(monkeypatch, run):
  """The batch times a split is made from are steady ones: a compiled
  step's first run (here made FIRST_RUN_DELAY = 1 s slower than a steady
  one, on top of its own cost) is run untimed before the step, never a
  batch time; so the split of speeds 1:3:3 is within 5% of (1:3:3) x 96 in
  each of 5 runs (about (14, 41, 41)), and no batch time is half that delay
  over its modelled time (a loaded 2-core machine has delayed a batch by
  0.23 s). (Timed with the first runs, the fast workers' first batch took
  over 0.3 s for 0.1 with a delay of 0.3 s, and the split came out
  (20, 38, 38).) Each
  worker's waits are in the summary, and the bytes moved are those of 4
  ring all-reduces of the model (2 (M - 1) model bytes each), as the
  simulator counts them. (One run by default, the 5 with the slow ones.)"""
  del run  # each run is the same config, measured again
  engine, figures = measured_run(monkeypatch)
  assert [step for step, _ in engine.changes] == [2], engine.changes
  assert near_speeds(engine.changes[0][1]), engine.changes
  # one untimed run a compiled step: batch size 32, then 16 (slow) or 48 (fast)
  assert figures["untimed_runs_per_worker"] == [2, 2, 2]
  for w, worker in enumerate(engine.workers):
    modelled = [worker.cost.compute_time(w, t) * engine.streams.size(w, t) / 32
                for t in range(4)]
    assert all(want <= got < want + FIRST_RUN_DELAY / 2
               for got, want in zip(engine.seconds[w], modelled)), (w, engine.seconds[w], modelled)
  assert len(figures["wait_s"]) == 3 and min(figures["wait_s"]) >= 0
  assert figures["trace_time_s"] == engine.events[-1].time > 2 * 0.3 + 2 * 0.13
  assert figures["bytes_total"] == 4 * 2 * (3 - 1) * engine.problem.model_bytes()


def test_adaptive_splits_idle_no_more_than_proportional():
  """Adaptive splits after the first step, proportional after its warm-up
  of three: over five steps its workers idle no more (the summary's idle
  fraction, their waits over their time: 0.19-0.20 against 0.36 measured,
  0.17 against 0.35 from the modelled times alone). A loaded machine's delays add waits to either
  run, so the comparison is made up to three times: a policy that idles
  more fails each time."""
  idle = []
  for _ in range(3):
    idle.append({})
    for policy in ("proportional", "adaptive"):
      engine, figures = measured_run(partition=policy, rebalance_every=3, steps=5)
      idle[-1][policy] = figures["idle_fraction"]
      assert near_speeds(engine.changes[-1][1]), engine.changes
    if idle[-1]["adaptive"] <= idle[-1]["proportional"]:
      return
  pytest.fail(f"adaptive idled more than proportional in each of 3 comparisons: {idle}")


def test_workers_on_devices_of_their_own_give_the_same_bits():
  """--worker-devices puts each worker's program and state on its device
  (here three of the forced CPU devices): the same bits wherever they are,
  and the SPMD mesh run's parameters within float rounding."""
  config = RunConfig.make(**{**RUN, "batch_sizes": (8, 12, 4)})
  runs = {}
  for devices in (("cpu:0", "cpu:3", "cpu:5"), ("cpu:1", "cpu:1", "cpu:2")):
    engine = make_engine(config.replace(worker_devices=devices))
    assert isinstance(engine, MeshOwnPrograms)
    assert [w.device.id for w in engine.workers] == [int(d[4:]) for d in devices]
    state = train(engine, 6)[0]
    assert [list(jax.tree.leaves(w.state)[0].devices())[0].id for w in engine.workers] == [
        int(d[4:]) for d in devices]
    runs[devices] = engine.evaluated(state)
  first, second = runs.values()
  assert all((a == b).all() for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)))
  mesh = make_engine(config)
  expected = mesh.evaluated(train(mesh, 6)[0])
  for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(expected)):
    assert a == pytest.approx(b, rel=2e-5, abs=2e-6)


def test_a_failing_worker_stops_the_step_without_leaving_the_others_waiting(monkeypatch):
  engine = make_engine(RunConfig.make(**{**RUN, "worker_devices": ("cpu", "cpu", "cpu")}))
  state = engine.init(jax.random.key(0))
  real = ProgramWorker.step

  def step(self, t, fields=None):
    if self.w == 1:
      raise ValueError("worker 1 broke")
    return real(self, t, fields)
  monkeypatch.setattr(ProgramWorker, "step", step)
  start = time.perf_counter()
  with pytest.raises(ValueError, match="worker 1 broke"):
    engine.step(state, 0)
  assert time.perf_counter() - start < 30  # workers 0 and 2 left the exchange
  engine.close()


@pytest.mark.parametrize("devices, says", [
    (("cpu", "cpu"), "3 devices, one per worker"),
    (("cpu", "cpu", "tpu"), "'tpu' is not one"),
    (("cpu", "cpu", "cpu:99"), "'cpu:99' is not one")])
def test_worker_devices_that_do_not_exist_are_refused(devices, says):
  with pytest.raises(ConfigError, match="--worker-devices") as e:
    validate(RunConfig.make(**{**RUN, "worker_devices": devices}))
  assert says in str(e.value)
