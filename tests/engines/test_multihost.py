"""Two processes with two CPU devices each run bsp with 4 workers like one
process with four devices (jax.distributed over localhost, gloo collectives)."""
import json
import os
import signal
import socket
import subprocess
import sys

import chex
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxdl.checkpoint import abstract
from jaxdl.config import RunConfig
from tests.helpers import make_engine

ARGS = ["run", "--algorithm", "bsp", "--workers", "4", "--servers", "2", "--model", "mlp",
        "--steps", "20", "--batch-size", "8", "--no-progress"]


def _env(devices: int) -> dict:
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env.pop("JAX_COORDINATOR_ADDRESS", None)
  return env


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _final_state(run_dir):
  """The last checkpoint's arrays, restored into this process's devices."""
  config = RunConfig.load(str(run_dir / "config.json"))
  target = abstract(make_engine(config).init(jax.random.key(0)))
  manager = ocp.CheckpointManager(run_dir / "checkpoints")
  step = manager.latest_step()
  state = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(target)))["state"]
  return step, [np.asarray(x) for x in jax.tree.leaves(state)]


def test_two_processes_equal_one(tmp_path):
  address = f"127.0.0.1:{_free_port()}"
  processes = [subprocess.Popen(
      [sys.executable, "-m", "jaxdl", *ARGS, "--out", str(tmp_path / "multi"),
       "--coordinator-address", address, "--num-processes", "2", "--process-id", str(i)],
      env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  try:
    outputs = [p.communicate(timeout=240)[0] for p in processes]
  finally:
    for p in processes:  # jax.distributed catches SIGTERM: end leftovers by PID
      if p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
  assert [p.returncode for p in processes] == [0, 0], outputs
  single = subprocess.run([sys.executable, "-m", "jaxdl", *ARGS, "--out", str(tmp_path / "one")],
                          env=_env(4), capture_output=True, text=True, timeout=240)
  assert single.returncode == 0, single.stderr

  multi_summary = json.loads((tmp_path / "multi" / "summary.json").read_text())
  one_summary = json.loads((tmp_path / "one" / "summary.json").read_text())
  assert multi_summary["processes"] == 2 and multi_summary["devices"] == 4
  assert one_summary["processes"] == 1 and one_summary["devices"] == 4
  assert abs(multi_summary["test_loss"] - one_summary["test_loss"]) < 1e-5

  (step_a, multi), (step_b, one) = _final_state(tmp_path / "multi"), _final_state(tmp_path / "one")
  assert step_a == step_b == 20 and len(multi) == len(one)
  chex.assert_trees_all_close(multi, one, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_process_whose_peers_never_come_ends_in_one_line(tmp_path):
  """A multi-process config rerun alone: process 0 waits for process 1, and
  process 1 for a process 0, --coordinator-timeout seconds, then exit 2."""
  for index in (0, 1):
    out = tmp_path / f"alone{index}"
    result = subprocess.run(
        [sys.executable, "-m", "jaxdl", *ARGS, "--out", str(out), "--coordinator-address",
         f"127.0.0.1:{_free_port()}", "--num-processes", "2", "--process-id", str(index),
         "--coordinator-timeout", "2"],
        env=_env(2), capture_output=True, text=True, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert lines[0] == f"process {index} of 2: waiting up to 2 s for the others at " \
        + lines[0].split(" at ")[-1]
    assert len(lines) == 2 and lines[1].startswith("jaxdl run: error: --coordinator-address=")
    assert "--coordinator-timeout 2 s" in lines[1] and "Traceback" not in result.stderr
    assert not out.exists()
