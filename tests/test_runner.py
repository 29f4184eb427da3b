"""End to end: jaxdl.run writes a complete run directory, reproducibly."""
import json
import os
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

import jaxdl
import jaxdl.build
import jaxdl.runner
from jaxdl import rundir, validation
from jaxdl.algorithms import ALGORITHMS, Centralized
from jaxdl.config import RunConfig
from jaxdl.data import ImageFields, WorkerStreams, load_dataset
from jaxdl.errors import ConfigError
from jaxdl.runner import setup
from jaxdl.trace import Event
from tests import marks

# A short run: 2 epochs of the MLP on digits (44 steps of 32 examples each).
QUICK = dict(model="mlp", epochs=2, progress=False, log_every=10)


def test_run_directory_is_complete(tmp_path):
  out = tmp_path / "run"
  summary = jaxdl.run(RunConfig.make(out=str(out), **QUICK))
  assert sorted(p.name for p in out.iterdir()) == [
      "checkpoints", "cluster.json", "config.json", "metrics.jsonl", "summary.json", "tb",
      "trace.jsonl"]
  # an engine in this process: one process, this one
  processes = json.loads((out / "cluster.json").read_text())["processes"]
  assert processes == [{"role": "driver", "pid": os.getpid(), "host": socket.gethostname(),
                        "cores": sorted(os.sched_getaffinity(0))}]
  trace = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
  assert [e["iteration"] for e in trace] == list(range(88))
  assert all(e["kind"] == "step" for e in trace)
  assert RunConfig.load(str(out / "config.json")) == RunConfig.make(out=str(out), **QUICK)
  records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  steps = [r["step"] for r in records]
  assert steps == sorted(steps) and steps[-1] == summary["steps"] == 88
  for key in ("epoch", "samples", "train_loss", "wall_time_s", "samples_per_s"):
    assert all(np.isfinite(r[key]) for r in records), key
  evaluated = [r for r in records if "test_accuracy" in r]
  assert [r["step"] for r in evaluated] == [44, 88]  # once per epoch
  assert records[-1]["samples"] == 88 * 32
  assert any(p.name.startswith("events.out.tfevents") for p in (out / "tb").iterdir())
  on_disk = json.loads((out / "summary.json").read_text(), parse_constant=pytest.fail)
  assert on_disk == summary and summary["status"] == "completed"
  for key in ("test_accuracy", "test_loss", "train_loss", "steps", "samples",
              "wall_time_s", "samples_per_s", "params_fingerprint", "jax_version", "backend"):
    assert key in summary, key
  assert summary["test_accuracy"] == evaluated[-1]["test_accuracy"]
  assert summary["test_accuracy"] > 0.85
  # a zoo classifier is named by its data and model, and targets accuracy, higher better
  assert summary["task"] == "digits/mlp"
  assert summary["target_metric"] == "test_accuracy" and summary["higher_is_better"] is True
  assert len(summary["params_fingerprint"]) == 64
  assert sorted(int(p.name) for p in (out / "checkpoints").iterdir()
                if p.name.isdigit()) == [44, 88]


def test_setup_builds_what_a_run_builds_and_writes_nothing(tmp_path):
  out = tmp_path / "run"
  config = RunConfig.make(out=str(out), algorithm="ssp", staleness_bound=2, workers=4, **QUICK)
  built = setup(config)
  assert not out.exists()
  assert built.config == config and built.spec is ALGORITHMS.get("ssp")
  assert isinstance(built.algorithm, Centralized) and built.algorithm.staleness_bound == 2
  assert built.engine.name == "sim" and built.engine.algorithm is built.algorithm
  assert built.streams.num_workers == 4 and built.global_batch == 4 * 32
  assert built.total_steps == round(2 * built.streams.steps_per_epoch)
  # streams given replace the config's: the step count follows theirs
  streams = WorkerStreams(ImageFields(load_dataset("digits").train), (16, 16, 16, 16), 0)
  built = setup(config, streams)
  assert built.streams is streams and built.global_batch == 64
  assert built.total_steps == round(2 * streams.steps_per_epoch)
  assert not out.exists()


def test_same_seed_same_fingerprint_other_seed_differs(tmp_path):
  a = jaxdl.run(RunConfig.make(out=str(tmp_path / "a"), **QUICK))
  b = jaxdl.run(RunConfig.make(out=str(tmp_path / "b"), **QUICK))
  c = jaxdl.run(RunConfig.make(out=str(tmp_path / "c"), seed=1, **QUICK))
  assert a["params_fingerprint"] == b["params_fingerprint"]
  assert a["test_loss"] == b["test_loss"]
  assert c["params_fingerprint"] != a["params_fingerprint"]


@pytest.mark.slow
def test_rerun_from_config_json(tmp_path):
  first = jaxdl.run(RunConfig.make(out=str(tmp_path / "a"), **QUICK))
  config = RunConfig.load(str(tmp_path / "a" / "config.json")).replace(out=str(tmp_path / "b"))
  assert jaxdl.run(config)["params_fingerprint"] == first["params_fingerprint"]


def test_config_json_records_what_the_run_chose(tmp_path):
  """--engine auto, --batch-sizes unset and --epochs: config.json keeps them
  as given and says, under "resolved", what the run chose; read back, the
  config is the one given (a rerun chooses by the same rules)."""
  given = RunConfig.make(out=str(tmp_path / "a"), algorithm="asp", workers=3,
                         worker_speeds=(1.0, 1.0, 2.0), batch_size=16, **QUICK)
  summary = jaxdl.run(given)
  written = json.loads((tmp_path / "a" / "config.json").read_text())
  assert written["algorithm"]["engine"] == "auto" and written["data"]["batch_sizes"] is None
  # the global batch 3 x 16 in proportion to the speeds; the steps of 2 epochs
  assert written["resolved"] == {"engine": "sim", "batch_sizes": [12, 12, 24],
                                 "steps": summary["steps"]}
  assert RunConfig.load(str(tmp_path / "a" / "config.json")) == given


def _corrupt(checkpoint_dir):
  for path in checkpoint_dir.rglob("*"):
    if path.is_file() and "state" in path.parts and path.stat().st_size > 0:
      path.write_bytes(b"\0" * path.stat().st_size)


def test_corrupt_latest_checkpoint_resumes_from_the_one_before(tmp_path):
  reference = jaxdl.run(RunConfig.make(out=str(tmp_path / "ref"), **QUICK))
  out = tmp_path / "run"
  config = RunConfig.make(out=str(out), checkpoint_every=30, **QUICK)
  jaxdl.run(config)
  kept = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
  assert kept == [60, 88]
  _corrupt(out / "checkpoints" / "88")
  with pytest.warns(UserWarning, match="step 88 is unreadable") as caught:
    resumed = jaxdl.run(config.replace(resume=True))
  message = str(next(w.message for w in caught if "unreadable" in str(w.message)))
  assert len(message.splitlines()) == 2 and "checkpoints.corrupt" in message  # two lines
  assert resumed["params_fingerprint"] == reference["params_fingerprint"]
  assert (out / "checkpoints.corrupt" / "88").is_dir()  # set aside, not deleted
  assert (out / "checkpoints" / "60").is_dir()
  # the trace is the whole run's: the 60 steps before the resume, then the rest
  trace = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
  assert [e["iteration"] for e in trace] == list(range(88))
  times = [e["time"] for e in trace]
  assert times == sorted(times)


def test_a_whole_trace_write_that_fails_leaves_the_trace_as_it_was(tmp_path):
  path = tmp_path / "trace.jsonl"
  rundir.save_trace(path, [Event(0.0, "pull", 0, 0)])
  before = path.read_text()

  def events():
    yield Event(1.0, "pull", 1, 0)
    raise KeyboardInterrupt  # the process stopped midway

  with pytest.raises(KeyboardInterrupt):
    rundir.save_trace(path, events())
  assert path.read_text() == before


def test_a_run_killed_while_writing_its_trace_and_metrics_resumes(tmp_path):
  """A process killed while it appended to trace.jsonl and metrics.jsonl
  (the checkpoint at 88 not saved) leaves each a last line without its
  newline: the resumed run leaves those out and ends as the uninterrupted
  run, its two files whole."""
  out = tmp_path / "run"
  config = RunConfig.make(out=str(out), checkpoint_every=30, **QUICK)
  reference = jaxdl.run(config)
  records = (out / "metrics.jsonl").read_text()
  shutil.rmtree(out / "checkpoints" / "88")
  (out / "summary.json").unlink()
  with open(out / "trace.jsonl", "a") as f:
    f.write('{"time": 9.5, "kind": "st')
  with open(out / "metrics.jsonl", "a") as f:
    f.write('{"step": 90, "epo')
  resumed = jaxdl.run(config.replace(resume=True))
  assert resumed["params_fingerprint"] == reference["params_fingerprint"]
  trace = (out / "trace.jsonl").read_text().splitlines()
  assert [json.loads(line)["iteration"] for line in trace] == list(range(88))
  kept = lambda text: [{k: v for k, v in json.loads(line).items()
                        if k not in ("wall_time_s", "samples_per_s")} for line in text.splitlines()]
  assert kept((out / "metrics.jsonl").read_text()) == kept(records)


def test_overwrite_replaces_a_runs_files_and_what_a_killed_write_left(tmp_path):
  out = tmp_path / "run"
  jaxdl.run(RunConfig.make(out=str(out), checkpoint_every=30, **QUICK))
  left = {"trace.jsonl.tmp", "metrics.jsonl.tmp", "summary.json.tmp"}
  for name in left:
    (out / name).write_text("{")  # a write that a kill cut short
  (out / "notes.txt").write_text("mine")
  jaxdl.run(RunConfig.make(out=str(out), overwrite=True, **QUICK))
  assert not left & {p.name for p in out.iterdir()}
  assert (out / "notes.txt").read_text() == "mine"
  # the earlier run's checkpoint at step 60 is gone with it
  assert sorted(int(p.name) for p in (out / "checkpoints").iterdir()) == [44, 88]


def test_a_directory_another_run_is_writing_to_is_refused_before_anything_changes(tmp_path):
  out = tmp_path / "run"
  jaxdl.run(RunConfig.make(out=str(out), **QUICK))
  files = lambda: {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
  before = files()
  with rundir.claimed(out):  # held as a run in another process holds it
    for flags in (dict(resume=True), dict(overwrite=True)):
      with pytest.raises(ConfigError, match="--out=.*no other run or compare is writing to"):
        jaxdl.run(RunConfig.make(out=str(out), **flags, **QUICK))
  assert files() == before
  assert sorted(int(p.name) for p in (out / "checkpoints").iterdir()) == [44, 88]
  # a holder killed leaves the directory free
  holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE,
                            text=True)
  try:
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(ConfigError, match="no other run or compare"):
      jaxdl.run(RunConfig.make(out=str(out), overwrite=True, **QUICK))
  finally:
    holder.kill()
    holder.wait()
  again = jaxdl.run(RunConfig.make(out=str(out), overwrite=True, **QUICK))
  assert again["params_fingerprint"] == json.loads(before["summary.json"])["params_fingerprint"]


HOLDER = """import sys, time
from pathlib import Path
from jaxdl import rundir
with rundir.claimed(Path(sys.argv[1])):
  print("held", flush=True)
  time.sleep(300)
"""


def test_resume_refuses_a_different_config(tmp_path):
  out = tmp_path / "run"
  jaxdl.run(RunConfig.make(out=str(out), lr=0.05, **QUICK))
  before = (out / "summary.json").read_text()
  with pytest.raises(ConfigError, match="--lr=0.5.*0.05"):
    jaxdl.run(RunConfig.make(out=str(out), resume=True, lr=0.5, **QUICK))
  assert (out / "summary.json").read_text() == before


def test_resume_of_a_finished_run_changes_nothing(tmp_path):
  out = tmp_path / "run"
  first = jaxdl.run(RunConfig.make(out=str(out), checkpoint_every=30, **QUICK))
  assert first["engine"] == "mesh" and "measured_from_step" not in first
  written = {name: (out / name).read_bytes() for name in ("summary.json", "metrics.jsonl",
                                                          "trace.jsonl")}
  again = jaxdl.run(RunConfig.make(out=str(out), resume=True, **QUICK))
  assert again == json.loads(written["summary.json"])  # its figures as measured, unchanged
  assert {name: (out / name).read_bytes() for name in written} == written
  trace = (out / "trace.jsonl").read_text().splitlines()
  assert [json.loads(line)["iteration"] for line in trace] == list(range(88))
  # killed after its last checkpoint, before its summary: a real engine's
  # figures are then those of the steps after 88 (none), and say so
  (out / "summary.json").unlink()
  again = jaxdl.run(RunConfig.make(out=str(out), resume=True, **QUICK))
  assert again["params_fingerprint"] == first["params_fingerprint"]
  assert again["measured_from_step"] == 88
  # resumed at step 60: the same bits, its figures measured after step 60
  shutil.rmtree(out / "checkpoints" / "88")
  again = jaxdl.run(RunConfig.make(out=str(out), resume=True, **QUICK))
  assert again["params_fingerprint"] == first["params_fingerprint"]
  assert again["measured_from_step"] == 60
  # the simulator's figures are its whole schedule's, resumed or not
  sim = dict(QUICK, engine="sim", algorithm="asp", workers=2, checkpoint_every=30,
             out=str(tmp_path / "sim"))
  whole = jaxdl.run(RunConfig.make(**sim))
  checkpoints = tmp_path / "sim" / "checkpoints"
  shutil.rmtree(checkpoints / str(max(int(p.name) for p in checkpoints.iterdir())))
  resumed = jaxdl.run(RunConfig.make(resume=True, **sim))
  assert "measured_from_step" not in resumed
  for figure in ("bytes_total", "staleness_histogram", "batches_per_worker", "wait_s"):
    assert resumed[figure] == whole[figure], figure


def test_config_json_records_the_environment_and_a_resume_on_another_warns(tmp_path, capsys):
  out = tmp_path / "run"
  config = RunConfig.make(out=str(out), **QUICK)
  jaxdl.run(config)
  stored = json.loads((out / "config.json").read_text())
  assert stored["environment"] == {"backend": jax.default_backend(),
                                   "devices": jax.device_count(),
                                   "xla_flags": os.environ.get("XLA_FLAGS", ""),
                                   "jax_version": jax.__version__}
  capsys.readouterr()
  jaxdl.run(config.replace(resume=True))
  assert "warning" not in capsys.readouterr().err
  stored["environment"]["devices"] = 1
  (out / "config.json").write_text(json.dumps(stored))
  (tmp_path / "other.json").write_text(json.dumps(stored))
  jaxdl.run(config.replace(resume=True))
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and f"devices 1 -> {jax.device_count()}" in err[0]
  # and a run from such a config file (--config) says the same
  jaxdl.run(config.replace(out=str(tmp_path / "again"), config=str(tmp_path / "other.json")))
  assert f"devices 1 -> {jax.device_count()}" in capsys.readouterr().err


def test_default_run_reaches_95_percent_on_digits(tmp_path):
  summary = jaxdl.run(RunConfig.make(out=str(tmp_path / "default"), progress=False))
  assert summary["dataset"] == "digits"
  assert summary["test_accuracy"] >= 0.95


@pytest.mark.parametrize("engine", marks.default_first(["mesh", "sim"]))
def test_a_bfloat16_run_trains(tmp_path, engine):
  out = tmp_path / engine
  summary = jaxdl.run(RunConfig.make(out=str(out), model="cnn", epochs=2, workers=2,
                                     algorithm="asp" if engine == "sim" else "ar_sgd",
                                     engine=engine, compute_dtype="bfloat16", progress=False))
  assert summary["test_accuracy"] >= 0.9
  config = json.loads((out / "config.json").read_text())
  assert config["model"]["compute_dtype"] == "bfloat16"


@pytest.mark.parametrize("algorithm", marks.default_first(["bsp", "ar_sgd", "local_sgd"]))
def test_synchronous_runs_report_their_layout_and_traffic(tmp_path, algorithm):
  summary = jaxdl.run(RunConfig.make(out=str(tmp_path / algorithm), algorithm=algorithm,
                                     workers=16, batch_size=4, **QUICK))
  assert summary["devices"] == 8 and summary["workers_per_device"] == 2
  assert summary["engine"] == "mesh" and summary["workers"] == 16
  model_bytes = 4 * summary["num_params"]
  expected = {"bsp": 2 * 16 * model_bytes, "ar_sgd": 2 * 15 * model_bytes,
              "local_sgd": 2 * 15 * model_bytes / 4}[algorithm]
  assert summary["bytes_communicated_per_step"] == pytest.approx(expected)
  assert summary["test_accuracy"] > 0.5


@pytest.mark.parametrize("engine, workers", marks.default_first([("mesh", 2), ("sim", 4)]))
def test_time_and_cost_to_a_target(tmp_path, engine, workers):
  """--target-accuracy: the first evaluation in metrics.jsonl at or above
  it (its step, epoch and time: the sim's simulated clock at that step, read
  from the trace, else the record's wall time); --price-per-device-hour: the
  devices (the sim's: its workers) x the run's hours x the price. A target
  above every evaluation: nulls, and no cost to it."""
  algorithm = "asp" if engine == "sim" else "ar_sgd"
  base = dict(QUICK, algorithm=algorithm, workers=workers, engine=engine, eval_every=5,
              price_per_device_hour=3.0)
  summary = jaxdl.run(RunConfig.make(**base, target_accuracy=0.5, out=str(tmp_path / "a")))
  records = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").open()]
  first = next(r for r in records if r.get("test_accuracy", 0) >= 0.5)
  assert first is not records[-1] and summary["test_accuracy"] > 0.5
  assert (summary["steps_to_target"], summary["epochs_to_target"]) == (first["step"],
                                                                      first["epoch"])
  if engine == "sim":
    events = [json.loads(line) for line in (tmp_path / "a" / "trace.jsonl").open()]
    # asp: a step is every worker's batch once; the step's end is its last update's
    applies = [e for e in events if e["kind"] == "apply"]
    expected, devices, time_s = (applies[first["step"] * workers - 1]["time"], workers,
                                 summary["simulated_time_s"])
  else:
    expected, devices, time_s = first["wall_time_s"], summary["devices"], summary["wall_time_s"]
  assert devices == workers
  assert summary["seconds_per_epoch"] == pytest.approx(time_s / 2, rel=1e-9)  # 2 epochs
  assert summary["time_to_target_s"] == pytest.approx(expected, rel=1e-9)
  assert summary["cost"] == pytest.approx(devices * time_s / 3600 * 3.0, rel=1e-9)
  assert summary["cost_to_target"] == pytest.approx(devices * expected / 3600 * 3.0, rel=1e-9)
  written = json.loads((tmp_path / "a" / "summary.json").read_text())
  assert all(written[k] == summary[k] for k in ("steps_to_target", "time_to_target_s", "cost"))
  missed = jaxdl.run(RunConfig.make(**base, target_accuracy=1.0, out=str(tmp_path / "b")))
  assert missed["test_accuracy"] < 1.0
  assert [missed[k] for k in ("steps_to_target", "epochs_to_target", "time_to_target_s",
                              "cost_to_target")] == [None] * 4


@pytest.mark.parametrize("engine", ["sim", "mesh"])
def test_a_run_validates_its_config_once(tmp_path, monkeypatch, engine):
  """One pass from the config to the engine: jaxdl.run asks the owners of the
  fields once (jaxdl.validation.validate), and building the run asks no more."""
  calls = []

  def counted(config):
    calls.append(config)
    return validation.validate(config)
  for module in (jaxdl.runner, jaxdl.build):
    monkeypatch.setattr(module, "validate", counted)
  jaxdl.run(algorithm="bsp", workers=2, engine=engine, steps=2, batch_size=8,
            out=str(tmp_path / "run"))
  assert len(calls) == 1
