"""A cluster of several machines on one: Linux network namespaces, each its
own network stack and address, with a Ray node in each.

A head node and worker nodes, each a namespace with one interface (`eth0`,
an address in a private /24 that the cluster chose for itself), joined by
veth pairs to a bridge in a namespace of its own (the switch): nothing is
made in the machine's own namespace, and no traffic leaves the namespaces.
Each node's /etc/hosts (`ip netns exec` reads /etc/netns/NAME/hosts) maps
this machine's host name to the node's own address, as a machine's own name
resolves to its address: a library that advertises the address its host
name resolves to (gloo, which jax.distributed's CPU collectives use) gives
its node's. A worker node's link can be shaped by `tc qdisc ... tbf` (rate, burst,
latency), in both directions. Ray starts in each node with token
authentication (`RAY_AUTH_MODE=token`, a token made for the cluster, in a
home of its own readable by its owner only); the head listens on
`address`, and a driver runs in any node's namespace (`run`). The nodes
share this machine's processes and files: Ray's driver, which looks for a
raylet among the processes, sees every node's and takes the head's unless
told its node's address (jaxdl's driver tells it the address it reaches
the head from: jaxdl.engines.ray_cluster.own_node).

Everything is torn down on exit, on an error and on Ctrl-C: the processes
in the cluster's namespaces (`ip netns pids`, so none other) are killed,
then the namespaces deleted, which deletes their interfaces and qdiscs.
`leftovers` says what of a cluster remains (nothing, after `down`).

As root (or with CAP_NET_ADMIN and CAP_SYS_ADMIN) only: `allowed()` says
why not where namespaces cannot be made.

  python -m bench.netns_cluster --rate 100mbit -- \\
      jaxdl run --engine ray --algorithm asp --workers 4 --ray-address {address}

runs the command in the head's namespace with `{address}` replaced by the
head's HOST:PORT, and tears the cluster down when it ends.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

RAY_PORT = 6379
BURST = "32kb"
"""A shaped link's token bucket, in tc's units."""
BRIDGE = "br0"
_MADE = itertools.count()  # clusters made by this process
ETC = Path("/etc/netns")
JOIN_ATTEMPTS = 3  # `ray start --address` tries per node  # `ip netns exec NAME` mounts ETC/NAME/* over /etc/*


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
  return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def allowed() -> str | None:
  """None where this process can make network namespaces, else why not (one line)."""
  if shutil.which("ip") is None or shutil.which("tc") is None:
    return "network namespaces need the ip and tc commands (iproute2)"
  name = f"jxprobe{os.getpid()}"
  made = _ip("netns", "add", name, check=False)
  if made.returncode != 0:
    return f"network namespaces are not allowed here: {made.stderr.strip()}"
  _ip("netns", "del", name, check=False)
  return None


@dataclasses.dataclass
class Node:
  name: str      # its namespace
  address: str   # its eth0's address
  port: str      # its veth's end in the switch namespace


class NetnsCluster:
  """A head and `workers` worker nodes, each a network namespace.

  Attributes:
    nodes: the head first, then the worker nodes.
    address: the head's Ray address, HOST:PORT (once `start_ray` ran).
    env: the environment a process of the cluster runs with (Ray's token
      authentication on, the cluster's token, its Ray directory).
  """

  def __init__(self, workers: int = 2, tag: str | None = None):
    k = next(_MADE)
    self.tag = tag or f"jx{os.getpid() % 100000}c{k}"  # the first of a process: ...c0
    subnet = 100 + (os.getpid() + 7 * k) % 150  # 10.231.100-249.0/24: clusters apart
    self.switch = f"{self.tag}-sw"
    self.nodes = [Node(f"{self.tag}-n{i}", f"10.231.{subnet}.{i + 1}", f"p{i}")
                  for i in range(workers + 1)]
    self.address = f"{self.nodes[0].address}:{RAY_PORT}"
    self.home = Path(tempfile.mkdtemp(prefix=f"{self.tag}-home-"))
    os.chmod(self.home, 0o700)
    self.env = {**os.environ, "HOME": str(self.home), "RAY_AUTH_MODE": "token",
                "RAY_TMPDIR": str(self.home / "ray"), "RAY_USAGE_STATS_ENABLED": "0"}
    # a local Ray instance started earlier in this process (jaxdl's ray engine)
    # leaves RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, with which no node may join
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS",
                 "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
      self.env.pop(name, None)

  @property
  def namespaces(self) -> list[str]:
    return [self.switch] + [n.name for n in self.nodes]

  def up(self) -> "NetnsCluster":
    """Makes the namespaces, the switch's bridge and each node's link."""
    _ip("netns", "add", self.switch)
    _ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
    _ip("-n", self.switch, "link", "set", BRIDGE, "up")
    for node in self.nodes:
      _ip("netns", "add", node.name)
      _ip("-n", node.name, "link", "set", "lo", "up")
      # both ends made where they live: nothing passes through this namespace
      _ip("-n", node.name, "link", "add", "eth0", "type", "veth", "peer", "name", node.port,
          "netns", self.switch)
      _ip("-n", node.name, "addr", "add", f"{node.address}/24", "dev", "eth0")
      _ip("-n", node.name, "link", "set", "eth0", "up")
      _ip("-n", self.switch, "link", "set", node.port, "master", BRIDGE)
      _ip("-n", self.switch, "link", "set", node.port, "up")
      (ETC / node.name).mkdir(parents=True, exist_ok=True)
      (ETC / node.name / "hosts").write_text(
          f"127.0.0.1 localhost\n{node.address} {socket.gethostname()}\n")
    return self

  def shape(self, node: int, rate: str, burst: str = BURST, latency: str = "50ms") -> None:
    """Limits node `node`'s link to `rate` (tc's units: 1gbit, 100mbit) in
    both directions with a token bucket (`tbf`) of `burst` bytes: a small
    bucket, as a link of that rate, which sends no message faster than its
    rate; a large one lets a message of up to its size through at once,
    after a pause (a 256 kB bucket made a 100 Mb/s link carry the mlp's
    200 kB messages at about 2 x its rate)."""
    n = self.nodes[node]
    for namespace, device in ((n.name, "eth0"), (self.switch, n.port)):
      subprocess.run(["tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", "tbf",
                      "rate", rate, "burst", burst, "latency", latency], check=True,
                     capture_output=True, timeout=30)

  def popen(self, node: int, argv: list[str], **kwargs) -> subprocess.Popen:
    """`argv` started in node `node`'s namespace with the cluster's environment."""
    env = {**self.env, **kwargs.pop("env", {})}
    return subprocess.Popen(["ip", "netns", "exec", self.nodes[node].name, *argv], env=env,
                            **kwargs)

  def run(self, node: int, argv: list[str], timeout: float = 600, **kwargs):
    """`argv` run to its end in node `node`'s namespace."""
    env = {**self.env, **kwargs.pop("env", {})}
    return subprocess.run(["ip", "netns", "exec", self.nodes[node].name, *argv], env=env,
                          timeout=timeout, **kwargs)

  def start_ray(self, cpus_per_node: int = 2, flags: Sequence[str] = ()) -> None:
    """The cluster's token (`ray get-auth-token --generate`, in its home,
    readable by its owner only), a Ray head in node 0 and a node joining it
    in each other; `flags` go to every `ray start` (the ports it fixes:
    --node-manager-port ...)."""
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    old = os.umask(0o077)
    try:
      self.run(0, [ray, "get-auth-token", "--generate"], check=True, capture_output=True,
               timeout=60)
    finally:
      os.umask(old)
    common = [f"--num-cpus={cpus_per_node}", "--disable-usage-stats", *flags]
    head = self.nodes[0]
    self.run(0, [ray, "start", "--head", f"--node-ip-address={head.address}",
                 f"--port={RAY_PORT}", "--include-dashboard=false", *common],
             check=True, capture_output=True, timeout=120)
    for i, node in enumerate(self.nodes[1:], 1):
      self._join(i, [ray, "start", f"--address={self.address}",
                     f"--node-ip-address={node.address}", *common])

  def _join(self, node: int, argv: list[str], attempts: int = JOIN_ATTEMPTS) -> None:
    """`ray start --address` in node `node`, again after a failure (a head
    still starting on a loaded machine refuses a node for a while); a
    RuntimeError with Ray's last words once `attempts` failed."""
    for attempt in range(attempts):
      done = self.run(node, argv, capture_output=True, text=True, timeout=180)
      if done.returncode == 0:
        return
      self.kill_node(node)  # what a failed start left, before the next
      time.sleep(2 * (attempt + 1))
    raise RuntimeError(f"node {node} did not join {self.address} in {attempts} attempts: "
                       f"{(done.stderr or done.stdout)[-2000:]}")

  def pids(self) -> list[int]:
    """The processes in the cluster's namespaces."""
    found = []
    for namespace in self.namespaces:
      listed = _ip("netns", "pids", namespace, check=False)
      found += [int(p) for p in listed.stdout.split()] if listed.returncode == 0 else []
    return found

  def kill_node(self, node: int) -> list[int]:
    """SIGKILL to every process in node `node`'s namespace (a machine that
    dies); the PIDs killed."""
    listed = _ip("netns", "pids", self.nodes[node].name, check=False)
    pids = [int(p) for p in listed.stdout.split()]
    _kill(pids)
    return pids

  def down(self) -> list[str]:
    """Kills the cluster's processes, deletes its namespaces (their links
    and qdiscs with them) and its home; what remains (`leftovers`)."""
    for _ in range(3):  # a process may fork while the first are killed
      pids = self.pids()
      if not pids:
        break
      _kill(pids)
    for namespace in self.namespaces:
      _ip("netns", "del", namespace, check=False)
      shutil.rmtree(ETC / namespace, ignore_errors=True)
    shutil.rmtree(self.home, ignore_errors=True)
    return leftovers(self.tag)

  def __enter__(self) -> "NetnsCluster":
    try:
      return self.up()
    except BaseException:
      self.down()
      raise

  def __exit__(self, *exc) -> None:
    self.down()


def _kill(pids: list[int], timeout: float = 10.0) -> None:
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and any(_alive(p) for p in pids):
    time.sleep(0.05)


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (FileNotFoundError, ProcessLookupError, IndexError):
    return False


def leftovers(tag: str) -> list[str]:
  """What of the cluster `tag` exists: its namespaces, interfaces of its name
  in this namespace (none is ever made here) and processes in its namespaces."""
  found = [f"namespace {n}" for n in _ip("netns", "list", check=False).stdout.split()
           if n.startswith(f"{tag}-")]
  found += [f"file {p}" for p in ETC.glob(f"{tag}-*")] if ETC.exists() else []
  found += [f"interface {line.split(':')[1].strip()}"
            for line in _ip("-o", "link", "show", check=False).stdout.splitlines()
            if f" {tag}" in line]
  return found


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      description="Runs a command in the head node of a cluster of network namespaces "
                  "with a Ray node in each; tears it down when the command ends.")
  parser.add_argument("--workers", type=int, default=2, help="worker nodes (default 2)")
  parser.add_argument("--rate", default=None,
                      help="each worker node's link rate, tc units (1gbit, 100mbit); "
                           "default: unshaped")
  parser.add_argument("--burst", default=BURST,
                      help=f"the shaped links' token bucket, tc units (default {BURST})")
  parser.add_argument("--cpus", type=int, default=2, help="Ray CPUs per node (default 2)")
  parser.add_argument("--no-ray", action="store_true", help="the network alone, no Ray nodes")
  parser.add_argument("command", nargs=argparse.REMAINDER,
                      help="-- COMMAND ...: {address} is replaced by the head's HOST:PORT")
  args = parser.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  why = allowed()
  if why:
    print(f"netns_cluster: {why}", file=sys.stderr)
    return 2
  cluster = NetnsCluster(args.workers)
  command = [a.replace("{address}", cluster.address) for a in command]
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through `finally`
  signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
  try:
    cluster.up()
    if args.rate:
      for i in range(1, len(cluster.nodes)):
        cluster.shape(i, args.rate, args.burst)
    if not args.no_ray:
      cluster.start_ray(args.cpus)
    print(f"netns_cluster: head {cluster.address}, nodes "
          f"{', '.join(n.address for n in cluster.nodes)}", file=sys.stderr, flush=True)
    return cluster.run(0, command, timeout=None).returncode if command else 0
  except KeyboardInterrupt:
    return 130
  finally:
    left = cluster.down()
    if left:
      print(f"netns_cluster: left behind: {', '.join(left)}", file=sys.stderr)


if __name__ == "__main__":
  sys.exit(main())
