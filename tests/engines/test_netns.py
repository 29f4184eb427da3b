"""Several machines on one: a cluster of network namespaces (bench/netns_cluster.py),
each node its own network stack and address with a Ray node in it, joined
with the cluster's token; nothing of it left after an exit, an error or a
Ctrl-C; a client without the token refused in one line."""
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.netns_cluster import NetnsCluster, allowed, leftovers
from tests.helpers import jaxdl_command

NOT_ALLOWED = allowed()
pytestmark = pytest.mark.skipif(NOT_ALLOWED is not None, reason=NOT_ALLOWED or "")


@pytest.fixture(scope="module")
def ray_cluster():
  """A head and two worker nodes, each a namespace with a Ray node (2 CPUs)."""
  with NetnsCluster(workers=2) as cluster:
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
  tag = f"jx{script.pid % 100000}"
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
