"""Where a ray run's actors go on a cluster of several nodes (no Ray started:
the placement of a list of nodes as `ray.nodes()` gives it), which runs
take --server-node, and the watch that ends a driver whose cluster's head
stopped answering."""
import socket
import subprocess
import sys
import time

import pytest

from jaxdl.algorithms import ALGORITHMS
from jaxdl.config import RunConfig
from jaxdl.engines import check
from jaxdl.engines.ray_placement import Placement
from jaxdl.errors import ConfigError
from jaxdl.validation import validate


def _id(address: str) -> str:
  """A Ray node id (28 bytes, in hex) of its own for each address."""
  return address.replace(".", "").zfill(56)


def _node(address: str, alive: bool = True, gpus: float = 0.0) -> dict:
  return {"NodeID": _id(address), "NodeManagerAddress": address, "Alive": alive,
          "Resources": {"CPU": 2.0, **({"GPU": gpus} if gpus else {})}}


# the head (the driver's node), three more (one with a GPU), one dead
NODES = [_node("10.0.0.3"), _node("10.0.0.1"), _node("10.0.0.9", alive=False),
         _node("10.0.0.2", gpus=1.0), _node("10.0.0.4")]


def _strategy(options: dict) -> tuple[str, bool]:
  strategy = options["scheduling_strategy"]
  return strategy.node_id, strategy.soft


def test_the_central_actor_is_on_the_drivers_node_and_workers_round_robin_over_the_others():
  placement = Placement.of(NODES, driver=_id("10.0.0.1"), server_node=None)
  assert placement.central == _id("10.0.0.1") and placement.central_gpus == 0.0
  assert _strategy(placement.central_options()) == (_id("10.0.0.1"), False)  # there or nowhere
  workers = [placement.worker_options(w) for w in range(5)]
  # the other alive nodes by address, worker w on the (w mod 3)-th; soft: Ray
  # restarts a worker whose node died on another
  assert [_strategy(o) for o in workers] == [
      (_id("10.0.0.2"), True), (_id("10.0.0.3"), True), (_id("10.0.0.4"), True),
      (_id("10.0.0.2"), True), (_id("10.0.0.3"), True)]
  assert all(o["memory"] == 1 for o in workers)  # a request the affinity decides


def test_server_node_puts_the_central_actor_there_and_the_workers_elsewhere():
  placement = Placement.of(NODES, driver=_id("10.0.0.1"), server_node="10.0.0.2")
  assert placement.central == _id("10.0.0.2") and placement.central_gpus == 1.0
  assert placement.workers == (_id("10.0.0.1"), _id("10.0.0.3"), _id("10.0.0.4"))


def test_a_server_node_that_no_alive_node_has_is_refused_naming_the_alive_ones():
  for address in ("10.0.0.9", "10.0.0.7"):  # dead, unknown
    with pytest.raises(ConfigError) as refused:
      Placement.of(NODES, driver=_id("10.0.0.1"), server_node=address)
    assert str(refused.value) == (
        f"--server-node='{address}' is not valid: the address of an alive node of the Ray "
        "cluster: 10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4")


def test_on_one_node_nothing_is_placed():
  placement = Placement.of([_node("127.0.0.1")], driver=_id("127.0.0.1"),
                           server_node="127.0.0.1")
  assert placement.central_options() == {} and placement.worker_options(3) == {}


def test_server_node_is_refused_where_the_run_has_no_central_actor():
  bsp = dict(algorithm="bsp", engine="ray", workers=2, model="mlp", steps=2,
             server_node="10.0.0.2")
  with pytest.raises(ConfigError, match="--server-node='10.0.0.2' is not valid: unset for "
                     "bsp on --engine ray: its processes meet through jax.distributed"):
    validate(RunConfig.make(**bsp))
  validate(RunConfig.make(**bsp, compute_time=0.01))  # an exchange actor
  validate(RunConfig.make(**dict(bsp, algorithm="gosgd")))  # a coordinator


def test_server_node_is_the_ray_engines_and_a_replay_keeps_it():
  config = RunConfig.make(algorithm="asp", engine="sim", workers=2, model="mlp", steps=2,
                          server_node="10.0.0.2", ray_address="10.0.0.1:6379")
  with pytest.raises(ConfigError, match="--ray-address='10.0.0.1:6379' is not valid: left "
                     "unset with --engine sim: it is --engine ray's"):
    check("sim", config, ALGORITHMS.get("asp"))
  check("sim", config.replace(replay="trace.jsonl"), ALGORITHMS.get("asp"))


# A process that joins nothing: it watches the head at the address it is
# given (HEAD_TIMEOUT_S 2 s here), then sleeps.
WATCHER = """
import sys, time
from jaxdl.engines import ray_cluster
ray_cluster.HEAD_TIMEOUT_S = 2.0
ray_cluster.HeadWatch(sys.argv[1])
print("watching", flush=True)
time.sleep(120)
"""


def test_a_driver_whose_head_stops_answering_ends_with_one_line():
  """A head that accepts connections, then none (its process gone): the
  watching process ends with exit code 1 and one line on stderr, within
  HEAD_TIMEOUT_S and a few probes; one whose head still answers lives on."""
  head = socket.create_server(("127.0.0.1", 0))
  address = f"127.0.0.1:{head.getsockname()[1]}"
  watcher = subprocess.Popen([sys.executable, "-c", WATCHER, address], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  try:
    assert watcher.stdout.readline() == "watching\n"
    time.sleep(4)  # 2 probes past the timeout: it still answers
    assert watcher.poll() is None
    head.close()
    start = time.monotonic()
    _, stderr = watcher.communicate(timeout=60)
    assert time.monotonic() - start < 30
  finally:
    watcher.kill()
    head.close()
  assert watcher.returncode == 1
  assert stderr.splitlines() == [
      f"jaxdl: error: the Ray cluster's head at {address} has accepted no connection for 2 s "
      "(its machine or its GCS is down): the run ends; --resume continues it from its last "
      "checkpoint on a running cluster (--ray-address)"]
