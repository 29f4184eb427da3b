"""Several machines on one: a cluster of network namespaces (bench/netns_cluster.py),
each node its own network stack and address with a Ray node in it, joined
with the cluster's token; nothing of it left after an exit, an error or a
Ctrl-C; a client without the token refused in one line; a ray run's actors
on the nodes where they belong, its trace replaying to its parameters.
(A node that dies mid-run: test_netns_faults.py.)"""
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from unittest import mock

import numpy as np
import pytest

import jaxdl
from bench.netns_cluster import NetnsCluster, allowed, leftovers
from jaxdl.config import RunConfig
from tests.engines.test_ray_cluster import _documented_cluster_commands
from tests.helpers import jaxdl_command

NOT_ALLOWED = allowed()
pytestmark = pytest.mark.skipif(NOT_ALLOWED is not None, reason=NOT_ALLOWED or "")


def documented_ports() -> list[str]:
  """The `ray start` flags that fix Ray's ports, as the ray page's cluster
  commands give them (its PORTS line)."""
  [line] = [c for c in _documented_cluster_commands() if c.startswith("PORTS=")]
  return shlex.split(shlex.split(line)[0].partition("=")[2])


@pytest.fixture(scope="module")
def ray_cluster():
  """A head and two worker nodes, each a namespace with a Ray node (2 CPUs),
  started with the documented ports from a process where a local Ray
  instance ran before (it leaves Ray's switch that refuses other nodes in
  the environment)."""
  with mock.patch.dict(os.environ, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}):
    cluster = NetnsCluster(workers=2)
  with cluster:
    cluster.start_ray(2, documented_ports())
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


def ray_run(cluster: NetnsCluster, node: int, out, *flags: str, timeout: float = 300):
  """`jaxdl run --engine ray` of the mlp in node `node`, joining the cluster."""
  return cluster.run(node, jaxdl_command(
      "run", "--engine", "ray", "--model", "mlp", "--batch-size", "8", "--no-progress",
      "--ray-address", cluster.address, "--out", str(out), *flags),
      capture_output=True, text=True, timeout=timeout)


def same_run_elsewhere(out, again) -> dict:
  """The run in `out` again where its bits are known: an asynchronous run's
  trace replayed on the sim engine; a collective one on the mesh engine
  (its processes run the mesh's step)."""
  config = RunConfig.load(str(out / "config.json")).replace(out=str(again), resume=False)
  if config.algorithm.algorithm == "bsp":
    return jaxdl.run(config.replace(engine="mesh", ray_address=None))
  return jaxdl.run(config.replace(engine="sim", replay=str(out / "trace.jsonl")))


@pytest.mark.slow
@pytest.mark.parametrize("name, flags, central, actors", [
    ("asp", (), 0, 1), ("ssp", ("--staleness-bound", "1"), 0, 1), ("gosgd", (), 0, 1),
    ("ad_psgd", (), 0, 1), ("easgd", (), 0, 1), ("bsp", (), 0, 0),
    ("asp", ("--servers", "2"), 2, 3)])  # the server and its 2 shards on node 2
def test_a_run_places_its_workers_on_the_other_nodes_and_replays(ray_cluster, tmp_path, name,
                                                                 flags, central, actors):
  """The driver in the head node: the central actors (`actors` of them:
  server, shards, coordinator; bsp has none) on the driver's node or
  --server-node's (node `central`); the workers round robin over the other
  nodes, by address (two workers: one on each); the run's parameters are
  its trace's replay's on the sim (bsp's: the mesh's)."""
  out = tmp_path / "run"
  nodes = [n.address for n in ray_cluster.nodes]
  where = ("--server-node", nodes[central]) if central else ()
  done = ray_run(ray_cluster, 0, out, "--algorithm", name, "--workers", "2", "--steps", "12",
                 *flags, *where)
  assert done.returncode == 0, done.stderr[-3000:]
  processes = json.loads((out / "cluster.json").read_text())["processes"]
  assert processes[0]["role"] == "driver" and processes[0]["node"] == nodes[0]
  workers = [p["node"] for p in processes if p["role"].startswith("worker")]
  assert workers == sorted(set(nodes) - {nodes[central]}) and len(set(workers)) == 2
  assert [p["node"] for p in processes[1:] if not p["role"].startswith("worker")] == (
      [nodes[central]] * actors)
  summary = json.loads((out / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["steps"] == 12
  again = same_run_elsewhere(out, tmp_path / "again")
  assert again["params_fingerprint"] == summary["params_fingerprint"]


@pytest.mark.slow
def test_a_server_node_no_alive_node_has_is_refused_in_one_line(ray_cluster, tmp_path):
  out = tmp_path / "run"
  stranger = ray_cluster.nodes[0].address.rpartition(".")[0] + ".99"
  refused = ray_run(ray_cluster, 0, out, "--algorithm", "asp", "--workers", "2", "--steps", "4",
                    "--server-node", stranger, timeout=180)
  assert refused.returncode == 2, refused.stderr[-2000:]
  [line] = refused.stderr.strip().splitlines()
  alive = ", ".join(n.address for n in ray_cluster.nodes)
  assert line == (f"jaxdl run: error: --server-node='{stranger}' is not valid: the address of "
                  f"an alive node of the Ray cluster: {alive}")
  assert not out.exists()


def _connections(cluster: NetnsCluster) -> tuple[set, set]:
  """The TCP connections between two of the cluster's nodes now, each as
  ((address, port), (address, port)), and every node's listening sockets,
  (address, port), "*" for any address (`ss`, in each node's namespace)."""
  nodes = {n.address for n in cluster.nodes}
  connected, listening = set(), set()
  for node in cluster.nodes:
    for state, into in (("established", connected), ("listening", listening)):
      lines = subprocess.run(["ip", "netns", "exec", node.name, "ss", "-tnH", "state", state],
                             capture_output=True, text=True, timeout=30).stdout.splitlines()
      for line in lines:
        ends = [e.replace("[::ffff:", "").replace("]", "").rpartition(":")[::2]
                for e in line.split()[-2:]]
        if state == "listening":
          into.add((node.address if ends[0][0] in ("*", "0.0.0.0") else ends[0][0], ends[0][1]))
        elif ends[0][0] != ends[1][0] and {ends[0][0], ends[1][0]} <= nodes:
          into.add((ends[0], ends[1]))
  return connected, listening


@pytest.mark.slow
def test_the_nodes_reach_one_another_on_the_documented_ports_only(ray_cluster, tmp_path):
  """While a run's actors talk across the nodes (gosgd: worker to worker,
  and each with its coordinator), every connection between two nodes goes
  to the head's GCS port or a port the documented flags fix: the node and
  object managers', a worker's in the range."""
  flags = documented_ports()
  fixed = {flags[i + 1] for i, f in enumerate(flags) if f.endswith("manager-port")}
  low, high = (int(flags[flags.index(f) + 1]) for f in ("--min-worker-port", "--max-worker-port"))
  run = ray_cluster.popen(0, jaxdl_command(
      "run", "--engine", "ray", "--algorithm", "gosgd", "--workers", "4", "--model", "mlp",
      "--batch-size", "8", "--steps", "150", "--no-progress", "--ray-address",
      ray_cluster.address, "--out", str(tmp_path / "run")), stderr=subprocess.PIPE, text=True)
  connected, listening = set(), set()
  try:
    while run.poll() is None:
      now, listens = _connections(ray_cluster)
      connected |= now
      listening |= listens
      time.sleep(0.3)
  finally:
    run.kill()
  assert run.returncode == 0, run.stderr.read()[-3000:]
  assert connected and all(a in listening or b in listening for a, b in connected)
  served = {end for pair in connected for end in pair if end in listening}  # the servers' ends
  ports = {port for _, port in served}
  assert ports <= {"6379", *fixed} | {str(p) for p in range(low, high + 1)}, ports
  # each kind was seen: the GCS, both managers, workers of every node
  assert {"6379", *fixed} <= ports
  assert {a for a, p in served if low <= int(p) <= high} == {n.address for n in ray_cluster.nodes}


@pytest.mark.slow
def test_calibrate_measures_shaped_links_that_the_simulator_then_respects(tmp_path):
  """Each worker node's link shaped to 100 Mb/s both ways: `jaxdl
  calibrate` on the cluster measures 2 worker machines, a bandwidth never
  above 125% of the rate, within 25% of it in one of two measurements, and a
  latency; the sim with that profile charges each of a worker's messages at
  least its time on the link. (The shaping caps what any measurement sees.
  What a busy machine's Ray calls add makes the link look slower: 66 Mb/s
  once, beside the slow suite's other process; 100-104 Mb/s on a quiet
  machine, BENCHMARKS.md.)"""
  sim_out, rate = tmp_path / "sim", 100e6
  with NetnsCluster(workers=2) as cluster:
    for node in (1, 2):
      cluster.shape(node, "100mbit")
    cluster.start_ray(2)
    for attempt in range(2):
      profile = tmp_path / f"profile-{attempt}.json"
      done = cluster.run(0, jaxdl_command(
          "calibrate", "--model", "mlp", "--batch-size", "8", "--steps", "30",
          "--no-progress", "--ray-address", cluster.address, "--profile", str(profile)),
          capture_output=True, text=True, timeout=600)
      assert done.returncode == 0, done.stderr[-3000:]
      measured = json.loads(profile.read_text())
      assert measured["bandwidth"] * 8 <= 1.25 * rate, measured["bandwidth"]
      if measured["bandwidth"] * 8 >= 0.75 * rate:
        break
  assert leftovers(cluster.tag) == []
  assert measured["worker_nodes"] == 2
  assert 0.75 * rate <= measured["bandwidth"] * 8, measured["bandwidth"]
  assert 0 < measured["latency"] < 0.05
  assert measured["central_bandwidth"] >= measured["bandwidth"]
  links = measured["measured"]["links"]
  assert len(links["nodes"]) == 2 and links["message_bytes"] > 0
  steps = 10
  summary = jaxdl.run(RunConfig.make(
      algorithm="asp", engine="sim", workers=2, model="mlp", batch_size=8, steps=steps,
      cluster=str(profile), out=str(sim_out), progress=False))
  # each worker's update: a pull and a push of the model over its machine's link
  floor = steps * 2 * (links["message_bytes"] / measured["bandwidth"] + measured["latency"])
  assert floor <= summary["simulated_time_s"] <= 2 * floor + steps * (
      measured["compute_time"] + 2 * measured["server_time"])
