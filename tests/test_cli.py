"""The command line: help, list, bad input, rerun, and resume after SIGKILL."""
import dataclasses
import importlib.metadata
import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jaxdl
from jaxdl.algorithms import ALGORITHMS, settings_owners
from jaxdl.cli import main, script_args
from jaxdl.cluster import DEVICE_PROFILES
from jaxdl.config import RunConfig
from jaxdl.engines import ENGINES, engines_for
from jaxdl.errors import flag
from jaxdl.task import task_names
from tests.helpers import jaxdl_command

QUICK = ["--model", "mlp", "--epochs", "1", "--no-progress"]


def _jaxdl(*args, **kwargs):
  return subprocess.run([sys.executable, "-m", "jaxdl", *args], capture_output=True,
                        text=True, timeout=300, **kwargs)


def test_help_documents_every_flag():
  result = _jaxdl("run", "--help", env=dict(os.environ, COLUMNS="200"))
  assert result.returncode == 0
  # the sections' flags, then every registered algorithm's settings
  settings = settings_owners()
  assert {"staleness_bound", "communication_period", "gossip_probability"} <= set(settings)
  for name in [*RunConfig().flat(), *settings]:
    flag = "--" + name.replace("_", "-")
    assert flag in result.stdout, flag
  # every field has a docstring, so no flag is shown without one
  assert "(default: " in result.stdout
  # a setting's help is its docstring; a shared one names each algorithm's
  help_text = " ".join(result.stdout.split())
  assert "SSP's bound s" in help_text
  assert all(f"{spec.name}: " in help_text for spec in settings["communication_period"])


def test_list_prints_every_registry(capsys):
  assert main(["list"]) == 0
  out = capsys.readouterr().out
  for word in ("digits", "tfds:NAME", "npz:PATH", "resnet50", "vgg16_bn", "adamw", "sgd",
               "local"):
    assert word in out, word
  lines = out.split("algorithms (--algorithm)")[1].split("engines (--engine)")[0].splitlines()
  for name in ALGORITHMS:  # each algorithm with its family and engines, then its settings
    spec = ALGORITHMS.get(name)
    row = next(i for i, l in enumerate(lines) if l.split()[:1] == [name])
    assert (f"[{spec.family.__name__.lower()}; engines: {', '.join(engines_for(spec.family))}]"
            in lines[row])
    flags = [l.split()[0] for l in lines[row + 1:row + 1 + len(dataclasses.fields(spec.settings))]]
    assert flags == [flag(f.name) for f in dataclasses.fields(spec.settings)], name
  engines = out.split("engines (--engine)")[1].splitlines()
  assert all(any(l.split()[:1] == [name] for l in engines) for name in ENGINES)
  assert all(f"task:{name}" in out for name in task_names())
  ssp = lines.index(next(l for l in lines if l.split()[:1] == ["ssp"]))
  assert lines[ssp + 1].split()[:2] == ["--staleness-bound", "3"]
  assert "SSP's bound s" in lines[ssp + 1]
  assert "max(0, 0.9 - (1 - 1/M))" in lines[ssp + 2]  # the parameter servers' defaults
  profiles = out.split("simulated devices")[1].split("networks (--network")[0]
  for profile in DEVICE_PROFILES:  # every --cluster profile, rtx-3070 included
    assert f"\n  {profile} " in profiles, profile


@pytest.mark.parametrize("args,field", [
    (["--dataset", "imagenet"], "--dataset"),
    (["--model", "resnet7"], "--model"),
    (["--optimizer", "sgdd"], "--optimizer"),
    (["--algorithm", "paxos"], "--algorithm"),
    (["--workers", "0"], "--workers"),
    (["--batch-size", "-1"], "--batch-size"),
    (["--lr", "0"], "--lr"),
    (["--steps", "0"], "--steps"),
    (["--batch-size", "5000"], "--batch-size"),  # larger than the 1437-example shard
    (["--algorithm", "ssp", "--staleness-bound", "-1"], "--staleness-bound"),
    (["--algorithm", "asp", "--staleness-bound", "3"], "--staleness-bound"),  # ssp's, not asp's
])
def test_bad_input_is_one_line_exit_2_and_nothing_lost(tmp_path, capsys, args, field):
  out = tmp_path / "run"
  out.mkdir()
  (out / "notes.txt").write_text("mine")
  assert main(["run", "--out", str(out), "--overwrite", *QUICK, *args]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and field in err and "Traceback" not in err
  assert [p.name for p in out.iterdir()] == ["notes.txt"]
  assert (out / "notes.txt").read_text() == "mine"


def test_non_empty_out_needs_resume_or_overwrite(tmp_path, capsys):
  out = tmp_path / "run"
  out.mkdir()
  (out / "precious.bin").write_bytes(b"x")
  assert main(["run", "--out", str(out), *QUICK]) == 2
  assert "--resume" in capsys.readouterr().err
  assert [p.name for p in out.iterdir()] == ["precious.bin"]


def test_unwritable_out_is_refused(tmp_path, capsys):
  parent = tmp_path / "ro"
  parent.mkdir()
  parent.chmod(0o500)
  try:
    # root may write in a read-only directory, not in /proc
    target = Path("/proc/self") if os.access(parent, os.W_OK) else parent
    assert main(["run", "--out", str(target / "run"), *QUICK]) == 2
    assert "writable" in capsys.readouterr().err
  finally:
    parent.chmod(0o700)


def test_unwritable_out_is_refused_even_as_root(tmp_path, capsys):
  blocker = tmp_path / "file"
  blocker.write_text("not a dir")
  assert main(["run", "--out", str(blocker / "run"), *QUICK]) == 2
  assert "--out" in capsys.readouterr().err
  assert blocker.read_text() == "not a dir"


@pytest.mark.slow
def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
  result = _jaxdl("run", "--dataset", "nope", "--out", str(tmp_path / "r"))
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      result.stderr.strip()] and "--dataset='nope'" in result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "r").exists()


def test_config_flag_reruns_a_run(tmp_path, capsys):
  assert main(["run", "--out", str(tmp_path / "a"), *QUICK, "--seed", "7"]) == 0
  assert main(["run", "--config", str(tmp_path / "a" / "config.json"),
               "--out", str(tmp_path / "b")]) == 0
  a = json.loads((tmp_path / "a" / "summary.json").read_text())
  b = json.loads((tmp_path / "b" / "summary.json").read_text())
  assert b["seed"] == 7 and a["params_fingerprint"] == b["params_fingerprint"]


# What `jaxdl list` states, worked out by hand: a parameter server's pushes
# get lr = 0.05 / sqrt(M) and momentum = max(0, 0.9 - (1 - 1/M)); diloco's
# inner steps adamw at lr 3e-3 with weight decay 0.1 (a momentum is sgd's alone).
RULES = [("asp", 4, "lr = 0.05 / sqrt(M), momentum = max(0, 0.9 - (1 - 1/M))",
          {"optimizer": "sgd", "lr": 0.025, "momentum": 0.15, "weight_decay": 0.0}),
         ("diloco", 2, "adamw, lr 3e-3, weight decay 0.1",
          {"optimizer": "adamw", "lr": 3e-3, "momentum": None, "weight_decay": 0.1})]
OPTIM = ("optimizer", "lr", "momentum", "weight_decay")


def _optim(path: Path) -> dict:
  return {k: json.loads(path.read_text())["optim"][k] for k in OPTIM}


@pytest.mark.parametrize("algorithm, workers, rule, chosen", RULES, ids=["asp", "diloco"])
def test_config_json_records_what_the_defaults_chose(tmp_path, capsys, algorithm, workers,
                                                      rule, chosen):
  assert main(["list"]) == 0  # the rule, in the algorithm's rows (those of its flags)
  rows = capsys.readouterr().out.split(f"\n  {algorithm} ", 1)[1].splitlines()[1:]
  assert any(rule in row for row in itertools.takewhile(lambda r: r.startswith("    --"), rows))
  args = ["--model", "mlp", "--steps", "2", "--no-progress", "--algorithm", algorithm]
  assert main(["run", "--out", str(tmp_path / "a"), *args, "--workers", str(workers)]) == 0
  stored = tmp_path / "a" / "config.json"
  assert _optim(stored) == pytest.approx(chosen)
  assert json.loads(stored.read_text())["defaults_applied"] == pytest.approx(
      {k: v for k, v in chosen.items() if v is not None})
  # a rerun from it: the same values, the same parameters, bit for bit
  assert main(["run", "--config", str(stored), "--out", str(tmp_path / "b")]) == 0
  assert _optim(tmp_path / "b" / "config.json") == _optim(stored)
  a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
  assert a["params_fingerprint"] == b["params_fingerprint"]


@pytest.mark.slow
def test_config_flag_keeps_the_algorithms_settings(tmp_path, capsys):
  args = ["--model", "mlp", "--steps", "4", "--no-progress", "--algorithm", "ssp",
          "--workers", "2", "--staleness-bound", "1"]
  assert main(["run", "--out", str(tmp_path / "a"), *args]) == 0
  stored = json.loads((tmp_path / "a" / "config.json").read_text())
  assert stored["algorithm"]["settings"] == {"staleness_bound": 1}
  assert main(["run", "--config", str(tmp_path / "a" / "config.json"),
               "--out", str(tmp_path / "b")]) == 0
  assert json.loads((tmp_path / "b" / "config.json").read_text())["algorithm"] == \
      stored["algorithm"]
  a = json.loads((tmp_path / "a" / "summary.json").read_text())
  b = json.loads((tmp_path / "b" / "summary.json").read_text())
  assert a["params_fingerprint"] == b["params_fingerprint"]
  # a flag given with --config wins over the file's value
  assert main(["run", "--config", str(tmp_path / "a" / "config.json"),
               "--out", str(tmp_path / "c"), "--staleness-bound", "0"]) == 0
  assert json.loads((tmp_path / "c" / "config.json").read_text())[
      "algorithm"]["settings"] == {"staleness_bound": 0}


def _newest_checkpoint(directory: Path) -> int:
  steps = [int(p.name) for p in directory.glob("*") if p.name.isdigit()
           and (p / "commit_success.txt").exists()] if directory.exists() else []
  return max(steps, default=0)


def _killed_and_resumed(out: Path, args: list[str], after_checkpoint: int) -> dict:
  """`jaxdl run --out out *args`, SIGKILLed once a checkpoint at or past
  `after_checkpoint` is committed, then `--resume`d: the resumed summary."""
  process = subprocess.Popen([sys.executable, "-m", "jaxdl", "run", "--out", str(out), *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 120
    while _newest_checkpoint(out / "checkpoints") < after_checkpoint and time.time() < deadline:
      assert process.poll() is None, "the run ended before it could be killed"
      time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
  finally:
    process.wait(timeout=30)
  assert process.returncode == -signal.SIGKILL
  assert not (out / "summary.json").exists()
  result = _jaxdl("run", "--out", str(out), "--resume", "--no-progress")
  assert result.returncode == 0, result.stderr
  return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_sigkill_then_resume_ends_with_the_uninterrupted_fingerprint(tmp_path):
  args = ["--model", "mlp", "--steps", "3000", "--checkpoint-every", "100",
          "--log-every", "100", "--no-progress"]
  reference = jaxdl.run(RunConfig.make(model="mlp", steps=3000, checkpoint_every=100,
                                       log_every=100, out=str(tmp_path / "ref"),
                                       progress=False))
  out = tmp_path / "run"
  summary = _killed_and_resumed(out, args, after_checkpoint=300)
  assert summary["params_fingerprint"] == reference["params_fingerprint"]
  def logged_steps(run):
    return [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()]
  assert logged_steps(out) == logged_steps(tmp_path / "ref")  # no record twice, none missing


def test_sim_sigkill_then_resume_ends_with_the_uninterrupted_fingerprint(tmp_path):
  # The sim engine's host bookkeeping (iteration, computed, schedule position)
  # is checkpointed with the parameters: a resume replays the same schedule.
  flags = dict(algorithm="asp", workers=4, engine="sim", model="mlp", steps=800,
               checkpoint_every=100, log_every=100, progress=False)
  reference = jaxdl.run(RunConfig.make(out=str(tmp_path / "ref"), **flags))
  args = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items() if k != "progress"]
  summary = _killed_and_resumed(tmp_path / "run", [*args, "--no-progress"], after_checkpoint=200)
  assert summary["params_fingerprint"] == reference["params_fingerprint"]
  assert summary["simulated_time_s"] == reference["simulated_time_s"]


def test_progress_bar_shows_loss_accuracy_and_throughput(tmp_path, capsys):
  assert main(["run", "--out", str(tmp_path / "r"), "--model", "mlp", "--epochs", "1"]) == 0
  err = capsys.readouterr().err
  assert "loss=" in err and "test_accuracy=" in err and "samples_s=" in err and "44/44" in err


def test_list_flags_take_commas_or_spaces():
  from jaxdl.cli import _parse_run_config
  for args in (["--batch-sizes", "32,48,48"], ["--batch-sizes=32,48,48"],
               ["--batch-sizes", "32", "48", "48"]):
    assert _parse_run_config(args).data.batch_sizes == (32, 48, 48)
  assert _parse_run_config(["--worker-speeds", "1,1.5"]).cluster.worker_speeds == (1.0, 1.5)


def test_run_prints_its_directory_first_and_its_summary_last(tmp_path, capsys):
  out = tmp_path / "run"
  assert main(["run", "--out", str(out), *QUICK]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0] == f"run directory: {out}"
  assert lines[-1] == f"summary: {out / 'summary.json'}" and (out / "summary.json").exists()


def test_sigusr1_prints_every_threads_stack_and_the_run_goes_on(tmp_path):
  """`kill -USR1` on a run that seems stuck: where each thread is, on
  stderr; the run is not stopped by it."""
  out = tmp_path / "run"
  run = subprocess.Popen(jaxdl_command("run", "--model", "mlp", "--steps", "400",
                                       "--no-progress", "--out", str(out)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 120
    while not (out / "config.json").exists():
      assert run.poll() is None and time.time() < deadline, run.stderr.read()[-2000:]
      time.sleep(0.1)
    run.send_signal(signal.SIGUSR1)
    _, stderr = run.communicate(timeout=300)
  finally:
    run.kill()
  assert run.returncode == 0, stderr[-2000:]
  assert "Current thread" in stderr or "Thread 0x" in stderr, stderr[-2000:]
  assert json.loads((out / "summary.json").read_text())["steps"] == 400


@pytest.mark.parametrize("script", ["quickstart", "scalability", "custom_task", "over_seeds",
                                    "hyperparameter_sensitivity"])
def test_an_experiments_own_flags_refuse_in_one_line(capsys, monkeypatch, script):
  """The scripts of experiments/ with flags of their own parse them as jaxdl
  does (jaxdl.cli.script_args): an unknown flag is one line, exit code 2."""
  path = Path(__file__).parent.parent / "experiments" / f"{script}.py"
  spec = importlib.util.spec_from_file_location(script, path)
  module = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, script, module)  # for its dataclass
  spec.loader.exec_module(module)
  with pytest.raises(SystemExit) as exit:
    script_args(module.Args, ["--nope"], str(path))
  lines = capsys.readouterr().err.strip().splitlines()
  assert exit.value.code == 2 and len(lines) == 1, lines
  assert lines[0].startswith(f"python {script}.py: error: --nope is not a flag"), lines[0]


def test_version_is_the_installed_packages(capsys):
  assert main(["--version"]) == 0
  assert capsys.readouterr().out == f"jaxdl {importlib.metadata.version('jaxdl-train')}\n"
