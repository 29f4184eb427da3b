"""The simulated network: FIFO links and the links of one run (`Network`).

A message costs latency + bytes / bandwidth and holds every link on its path
while it is serialised; the parameter server's k shard links are shared by
all workers, which is what makes the PS the bottleneck as M grows (IPDPS'21,
finding F3).
"""
from __future__ import annotations

from jaxdl.cluster.cost import CostModel

class Link:
  """A FIFO link: messages are serialised one at a time, in the order sent."""

  def __init__(self, bandwidth: float, latency: float = 0.0):
    self.bandwidth, self.latency = bandwidth, latency
    self.free_at = 0.0

  def send(self, ready_time: float, nbytes: float) -> float:
    """Arrival time of a message whose data is ready at `ready_time`."""
    return send_over((self,), ready_time, nbytes)


def send_over(links, ready_time: float, nbytes: float) -> float:
  """Sends one message over a path: it starts once the data and every link are free.

  The message holds all links of its path while it is serialised (cut-through
  switching), then arrives one latency later.
  """
  return _reserve(links, ready_time, nbytes)[1] + max(link.latency for link in links)


def _reserve(links, ready_time: float, nbytes: float) -> tuple[float, float]:
  start, bandwidth = ready_time, links[0].bandwidth
  for link in links:
    start = max(start, link.free_at)
    bandwidth = min(bandwidth, link.bandwidth)
  end = start + nbytes / bandwidth
  for link in links:
    link.free_at = end
  return start, end


class Network:
  """The links of one simulated run, full duplex: each node sends on its uplink
  and receives on its downlink at full bandwidth (as ring all-reduce assumes).

  Nodes are the workers (or, with `cost.worker_nodes` n, the n machines
  they go round robin over, each machine's workers sharing its link, and
  free between themselves) and the k server shards; workers exchange over
  their own links, all workers share the shards' links. Counts the bytes
  sent and, per worker, the seconds its messages queued for a busy link
  (the "waiting time" that grows with M at a parameter server).
  """

  def __init__(self, cost: CostModel):
    self.cost = cost
    link = lambda bandwidth=cost.bandwidth: Link(bandwidth, cost.latency)
    self.nodes = cost.worker_nodes or cost.num_workers
    self.up = [link() for _ in range(self.nodes)]
    self.down = [link() for _ in range(self.nodes)]
    central = cost.bandwidth if cost.central_bandwidth is None else cost.central_bandwidth
    self.shard_up = [link(central) for _ in range(cost.servers)]
    self.shard_down = [link(central) for _ in range(cost.servers)]
    self.central_free = 0.0  # when the central process is next free
    self.bytes_total = 0.0
    self.queued_s = [0.0] * cost.num_workers

  def serve(self, worker: int, ready_time: float, seconds: float) -> float:
    """When the central process has served `worker`'s call, made at
    `ready_time`, that takes it `seconds`: it serves one call at a time."""
    start = max(ready_time, self.central_free)
    self.central_free = start + seconds
    self.queued_s[worker] += start - ready_time
    return start + seconds

  def _send(self, waiter: int, links, ready_time: float, nbytes: float) -> tuple[float, float]:
    start, end = _reserve(links, ready_time, nbytes)
    self.queued_s[waiter] += start - ready_time
    self.bytes_total += nbytes
    return end, end + self.cost.latency

  def push(self, worker: int, ready_time: float) -> float:
    """Arrival at the servers of `worker`'s message (a gradient, a model or
    an elastic difference; compressed with --compress)."""
    return self._server(worker, ready_time, self.shard_down, self.up, self.cost.push_bytes)

  def pull(self, worker: int, ready_time: float) -> float:
    """Arrival at `worker` of the servers' model (compressed with
    --compress-pull), sent from `ready_time`."""
    return self._server(worker, ready_time, self.shard_up, self.down, self.cost.pull_bytes)

  def _server(self, worker: int, ready_time: float, shards: list[Link], nodes: list[Link],
              nbytes: float) -> float:
    # The message is split into k equal parts sent in parallel, one per shard;
    # each shard's link is shared by all workers. A worker's own link only
    # caps the whole at nbytes / bandwidth: it carries nothing else meanwhile
    # in a PS schedule, so it is not reserved; a machine's link, which its
    # workers share, is.
    part = nbytes / len(shards)
    arrival, queued = ready_time + self.cost.transfer_time(nbytes), self.queued_s[worker]
    for shard in shards:
      arrival = max(arrival, self._send(worker, (shard,), ready_time, part)[1])
    if self.cost.worker_nodes:  # the message waits for the busier of both ends
      start, end = _reserve((nodes[worker % self.nodes],), ready_time, nbytes)
      self.queued_s[worker] = max(self.queued_s[worker], queued + start - ready_time)
      arrival = max(arrival, end + self.cost.latency)
    return arrival

  def peer(self, src: int, dst: int, ready_time: float, nbytes: float | None = None,
           waiter: int | None = None) -> float:
    """Arrival at `dst` of a message (default: the model) sent by `src`.

    Queueing is charged to `waiter` (default: the sender).
    """
    nbytes = self.cost.model_bytes if nbytes is None else nbytes
    waiter = src if waiter is None else waiter
    src, dst = src % self.nodes, dst % self.nodes
    if self.cost.worker_nodes and src == dst:  # two workers of one machine: no link
      self.bytes_total += nbytes
      return ready_time
    return self._send(waiter, (self.up[src], self.down[dst]), ready_time, nbytes)[1]
