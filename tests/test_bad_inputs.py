"""Bad input on the command line: one line naming the flag, exit code 2, no
traceback, and nothing written (no run or comparison directory made, an
existing one left as it was)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import jaxdl
from jaxdl import compare, parsing
from jaxdl.cli import main
from jaxdl.config import RunConfig
from jaxdl.data import SYNTHETIC_MAX_BYTES, synthetic_max_size
from jaxdl.trace import Event, write_trace
from tests.helpers import snapshot

RUN = ["run", "--model", "mlp", "--steps", "2", "--no-progress"]
COMPARE = ["compare", "--workers", "2", "--steps", "2", "--model", "mlp", "--no-progress",
           "--no-report", "--jobs", "1"]


@pytest.fixture(scope="module")
def asp_run(tmp_path_factory) -> Path:
  """A finished 4-worker asp run on the sim engine: its trace.jsonl has pull/apply events."""
  out = tmp_path_factory.mktemp("asp") / "asp-m4"
  jaxdl.run(RunConfig.make(model="mlp", steps=4, algorithm="asp", engine="sim", workers=4,
                           out=str(out), progress=False))
  return out


def refused(capsys, argv: list[str], flag: str, out: Path) -> str:
  """Runs the CLI; asserts the one-line refusal naming `flag`, and `out` untouched."""
  before = snapshot(out)
  code = main(argv)
  captured = capsys.readouterr()
  lines = captured.err.strip().splitlines()
  assert code == 2, captured.err
  assert len(lines) == 1, captured.err
  assert flag + "=" in lines[0] and "is not valid" in lines[0], lines[0]
  assert "Traceback" not in captured.err + captured.out
  assert snapshot(out) == before  # nothing made, nothing changed
  return lines[0]


# ---------------------------------------------------------------- --out


def test_run_out_unwritable(capsys):
  line = refused(capsys, [*RUN, "--out", "/proc/x"], "--out", Path("/proc/x"))
  assert "writable" in line


def test_compare_out_unwritable(capsys):
  refused(capsys, [*COMPARE, "--algorithms", "asp", "--out", "/proc/x"], "--out",
          Path("/proc/x"))


def test_compare_out_existing_file(capsys, tmp_path):
  out = tmp_path / "file"
  out.write_text("keep me\n")
  line = refused(capsys, [*COMPARE, "--algorithms", "asp", "--out", str(out)], "--out", out)
  assert "not an existing file" in line


def test_compare_out_a_single_run_directory(capsys, asp_run):
  line = refused(capsys, [*COMPARE, "--algorithms", "asp", "--out", str(asp_run)], "--out",
                 asp_run)
  assert "not a run directory" in line and "config.json" in line


# ---------------------------------------------------------------- --replay


def _replay(out: Path, trace: Path, *flags: str) -> list[str]:
  return [*RUN, "--engine", "sim", "--out", str(out), "--replay", str(trace), *flags]


def test_replay_missing_file(capsys, tmp_path):
  out = tmp_path / "run"
  line = refused(capsys, _replay(out, tmp_path / "missing.jsonl", "--algorithm", "asp",
                                 "--workers", "4"), "--replay", out)
  assert "readable" in line


def test_replay_not_json_lines(capsys, tmp_path):
  trace = tmp_path / "trace.jsonl"
  trace.write_text('{"time": 0.0, "kind": "pull", "worker": 0}\nnot json\n')
  out = tmp_path / "run"
  line = refused(capsys, _replay(out, trace, "--algorithm", "asp", "--workers", "4"),
                 "--replay", out)
  assert "line 2" in line


def test_replay_unknown_event_fields(capsys, tmp_path):
  trace = tmp_path / "trace.jsonl"
  trace.write_text('{"time": 0.0, "kind": "pull", "worker": 0, "colour": 1}\n')
  out = tmp_path / "run"
  refused(capsys, _replay(out, trace, "--algorithm", "asp", "--workers", "4"), "--replay", out)


def test_replay_of_another_family(capsys, tmp_path, asp_run):
  # Today's traceback came from the first step, after the run directory was made.
  out = tmp_path / "run"
  line = refused(capsys, _replay(out, asp_run / "trace.jsonl", "--algorithm", "local_sgd",
                                 "--workers", "4"), "--replay", out)
  assert "step" in line and "pull" in line


def test_replay_with_more_workers_than_the_trace(capsys, tmp_path, asp_run):
  out = tmp_path / "run"
  line = refused(capsys, _replay(out, asp_run / "trace.jsonl", "--algorithm", "asp",
                                 "--workers", "8"), "--replay", out)
  assert "0..7" in line


def test_replay_with_fewer_workers_than_the_trace(capsys, tmp_path, asp_run):
  out = tmp_path / "run"
  line = refused(capsys, _replay(out, asp_run / "trace.jsonl", "--algorithm", "asp",
                                 "--workers", "2"), "--replay", out)
  assert "worker 2" in line


def test_replay_of_a_matching_trace_still_runs(tmp_path, asp_run):
  # The checks refuse only what cannot drive the math: asp's own trace replays.
  summary = jaxdl.run(RunConfig.make(model="mlp", steps=2, algorithm="asp", engine="sim",
                                     workers=4, out=str(tmp_path / "run"), progress=False,
                                     replay=str(asp_run / "trace.jsonl")))
  assert summary["status"] == "completed" and summary["steps"] == 2


def test_replay_of_a_restart_from_a_peer_without_its_config(capsys, tmp_path):
  # A real engine's worker that rejoined with a peer's copy replays one event at a time.
  trace = tmp_path / "trace.jsonl"
  write_trace(trace, [Event(0.0, "local", 0, 0), Event(0.1, "restart", 1, 0, peer=0),
                      Event(0.2, "local", 1, 0), Event(0.3, "local", 0, 1),
                      Event(0.4, "local", 1, 1)])
  out = tmp_path / "run"
  line = refused(capsys, _replay(out, trace, "--algorithm", "easgd", "--workers", "2"),
                 "--replay", out)
  assert "config.json" in line


# ---------------------------------------------------------------- --experiment


@pytest.mark.parametrize("text, line", [("x = 1\nGRID = (\n", 2),
                                        ("import json\n\nraise RuntimeError('boom')\n", 3)])
def test_experiment_that_does_not_run(capsys, tmp_path, text, line):
  experiment = tmp_path / "experiment.py"
  experiment.write_text(text)
  out = tmp_path / "cmp"
  message = refused(capsys, [*COMPARE, "--experiment", str(experiment), "--out", str(out)],
                    "--experiment", out)
  assert f"line {line}" in message


# ---------------------------------------------------------------- report


def test_report_skips_a_corrupt_cell(capsys, tmp_path, asp_run):
  directory = tmp_path / "cmp"
  shutil.copytree(asp_run, directory / "asp-m4")
  broken = directory / "asp-m8"
  shutil.copytree(asp_run, broken)
  config = json.loads((broken / "config.json").read_text())
  config["algorithm"]["workers"] = 8
  (broken / "config.json").write_text(json.dumps(config))
  (broken / "summary.json").write_text('{"status": "comp')  # cut short
  code = main(["report", str(directory)])
  captured = capsys.readouterr()
  assert code == 0, captured.err
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1 and "asp-m8" in lines[0] and "skipping" in lines[0], captured.err
  assert "Traceback" not in captured.err
  assert (directory / "report.md").exists()
  assert "| 4 " in captured.out or " 4 " in captured.out  # the good cell is reported


# ---------------------------------------------------------------- --config


def test_config_with_a_wrong_type(capsys, tmp_path):
  path = tmp_path / "config.json"
  path.write_text('{"lr": "abc"}')
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--config", str(path), "--out", str(out)], "--lr", out)
  assert "'abc'" in line


def test_config_with_a_wrong_setting_type(capsys, tmp_path):
  path = tmp_path / "config.json"
  path.write_text('{"algorithm": "ssp", "staleness_bound": "3"}')
  out = tmp_path / "run"
  refused(capsys, [*RUN, "--config", str(path), "--out", str(out)], "--staleness-bound", out)


def test_config_holding_a_list(capsys, tmp_path):
  path = tmp_path / "config.json"
  path.write_text("[1, 2]")
  out = tmp_path / "run"
  refused(capsys, [*RUN, "--config", str(path), "--out", str(out)], "--config", out)


def test_a_written_config_still_loads(tmp_path, asp_run):
  stored = RunConfig.load(str(asp_run / "config.json"))
  assert stored.algorithm.workers == 4 and stored.settings() == RunConfig.make(
      algorithm="asp").settings()


# ---------------------------------------------------------------- --image-size


def test_synthetic_image_size_too_large(capsys, tmp_path):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--dataset", "synthetic", "--image-size", "100000", "--out",
                          str(out)], "--image-size", out)
  largest = synthetic_max_size()
  assert f"at most {largest}" in line
  # the limit is the documented bytes: an evaluation batch of 1000 float32 images
  assert 1000 * largest**2 * 3 * 4 <= SYNTHETIC_MAX_BYTES < 1000 * (largest + 1)**2 * 3 * 4


# ---------------------------------------------------------------- compare's grid


@pytest.mark.parametrize("flags, flag", [
    (["--algorithms", "foo"], "--algorithms"),
    (["--algorithms", "ssp_sx"], "--algorithms"),
    (["--algorithms", "asp", "--networks", "foo"], "--networks"),
    (["--algorithms", "asp", "--timing-networks", "foo"], "--timing-networks"),
    (["--algorithms", "ssp", "--staleness-bounds", "-1"], "--staleness-bounds"),
    (["--algorithms", "gosgd", "--gossip-probabilities", "5"], "--gossip-probabilities"),
    (["--algorithms", "ssp_s-1"], "--algorithms"),
    (["--algorithms", "asp", "--network", "foo"], "--network"),
])
def test_compare_validates_the_whole_grid_first(capsys, tmp_path, flags, flag):
  out = tmp_path / "cmp"
  line = refused(capsys, [*COMPARE, *flags, "--out", str(out)], flag, out)
  assert "--algorithm=" not in line  # compare's own flag, not `jaxdl run`'s


@pytest.mark.parametrize("value", ["0", "1.5", "nan"])
def test_compare_refuses_a_target_accuracy_out_of_range(tmp_path, capsys, value):
  out = tmp_path / "cmp"
  line = refused(capsys, ["compare", "--out", str(out), "--target", value], "--target", out)
  assert "(0, 1]" in line


def test_compare_on_text_takes_a_target_in_nats(tmp_path, capsys):
  out = tmp_path / "cmp"
  line = refused(capsys, ["compare", "--out", str(out), "--dataset", "python_docs",
                          "--model", "transformer", "--target", "-1"], "--target", out)
  assert "a test nats per char > 0" in line


@pytest.mark.parametrize("value", ["1", "1.5"])
def test_run_refuses_a_momentum_of_one_or_more(tmp_path, capsys, value):
  out = tmp_path / "run"
  assert "[0, 1)" in refused(capsys, ["run", "--out", str(out), "--momentum", value],
                             "--momentum", out)


def test_sync_bn_with_an_asynchronous_algorithm_is_refused(tmp_path, capsys):
  out = tmp_path / "run"
  refused(capsys, ["run", "--out", str(out), "--model", "mlp", "--steps", "2",
                   "--algorithm", "asp", "--sync-bn"], "--sync-bn", out)


@pytest.mark.parametrize("algorithm", ["sgd", "ar_sgd", "local_sgd", "gosgd", "ad_psgd"])
def test_servers_for_an_algorithm_without_a_server_is_refused(tmp_path, capsys, algorithm):
  out = tmp_path / "run"
  workers = "1" if algorithm == "sgd" else "4"
  line = refused(capsys, [*RUN, "--out", str(out), "--algorithm", algorithm, "--workers", workers,
                          "--servers", "2"], "--servers", out)
  assert "bsp" in line and algorithm + " keeps no parameter server" in line


def test_pinned_workers_off_the_ray_engine_are_refused(tmp_path, capsys):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--algorithm", "asp", "--workers", "2",
                          "--pin-workers"], "--pin-workers", out)
  assert "its default (False) with --engine sim" in line


@pytest.mark.parametrize("args, flag, says", [
    (["--algorithm", "bsp", "--parallelism", "zigzag"], "--parallelism",
     "one of data, pipeline, tensor"),
    (["--algorithm", "asp", "--parallelism", "tensor"], "--parallelism",
     "('data') with --engine sim: it is --engine mesh's (a worker's model over"),
    (["--algorithm", "ar_sgd", "--parallelism", "tensor", "--tensor-parallel", "1"],
     "--tensor-parallel", "an integer >= 2"),
    (["--algorithm", "ar_sgd", "--parallelism", "tensor", "--tensor-parallel", "3",
      "--model", "mlp"], "--tensor-parallel", "a divisor of every sharded dimension of mlp's "
     "layers: hidden/0/kernel has 256 along its sharded dimension 1"),
    (["--algorithm", "ar_sgd", "--parallelism", "tensor", "--tensor-parallel", "8"],
     "--tensor-parallel", "at most 4: 2 workers x 8 tensor devices need 16 devices"),
    (["--algorithm", "ar_sgd", "--tensor-parallel", "4"], "--tensor-parallel",
     "its default (2) with --parallelism data"),
    (["--algorithm", "ar_sgd", "--parallelism", "tensor", "--dataset", "python_docs",
      "--model", "transformer"], "--model", "one of mlp, cnn, cnn_bn, vit, resnet18"),
    (["--algorithm", "asp", "--parallelism", "pipeline"], "--parallelism",
     "('data') with --engine sim: it is --engine mesh's"),
    (["--algorithm", "bsp", "--engine", "sim", "--parallelism", "pipeline"], "--parallelism",
     "('data') with --engine sim"),
    (["--algorithm", "bsp", "--parallelism", "pipeline", "--dataset", "python_docs",
      "--model", "transformer"], "--model", "one of mlp, cnn, cnn_bn, resnet18, resnet34, "
     "resnet50, vgg11, vgg11_bn, vgg16, vgg16_bn, vit with --parallelism pipeline"),
    (["--algorithm", "ar_sgd", "--parallelism", "pipeline", "--stages", "4"], "--stages",
     "at most 3: mlp is a sequence of 3 pieces"),
    (["--algorithm", "bsp", "--parallelism", "pipeline", "--stages", "1"], "--stages",
     "an integer >= 2"),
    (["--algorithm", "bsp", "--parallelism", "pipeline", "--stages", "5"], "--stages",
     "at most 4: 2 workers x 5 stages need 10 devices"),
    (["--algorithm", "bsp", "--workers", "5", "--parallelism", "pipeline"], "--stages",
     "2 or more devices a worker: 5 workers x 2 stages need 10 devices, and this process "
     "has 8"),
    (["--algorithm", "bsp", "--parallelism", "pipeline", "--microbatches", "5",
      "--batch-size", "16"], "--microbatches", "a divisor of every worker's batch (16)"),
    (["--algorithm", "bsp", "--stages", "4"], "--stages",
     "its default (2) with --parallelism data"),
    (["--algorithm", "bsp", "--parallelism", "pipeline", "--pipeline-schedule", "zigzag"],
     "--pipeline-schedule", "one of gpipe, 1f1b"),
    (["--algorithm", "bsp", "--pipeline-schedule", "1f1b"], "--pipeline-schedule",
     "its default (gpipe) with --parallelism data"),
])
def test_a_pipeline_that_cannot_run_is_refused(tmp_path, capsys, args, flag, says):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--workers", "2", *args], flag, out)
  assert says in line


@pytest.mark.parametrize("args, flag, says", [
    (["--target-accuracy", "1.5"], "--target-accuracy", "an accuracy in (0, 1], or unset"),
    (["--target-accuracy", "0"], "--target-accuracy", "a number > 0"),
    (["--price-per-device-hour", "-1"], "--price-per-device-hour", "a number > 0"),
    (["--price-per-device-hour", "nan"], "--price-per-device-hour", "a number > 0"),
])
def test_a_target_or_price_out_of_range_is_refused(tmp_path, capsys, args, flag, says):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), *args], flag, out)
  assert says in line


@pytest.mark.parametrize("args, flag, says", [
    (["--algorithm", "asp", "--partition", "adaptive"], "--partition",
     "static for asp: proportional and adaptive partition a synchronous step's global batch"),
    (["--algorithm", "bsp", "--partition", "random"], "--partition",
     "one of static, proportional, adaptive"),
    (["--algorithm", "bsp", "--partition", "adaptive", "--rebalance-every", "0"],
     "--rebalance-every", "an integer >= 1 (steps)"),
    (["--algorithm", "bsp", "--partition", "adaptive", "--rebalance-window", "0"],
     "--rebalance-window", "an integer >= 1 (batches per worker)"),
    # what --engine ray emulates (workers slowed for real), and where it sums
    (["--algorithm", "asp", "--engine", "ray", "--straggler-prob", "0.1"], "--straggler-prob",
     "unless --compute-time is set (the emulated batch time it varies)"),
    (["--algorithm", "gosgd", "--engine", "ray", "--batch-sizes", "8", "8", "--worker-speeds",
      "1", "0.25"], "--worker-speeds", "unset with --batch-sizes on --engine ray unless "
     "--compute-time is set"),
    (["--algorithm", "asp", "--engine", "ray", "--compute-time", "0.1", "--latency", "0.01"],
     "--latency", "with --engine ray: it is --engine sim's (a setting of the simulated cluster"),
    (["--algorithm", "bsp", "--engine", "ray", "--jitter", "0.1"], "--jitter",
     "unless --compute-time is set (the emulated batch time it varies)"),
    (["--algorithm", "bsp", "--engine", "ray", "--compute-time", "0.1", "--network", "1gbps"],
     "--network", "with --engine ray: it is --engine sim's (a setting of the simulated cluster"),
    (["--algorithm", "bsp", "--engine", "ray", "--reduce", "device"], "--reduce",
     "host, unless each worker runs its own program"),
    (["--algorithm", "asp", "--engine", "ray", "--worker-speeds", "1", "2", "--reduce",
      "device"], "--reduce", "host, unless each worker runs its own program"),
    (["--algorithm", "bsp", "--reduce", "gpu"], "--reduce", "host or device"),
    (["--algorithm", "bsp", "--engine", "mesh", "--worker-devices", "cpu", "tpu"],
     "--worker-devices", "'tpu' is not one"),
    (["--algorithm", "bsp", "--engine", "sim", "--worker-devices", "cpu", "cpu"],
     "--worker-devices", "left unset with --engine sim: it is --engine mesh's"),
])
def test_a_partition_that_cannot_run_is_refused(tmp_path, capsys, args, flag, says):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--workers", "2", *args], flag, out)
  assert says in line


@pytest.mark.parametrize("engine", ["ray", "sim"])
def test_more_server_shards_than_the_model_splits_into_are_refused(tmp_path, capsys, engine):
  """The same check on both engines that run a parameter server (the sim
  engine took 100 shards of a model that splits into 2)."""
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--algorithm", "asp", "--engine", engine,
                          "--workers", "2", "--servers", "3"], "--servers", out)
  assert "at most 2: this parameter server's update splits its leaves into 2" in line


@pytest.mark.parametrize("partition", ["proportional", "adaptive"])
def test_a_partition_of_one_workers_batch_is_refused(tmp_path, capsys, partition):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--algorithm", "bsp", "--workers", "1",
                          "--partition", partition], "--partition", out)
  assert "static with --workers 1" in line


def test_a_config_file_that_sets_nothing_is_refused(tmp_path, capsys):
  path = tmp_path / "config.json"
  path.write_text('{"optim": {}, "environment": {"backend": "cpu"}}')
  out = tmp_path / "run"
  assert "sets at least one field" in refused(
      capsys, [*RUN, "--config", str(path), "--out", str(out)], "--config", out)


def test_a_grid_of_sgd_alone_needs_one_worker(tmp_path, capsys):
  """sgd, the one-worker baseline, runs at 1 worker: alone at --workers 2 it
  would run nothing asked for; beside another algorithm it is the baseline."""
  out = tmp_path / "cmp"
  line = refused(capsys, [*COMPARE, "--algorithms", "sgd", "--out", str(out)], "--workers", out)
  assert "1 for a grid of sgd alone" in line
  cells = [c.workers for c in compare.apply_args(
      compare.DEFAULT_GRID, compare.CompareArgs(algorithms=("sgd", "asp"), workers=(2,)),
      {}).cells() if not c.timing]
  assert cells == [1, 2]


@pytest.mark.parametrize("flags, says", [
    (["--algorithms", "asp", "--communication-periods", "4"],
     "left unset: no algorithm in the grid (asp) has --communication-period (local_sgd, easgd"),
    (["--algorithms", "easgd", "--communication-periods"], "one value or more"),
])
def test_a_setting_list_that_no_variant_takes_is_refused(tmp_path, capsys, flags, says):
  out = tmp_path / "cmp"
  assert says in refused(capsys, [*COMPARE, *flags, "--out", str(out)],
                         "--communication-periods", out)


@pytest.mark.parametrize("summary", ["{}", "not json", '{"status": "completed"}'])
def test_report_of_no_readable_run_is_refused(tmp_path, capsys, asp_run, summary):
  """Its only cell's summary.json unreadable or not a finished run's (no
  samples): exit 2 naming the directory, not a report of 0 runs."""
  directory = tmp_path / "cmp"
  shutil.copytree(asp_run, directory / "asp-m4")
  (directory / "asp-m4" / "summary.json").write_text(summary)
  line = refused(capsys, ["report", str(directory)], "DIR", directory)
  assert "no run is readable (asp-m4: " in line


@pytest.mark.parametrize("damage, says", [
    ("missing", "No such file or directory"), ("empty", "trace.jsonl ends at step 0"),
    ("cut", "before the record of step 4 in metrics.jsonl")])
def test_a_simulated_run_without_its_whole_trace_is_skipped(tmp_path, capsys, asp_run, damage,
                                                           says):
  """Its times are the trace's simulated ones: without them the report
  skips it, saying why, rather than reading its wall seconds as simulated."""
  directory = tmp_path / "cmp"
  for name in ("asp-m4", "asp-m4-again"):
    shutil.copytree(asp_run, directory / name)
  trace = directory / "asp-m4" / "trace.jsonl"
  events = trace.read_text().splitlines(keepends=True)
  if damage == "missing":
    trace.unlink()
  else:  # cut to the steps before the last
    trace.write_text("" if damage == "empty" else "".join(events[:len(events) // 2]))
  assert main(["report", str(directory)]) == 0
  err = capsys.readouterr().err
  assert "skipping cell asp-m4: its run files are unreadable" in err and says in err, err
  report = (directory / "report.md").read_text()
  assert "\n1 training run, 0 timing runs, on the sim engine." in report


def test_tyros_box_without_its_hook_is_one_line(tmp_path, capsys, monkeypatch):
  """Where tyro has no parse-error hook, its box is caught and put on one line."""
  monkeypatch.setattr(parsing, "_ON_PARSE_ERROR", None)
  out = tmp_path / "run"
  assert main([*RUN, "--workers", "x", "--out", str(out)]) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and "--workers" in lines[0] and "'x'" in lines[0], lines
  assert not out.exists()


@pytest.mark.parametrize("flag, value", [("--network", "1gbps"), ("--cluster", "v100"),
                                         ("--latency", "0.1")])
def test_a_simulated_cluster_setting_on_the_mesh_is_refused(tmp_path, capsys, flag, value):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--engine", "mesh", flag, value], flag, out)
  assert "--engine sim" in line


@pytest.mark.parametrize("flag, value", [("--jitter", "0.1"), ("--straggler-prob", "0.2"),
                                         ("--straggler-slowdown", "2")])
def test_an_emulated_time_s_variation_without_the_time_is_refused(tmp_path, capsys, flag,
                                                                  value):
  """The real engines emulate --compute-time (workers sleep until their
  batch has taken it); its jitter and stragglers vary it, so need it."""
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--engine", "mesh", flag, value], flag, out)
  assert "unless --compute-time is set" in line


@pytest.mark.parametrize("value", ["-0.1", "1", "nan"])
def test_a_jitter_correlation_outside_zero_to_one_is_refused(tmp_path, capsys, value):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--engine", "sim", "--jitter", "0.2",
                          "--jitter-correlation", value], "--jitter-correlation", out)
  assert "a correlation in [0, 1)" in line


# ---------------------------------------------------------------- --compress


@pytest.mark.parametrize("value, says", [
    ("topk:0", "FRACTION in (0, 1]"), ("topk:1.5", "FRACTION in (0, 1]"),
    ("randk:nan", "FRACTION in (0, 1]"), ("powersgd:0", "RANK an integer >= 1"),
    ("powersgd:-2", "RANK an integer >= 1"), ("qsgd:0", "LEVELS an integer >= 1"),
    ("qsgd:2.5", "LEVELS an integer >= 1"), ("sign:3", "sign takes no argument"),
    ("zip", "NAME one of none, topk[:FRACTION]"),
])
def test_a_bad_compressor_is_refused(tmp_path, capsys, value, says):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--compress", value], "--compress", out)
  assert says in line


@pytest.mark.parametrize("args, says", [
    (["--algorithm", "ar_sgd", "--workers", "2", "--engine", "mesh", "--parallelism",
      "pipeline"], "none with --parallelism pipeline"),
])
def test_compression_where_it_makes_no_sense_is_refused(tmp_path, capsys, args, says):
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--compress", "topk:0.1", *args],
                 "--compress", out)
  assert says in line


@pytest.mark.parametrize("value, args, says", [
    ("topk:2", ["--algorithm", "asp", "--workers", "2"], "topk:FRACTION with FRACTION in (0, 1]"),
    ("zip", ["--algorithm", "asp", "--workers", "2"], "NAME one of none, topk[:FRACTION]"),
    ("topk:0.01", ["--algorithm", "easgd", "--workers", "2"], "none for easgd: only a parameter "
     "server's reply to a pull is compressed (asp, ssp, dc_asgd, lc_asgd)"),
    ("sign", ["--algorithm", "bsp", "--workers", "2"], "none for bsp"),
    ("sign", ["--algorithm", "gosgd", "--workers", "2"], "none for gosgd"),
])
def test_a_bad_pull_compressor_is_refused(tmp_path, capsys, value, args, says):
  """--compress-pull takes --compress's values, and only where a parameter
  server replies to pulls."""
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--compress-pull", value, *args],
                 "--compress-pull", out)
  assert says in line


@pytest.mark.parametrize("algorithm", ["gosgd", "ad_psgd"])
def test_compressed_gossip_among_too_many_workers_is_refused(tmp_path, capsys, algorithm):
  """Compressed gossip keeps a reference model at both ends of every ordered
  pair of workers, 2 M^2 models: more than 32 workers are refused."""
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--compress", "topk:0.1", "--algorithm",
                          algorithm, "--workers", "33", "--engine", "sim"], "--workers", out)
  assert f"at most 32 for {algorithm} with --compress topk:0.1" in line


def test_more_workers_with_their_own_programs_than_cpu_threads_is_refused(tmp_path, capsys):
  """Each worker's program (here --compute-time's) holds one of XLA's CPU
  client threads while it waits for the others at the exchange: one worker
  more than it has threads would hang the run; it is refused instead."""
  from jaxdl.engines.own_programs import cpu_program_threads
  most = cpu_program_threads()
  out = tmp_path / "run"
  line = refused(capsys, [*RUN, "--out", str(out), "--algorithm", "ar_sgd", "--engine", "mesh",
                          "--workers", str(most + 1), "--batch-size", "4",
                          "--compute-time", "0.01"], "--workers", out)
  assert f"at most {most} on CPU devices" in line
