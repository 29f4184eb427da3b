"""Cost profiles measured on the ray engine (`jaxdl calibrate`), simulated
with `--engine sim --cluster PROFILE.json`."""
import dataclasses
import json

import pytest

import jaxdl
from jaxdl import calibrate
from jaxdl.algorithms import ALGORITHMS, Centralized, Gossip
from jaxdl.cli import main
from jaxdl.cluster import read_profile
from jaxdl.config import RunConfig
from jaxdl.engines import ENGINES
from jaxdl.validation import validate
from jaxdl.errors import ConfigError

PROFILE = dict(model="mlp", dataset="digits", batch_size=16, compute_time=0.01,
               server_time=0.02, order_time=0.005)


def _write(path, **fields):
  path.write_text(json.dumps({**PROFILE, **fields}))
  return str(path)


def test_the_measuring_runs_are_chosen_by_what_the_registries_declare():
  """The server's probe is the first centralized algorithm with a server and
  no settings of its own, the coordinator's the first gossip one, the
  engine the first whose central process is its own and that runs both:
  among the built-in ones, asp, gosgd and ray (BENCHMARKS.md's profiles)."""
  probes = calibrate.probes()
  server, order = ALGORITHMS.get(probes["server_time"]), ALGORITHMS.get(probes["order_time"])
  assert server.family is Centralized and server.has_server
  assert not dataclasses.fields(server.settings) and order.family is Gossip
  engine = ENGINES.get(calibrate.engine())
  assert engine.central_process and {Centralized, Gossip} <= set(engine.families)
  assert (probes, engine.name) == ({"server_time": "asp", "order_time": "gosgd"}, "ray")


def test_the_simulator_runs_a_measured_profile_by_hand(tmp_path):
  """One asp worker: each update is a gradient (10 ms) and the server's
  20 ms, messages free (a profile counts them in the server's time)."""
  profile = _write(tmp_path / "p.json")
  summary = jaxdl.run(RunConfig.make(
      algorithm="asp", engine="sim", workers=1, model="mlp", batch_size=16, steps=7,
      cluster=profile, progress=False, out=str(tmp_path / "run")))
  assert summary["simulated_time_s"] == pytest.approx(7 * 0.03, rel=1e-6)
  # --compute-time overrides the profile's
  summary = jaxdl.run(RunConfig.make(
      algorithm="asp", engine="sim", workers=1, model="mlp", batch_size=16, steps=7,
      cluster=profile, compute_time=0.04, progress=False, out=str(tmp_path / "other")))
  assert summary["simulated_time_s"] == pytest.approx(7 * 0.06, rel=1e-6)


@pytest.mark.parametrize("content,allowed", [
    (None, "No such file"),
    ("not json", "a cost profile written by `jaxdl calibrate` (Expecting value"),
    (json.dumps({"model": "mlp"}), "it lacks dataset, batch_size, compute_time, server_time, "
                                   "order_time"),
    ("[1, 2]", "it lacks model, dataset"),
    (json.dumps({**PROFILE, "server_time": -1}), "seconds >= 0 (compute time > 0)"),
    (json.dumps({**PROFILE, "compute_time": 0}), "seconds >= 0 (compute time > 0)"),
    (json.dumps({**PROFILE, "order_time": "fast"}), "seconds >= 0 (compute time > 0)"),
    (json.dumps({**PROFILE, "worker_nodes": -1}), "a count of worker machines >= 0"),
    (json.dumps({**PROFILE, "worker_nodes": 1.5}), "a count of worker machines >= 0"),
    (json.dumps({**PROFILE, "central_bandwidth": 0}), "bandwidths > 0"),
])
def test_a_bad_profile_is_refused_naming_the_file(tmp_path, content, allowed):
  path = tmp_path / "p.json"
  if content is not None:
    path.write_text(content)
  with pytest.raises(ConfigError) as e:
    validate(RunConfig.make(cluster=str(path)))
  assert e.value.field == "cluster" and e.value.value == str(path)
  assert allowed in str(e.value)


def test_a_profile_of_another_model_or_batch_size_is_refused(tmp_path, capsys):
  profile = _write(tmp_path / "p.json", batch_size=32)
  code = main(["run", "--engine", "sim", "--algorithm", "asp", "--model", "mlp",
               "--batch-size", "16", "--cluster", profile, "--steps", "2", "--no-progress",
               "--out", str(tmp_path / "run")])
  err = capsys.readouterr().err
  assert code == 2 and len(err.strip().splitlines()) == 1
  assert "measured for model mlp, dataset digits, batch size 32" in err
  assert read_profile(profile).batch_size == 32  # untouched


@pytest.mark.parametrize("args,allowed", [
    (["--profile", "profile.txt"], "a path PATH.json for the profile"),
    (["--profile", "existing.json"], "a path with no file yet, or --overwrite"),
    (["--profile=existing.json"], "a path with no file yet, or --overwrite"),
    (["--profile"], "a path PATH.json for the profile"),
])
def test_calibrate_refuses_a_bad_profile_path_before_measuring(tmp_path, monkeypatch, capsys,
                                                               args, allowed):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "existing.json").write_text("{}")
  assert main(["calibrate", *args]) == 2
  err = capsys.readouterr().err
  assert err.startswith("jaxdl calibrate: error: --profile") and allowed in err
  assert (tmp_path / "existing.json").read_text() == "{}"  # nothing lost


@pytest.mark.slow
def test_calibrate_measures_a_profile_the_simulator_runs(tmp_path, capsys):
  path = tmp_path / "profile.json"
  assert main(["calibrate", "--model", "mlp", "--batch-size", "16", "--steps", "20",
               "--no-progress", "--profile", str(path)]) == 0
  profile = json.loads(path.read_text())
  assert (profile["model"], profile["dataset"], profile["batch_size"]) == ("mlp", "digits", 16)
  for name in ("compute_time", "server_time", "order_time"):
    assert 0 < profile[name] < 1
  for run in profile["measured"].values():
    assert run["updates"] == 20
    # the machine's CPU seconds hold the central actor's (/proc/stat counts in 10 ms ticks)
    assert run["machine_cpu_s"] >= run["central_cpu_s"] - 0.02
  assert set(profile["measured"]) == set(calibrate.probes().values())
  server = profile["measured"][calibrate.probes()["server_time"]]
  assert profile["server_time"] == max((server["cpu_bound"] + server["cycle_bound"]) / 2,
                                       server["machine_bound"])
  summary = jaxdl.run(RunConfig.make(
      algorithm="ssp", engine="sim", workers=2, model="mlp", batch_size=16, steps=5,
      cluster=str(path), progress=False, out=str(tmp_path / "sim")))
  assert summary["status"] == "completed" and summary["simulated_time_s"] > 0
