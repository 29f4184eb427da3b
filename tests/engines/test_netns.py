"""Several machines on one: a cluster of network namespaces (bench/netns_cluster.py),
each node its own network stack and address with a Ray node in it, joined
with the cluster's token; nothing of it left after an exit, an error or a
Ctrl-C; a client without the token refused in one line."""
import json
import os
import signal
import subprocess
import sys
import time
from unittest import mock

import numpy as np
import pytest

from bench.netns_cluster import NetnsCluster, allowed, leftovers
from tests.helpers import jaxdl_command

NOT_ALLOWED = allowed()
pytestmark = pytest.mark.skipif(NOT_ALLOWED is not None, reason=NOT_ALLOWED or "")


@pytest.fixture(scope="module")
def ray_cluster():
  """A head and two worker nodes, each a namespace with a Ray node (2 CPUs),
  started from a process where a local Ray instance ran before (it leaves
  Ray's switch that refuses other nodes in the environment)."""
  with mock.patch.dict(os.environ, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}):
    cluster = NetnsCluster(workers=2)
  with cluster:
    cluster.start_ray(2)
    yield cluster
  assert leftovers(cluster.tag) == []


def test_a_cluster_is_gone_after_an_exit_and_an_error():
  with NetnsCluster(workers=2) as cluster:
    cluster.shape(1, "100mbit")
    reached = cluster.run(1, [sys.executable, "-c", _CONNECT, cluster.nodes[0].address],
                          capture_output=True, text=True, timeout=60)
    assert reached.stdout.strip() == "refused", reached.stderr  # a live address, no listener
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(n in names for n in cluster.namespaces)
    qdisc = subprocess.run(["tc", "-n", cluster.nodes[1].name, "qdisc", "show", "dev", "eth0"],
                           capture_output=True, text=True).stdout
    assert "tbf" in qdisc and "100Mbit" in qdisc
  assert leftovers(cluster.tag) == []
  with pytest.raises(RuntimeError, match="mid-way"):
    with NetnsCluster(workers=1) as cluster:
      sleeper = cluster.popen(1, ["sleep", "60"])
      raise RuntimeError("mid-way")
  assert leftovers(cluster.tag) == [] and sleeper.wait(10) == -signal.SIGKILL


_CONNECT = """
import socket, sys
try:
  socket.create_connection((sys.argv[1], 9), timeout=5)
  print("connected")
except ConnectionRefusedError:
  print("refused")
except OSError as e:
  print(type(e).__name__)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_script_tears_its_cluster_down_on_ctrl_c_and_sigterm(sig):
  script = subprocess.Popen([sys.executable, "-m", "bench.netns_cluster", "--no-ray", "--rate",
                             "1gbit", "--", "sleep", "120"], stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  tag = f"jx{script.pid % 100000}c0"
  try:
    line = script.stderr.readline()
    assert line.startswith("netns_cluster: head "), line
    assert len([n for n in leftovers(tag) if n.startswith("namespace")]) == 4
    script.send_signal(sig)
    code = script.wait(30)
  finally:
    if script.poll() is None:
      script.kill()
  assert code == (130 if sig == signal.SIGINT else 143)
  assert leftovers(tag) == []


@pytest.mark.slow
def test_ray_nodes_in_three_namespaces_join_with_the_token(ray_cluster):
  query = ("import ray, sys; ray.init(address=sys.argv[1]); "
           "print(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))")
  done = ray_cluster.run(1, [sys.executable, "-c", query, ray_cluster.address],
                         capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == str(sorted(n.address for n in ray_cluster.nodes))


@pytest.mark.slow
def test_a_client_without_the_token_is_refused_in_one_line(ray_cluster, tmp_path):
  home = tmp_path / "stranger"
  home.mkdir()
  refused = ray_cluster.run(
      2, jaxdl_command("run", "--algorithm", "asp", "--engine", "ray", "--workers", "2",
                       "--model", "mlp", "--steps", "5", "--no-progress",
                       "--ray-address", ray_cluster.address, "--out", str(tmp_path / "run")),
      capture_output=True, text=True, timeout=180,
      env={"HOME": str(home), "RAY_TMPDIR": str(tmp_path / "ray")})
  assert refused.returncode == 2, refused.stderr[-2000:]
  [line] = refused.stderr.strip().splitlines()
  assert "--ray-address" in line and "token" in line
  assert not (tmp_path / "run").exists()


def _losses(run_dir) -> list[float]:
  lines = (run_dir / "metrics.jsonl").read_text().splitlines()
  return [json.loads(l)["train_loss"] for l in lines if "train_loss" in json.loads(l)]


@pytest.mark.slow
def test_jax_distributed_across_namespaces_gives_one_process_losses(tmp_path):
  """bsp with 4 workers as 2 processes (2 CPU devices each) on two nodes,
  jax.distributed's coordinator on the first node's address, gloo across
  the link: the one-process run's losses, step by step."""
  args = ["run", "--algorithm", "bsp", "--workers", "4", "--model", "mlp", "--steps", "12",
          "--batch-size", "8", "--log-every", "1", "--no-progress"]
  devices = lambda n: {"XLA_FLAGS": f"--xla_force_host_platform_device_count={n}",
                       "JAX_PLATFORMS": "cpu"}
  with NetnsCluster(workers=1) as cluster:
    address = f"{cluster.nodes[0].address}:{_PORT}"
    processes = [cluster.popen(i, [*jaxdl_command(*args), "--out", str(tmp_path / "multi"),
                                   "--coordinator-address", address, "--num-processes", "2",
                                   "--process-id", str(i)],
                               env=devices(2), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
  assert [p.returncode for p in processes] == [0, 0], [o[-2000:] for o in outputs]
  single = subprocess.run([*jaxdl_command(*args), "--out", str(tmp_path / "one")],
                          env={**os.environ, **devices(4)}, capture_output=True, text=True,
                          timeout=300)
  assert single.returncode == 0, single.stderr[-2000:]
  multi = json.loads((tmp_path / "multi" / "summary.json").read_text())
  assert multi["processes"] == 2 and multi["devices"] == 4
  many, one = _losses(tmp_path / "multi"), _losses(tmp_path / "one")
  assert len(many) == len(one) == 12
  np.testing.assert_allclose(many, one, rtol=1e-5)


_PORT = 7654
