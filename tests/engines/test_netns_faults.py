"""A node of a ray run's cluster dies mid-run (a cluster of network
namespaces, bench/netns_cluster.py; `kill_node` SIGKILLs every process of a
node): a worker node's workers are restarted on a node alive and the run
loses no update; the head's death ends the driver in one line, and --resume
on a new cluster completes the run."""
import json
import subprocess
import time

import pytest

from bench.netns_cluster import NetnsCluster, allowed, leftovers
from jaxdl import trace
from tests.engines.test_netns import same_run_elsewhere
from tests.helpers import jaxdl_command

NOT_ALLOWED = allowed()
pytestmark = [pytest.mark.skipif(NOT_ALLOWED is not None, reason=NOT_ALLOWED or ""),
              pytest.mark.slow]

# Each worker's batch takes 0.1 s (--compute-time: the emulated device), so
# that a run's pace does not hang on the load of the machine: four workers
# do 40 updates a second, two 20.
PACED = ("--algorithm", "asp", "--model", "mlp", "--batch-size", "8", "--compute-time", "0.1",
         "--no-progress")


def _first_checkpoint(run: subprocess.Popen, out, timeout: float = 240) -> None:
  """Waits until the run has written its first checkpoint's trace."""
  deadline = time.monotonic() + timeout
  while not (out / "trace.jsonl").exists():
    if run.poll() is not None or time.monotonic() > deadline:
      run.kill()
      pytest.fail(f"no checkpoint; the run's stderr ends: {run.communicate()[1][-3000:]}")
    time.sleep(0.2)


def _applies(out) -> list[trace.Event]:
  return [e for e in trace.read_trace(out / "trace.jsonl") if e.kind == "apply"]


def test_a_dead_worker_nodes_workers_are_restarted_elsewhere_and_no_update_is_lost(tmp_path):
  """4 workers round robin over 2 worker nodes; node 2 (workers 1 and 3)
  dies at the first checkpoint: Ray restarts both on a node alive, each
  pulls again at its clock and works on, the server applies the whole
  budget (versions 1 to 4 x 400, none lost), trace and summary record the
  restarts, and the trace replays to the run's parameters."""
  out, steps = tmp_path / "run", 400
  with NetnsCluster(workers=2) as cluster:
    cluster.start_ray(2)
    run = cluster.popen(0, jaxdl_command(
        "run", *PACED, "--engine", "ray", "--workers", "4", "--steps", str(steps),
        "--checkpoint-every", "50", "--ray-address", cluster.address, "--out", str(out)),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
      _first_checkpoint(run, out)
      dead = cluster.nodes[2].address
      processes = json.loads((out / "cluster.json").read_text())["processes"]
      assert [p["node"] for p in processes if p["role"].startswith("worker")] == [
          cluster.nodes[1].address, dead] * 2
      cluster.kill_node(2)
      _, stderr = run.communicate(timeout=400)
    finally:
      run.kill()
    assert run.returncode == 0, stderr[-3000:]
    alive = {n.address for n in cluster.nodes} - {dead}
  assert leftovers(cluster.tag) == []
  summary = json.loads((out / "summary.json").read_text())
  assert summary["steps"] == steps and summary["restarts_per_worker"] == [0, 1, 0, 1]
  assert set(summary["worker_nodes"]) <= alive
  events = list(trace.read_trace(out / "trace.jsonl"))
  restarts = {e.worker: e.time for e in events if e.kind == "restart"}
  assert sorted(restarts) == [1, 3]
  applies = _applies(out)
  assert [e.version for e in applies] == list(range(1, 4 * steps + 1))
  for w, at in restarts.items():  # each works on once restarted
    assert any(e.worker == w and e.time > at for e in applies), w
  again = same_run_elsewhere(out, tmp_path / "replay")
  assert again["params_fingerprint"] == summary["params_fingerprint"]


def test_a_dead_head_ends_the_driver_in_one_line_and_resume_completes_the_run(tmp_path):
  """The driver in a worker node; the head node (the GCS, a worker) dies
  after the first checkpoint: the driver ends within 30 s, one line on
  stderr, exit code 1. On a new cluster (other addresses), --resume with
  the new --ray-address continues from the checkpoint to the run's 300
  steps: the server applied versions 1 to 2 x 300, and the trace of both
  runs replays to the parameters."""
  out, steps = tmp_path / "run", 300
  flags = ("run", *PACED, "--engine", "ray", "--workers", "2", "--steps", str(steps),
           "--checkpoint-every", "20", "--out", str(out))
  with NetnsCluster(workers=2) as cluster:
    cluster.start_ray(2)
    run = cluster.popen(1, jaxdl_command(*flags, "--ray-address", cluster.address),
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
      _first_checkpoint(run, out)
      cluster.kill_node(0)
      killed = time.monotonic()
      _, stderr = run.communicate(timeout=120)
      ended = time.monotonic() - killed
    finally:
      run.kill()
    old = cluster.address
  assert ended < 30 and run.returncode == 1, (ended, stderr[-3000:])
  assert stderr.splitlines() == [
      f"jaxdl: error: the Ray cluster's head at {old} has accepted no connection for 10 s (its "
      "machine or its GCS is down): the run ends; --resume continues it from its last "
      "checkpoint on a running cluster (--ray-address)"]
  done_before = len(_applies(out))
  assert 0 < done_before < 2 * steps
  with NetnsCluster(workers=2) as cluster:
    assert cluster.address != old
    cluster.start_ray(2)
    resumed = cluster.run(1, jaxdl_command(*flags, "--resume", "--ray-address", cluster.address),
                          capture_output=True, text=True, timeout=400)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["steps"] == steps
  assert [e.version for e in _applies(out)] == list(range(1, 2 * steps + 1))
  again = same_run_elsewhere(out, tmp_path / "replay")
  assert again["params_fingerprint"] == summary["params_fingerprint"]
