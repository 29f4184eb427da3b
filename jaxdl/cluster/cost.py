"""The cost model of a simulated cluster: compute times and what a message costs.

Compute: seconds per batch from a measured time or from a FLOP count and a
device profile, divided by each worker's speed, times a lognormal jitter (its
workers' factors correlated, if asked) and an occasional straggler slowdown;
every draw is a pure function of (seed, worker, iteration). Communication: a
message costs latency + bytes / bandwidth (its links and their sharing:
jaxdl.cluster.network). A measured profile of a real engine (`jaxdl calibrate`)
adds its central process's time per call, one call at a time: a parameter
server's per update, a coordinator's per event it orders.
"""
from __future__ import annotations

import dataclasses
import json
import re
import zlib

import numpy as np

from jaxdl.errors import ConfigError

# Peak training FLOP/s per device. Pre-Ampere GPUs: fp32 (what the IPDPS'21 /
# Choi era of papers trained in); Ampere and later: dense TF32 tensor cores,
# which frameworks use for fp32 matmuls and convolutions by default.
DEVICE_PROFILES: dict[str, float] = {
    "cpu": 1e11,          # a modest multi-core fp32 host
    "titan-v": 14.9e12,   # fp32; IPDPS'21's workers (14.90 TFLOPS)
    "v100": 15.7e12,      # fp32, SXM2
    "rtx-3070": 20.3e12,  # fp32; the ASU comparison's GPUs
    "a100": 156e12,       # TF32 dense tensor cores
    "h100": 494.7e12,     # TF32 dense tensor cores, SXM
    "h200": 494.7e12,     # TF32 dense tensor cores (H100 silicon, more HBM)
}
# Bytes/s of a device's own memory, by the vendor's spec (memory clock x bus
# width): what the roofline per micro-batch (jaxdl.cluster.strategies) reads.
DEVICE_MEMORY: dict[str, float] = {
    "titan-v": 652.8e9,   # HBM2, 3072-bit
    "v100": 900e9,        # HBM2, SXM2
    "rtx-3070": 448e9,    # GDDR6 at 14 Gb/s a pin, 256-bit
    "a100": 1555e9,       # HBM2, 40 GB
    "h100": 3.35e12,      # HBM3, SXM
    "h200": 4.8e12,       # HBM3e
}
# Fraction of peak a training step achieves: real steps are far from peak.
DEFAULT_UTILIZATION = 0.4

# The link between two devices of a profile in one machine, where known:
# (bytes/s one way, seconds per message) of a device-to-device copy.
DEVICE_LINKS: dict[str, tuple[float, float]] = {
    # Two RTX 3070 on PCIe 4.0 x16: 31.5 GB/s one way by the PCIe 4.0 spec
    # (16 GT/s x 16 lanes, 128b/130b). GeForce cards have no peer-to-peer, so a
    # copy is staged through host memory. CUDA's p2pBandwidthLatencyTest with
    # P2P disabled measured 20.1-22.4 GB/s one way between GeForce GPUs on PCIe
    # 4.0 x16 (RTX 4090s, github.com/NVIDIA/nccl/issues/814) and a latency of
    # 11.6-20.7 us (RTX 3090s, github.com/NVIDIA/nccl/issues/1127): the lowest
    # bandwidth and a middle latency. A board that splits its lanes x8/x8
    # halves the bandwidth.
    "rtx-3070": (20e9, 15e-6),
}

_BANDWIDTH_HELP = "a bandwidth such as 10gbps, 56gbps, 100mbps"
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BYTE_UNITS = ("B", "B/s", "Bps", "byte/s", "bytes/s")  # case-sensitive 'B'
_BIT_UNITS = ("bps", "b/s", "bit", "bits", "bit/s", "bits/s")  # any case
_BLOCK = 512  # iterations per cached block of random draws


def achieved_flops(profile: str, utilization: float = DEFAULT_UTILIZATION) -> float:
  """Achieved training FLOP/s of a device profile: peak times utilization."""
  if profile not in DEVICE_PROFILES:
    raise ConfigError("cluster", profile, "one of " + ", ".join(DEVICE_PROFILES))
  if not 0.0 < utilization <= 1.0:
    raise ValueError(f"utilization {utilization!r}: a fraction in (0, 1]")
  return DEVICE_PROFILES[profile] * utilization


MODELLED = ("cluster", "network", "latency", "compute_time", "jitter", "jitter_correlation",
            "straggler_prob", "straggler_slowdown")
"""The config's fields (its cluster section's) that describe the modelled
cluster: a run on real devices has none of them, except EMULATED."""
EMULATED = ("compute_time", "jitter", "jitter_correlation", "straggler_prob",
            "straggler_slowdown")
"""Those a real engine may emulate: each worker sleeps until its batch has
taken the modelled time (CostModel.compute_time), if its compute took less."""


def check(cfg) -> None:
  """The cluster section's descriptions of the modelled cluster (a
  ClusterConfig): its network's bandwidth and its devices (a profile file, or
  a device kind and count)."""
  parse_bandwidth(cfg.network)
  if is_profile(cfg.cluster):
    read_profile(cfg.cluster)
  else:
    parse_cluster(cfg.cluster)


def parse_bandwidth(text: str) -> float:
  """Bytes per second of "10gbps", "100mbps", "1.5gbit" (bits) or "25GB/s" (bytes)."""
  match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtT]?)\s*([A-Za-z/]+)\s*",
                       str(text))
  if match:
    number, prefix, unit = float(match[1]), _PREFIX[match[2].lower()], match[3]
    if unit in _BYTE_UNITS or unit.lower() in ("byte/s", "bytes/s"):
      value = number * prefix
    elif unit.lower() in _BIT_UNITS:
      value = number * prefix / 8
    else:
      value = 0.0
    if value > 0:
      return value
  raise ConfigError("network", text, _BANDWIDTH_HELP)


def parse_cluster(text: str) -> tuple[int | None, str]:
  """(worker count or None, device profile) of "24x titan-v", "8xh100", "titan-v"."""
  match = re.fullmatch(r"\s*(?:(\d+)\s*x\s*)?([a-z0-9][a-z0-9-]*)\s*", str(text).lower())
  if match and match[2] in DEVICE_PROFILES and (match[1] is None or int(match[1]) >= 1):
    return (None if match[1] is None else int(match[1])), match[2]
  raise ConfigError("cluster", text, "a device profile with an optional worker count, "
                    "such as 24x titan-v (profiles: " + ", ".join(DEVICE_PROFILES) + ")")


@dataclasses.dataclass(frozen=True)
class Profile:
  """A real engine's costs on one machine, measured by `jaxdl calibrate` for
  one model, dataset and batch size; `--cluster PATH.json` simulates it."""
  model: str
  dataset: str
  batch_size: int
  compute_time: float   # seconds per batch of a worker's gradient
  server_time: float    # a parameter server's seconds per update (push, apply, reply)
  order_time: float     # a coordinator's seconds per event it grants
  latency: float = 0.0  # seconds per message on a worker machine's link
  bandwidth: float = 1e15  # bytes/s of a worker machine's link, each way
  # the machines the workers go round robin over (worker w on the (w mod
  # n)-th), each with one link that its workers share; 0: one machine,
  # whose messages cost the processes' own work (server_time, order_time)
  worker_nodes: int = 0
  # bytes/s that the central process's machine receives from all the others
  # at once; None: a worker machine's bandwidth
  central_bandwidth: float | None = None


def is_profile(cluster: str) -> bool:
  """Whether a --cluster value names a measured profile (PATH.json), not a device."""
  return str(cluster).endswith(".json")


def read_profile(path: str) -> Profile:
  """The cost profile in the JSON file `path` (fields of `Profile`, and
  whatever else the measurement recorded)."""
  allowed = "a cost profile written by `jaxdl calibrate`"
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise ConfigError("cluster", path, f"{allowed} ({e})") from None
  fields = dataclasses.fields(Profile)
  missing = [f.name for f in fields if f.default is dataclasses.MISSING
             and f.name not in (data if isinstance(data, dict) else {})]
  if missing:
    raise ConfigError("cluster", path, f"{allowed}: it lacks {', '.join(missing)}")
  profile = Profile(**{f.name: data[f.name] for f in fields if f.name in data})
  numbers = (profile.compute_time, profile.server_time, profile.order_time, profile.latency,
             profile.bandwidth, profile.worker_nodes,
             profile.bandwidth if profile.central_bandwidth is None else profile.central_bandwidth)
  if not (all(isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0
              for t in numbers)
          and profile.compute_time > 0 and profile.bandwidth > 0 and numbers[-1] > 0
          and float(profile.worker_nodes).is_integer()):
    raise ConfigError("cluster", path, f"{allowed}: seconds >= 0 (compute time > 0), "
                      "bandwidths > 0 and a count of worker machines >= 0")
  return profile


def _stream_id(stream: str) -> int:
  return zlib.crc32(stream.encode()) + 1  # stable across processes, unlike hash()


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Timing of a simulated cluster; every method is a pure function of the fields."""
  num_workers: int
  compute_s: float                # mean seconds per batch on a speed-1.0 worker
  model_bytes: float              # bytes of one copy of the parameters (or gradient)
  bandwidth: float = 1.25e9       # bytes/s of every link (10 Gbps)
  latency: float = 5e-5           # seconds per message
  servers: int = 1                # parameter-server shards k, one link each
  speeds: tuple[float, ...] | None = None  # per worker; None: all 1.0
  jitter: float = 0.0             # sigma of the lognormal (mean 1) compute factor
  # correlation rho of two workers' log factors at one iteration: a share
  # rho of each log factor's variance is one draw common to all workers
  jitter_correlation: float = 0.0
  straggler_prob: float = 0.0
  straggler_slowdown: float = 4.0
  seed: int = 0
  server_s: float = 0.0   # a central process's seconds per parameter-server update
  order_s: float = 0.0    # a central process's seconds per event it orders
  # bytes of a worker's compressed message (--compress: its push, its part of
  # an exchange or of an all-reduce, a gossip message, its half of an
  # average); None: uncompressed, a model's
  message_bytes: float | None = None
  # bytes of a parameter server's compressed reply (--compress-pull); None:
  # a model's
  reply_bytes: float | None = None
  # the machines the workers go round robin over, each with one link that
  # its workers share (a measured cluster's: Profile.worker_nodes); 0: each
  # worker its own link
  worker_nodes: int = 0
  # bytes/s of the parameter server's links; None: `bandwidth`
  central_bandwidth: float | None = None
  _draws: dict = dataclasses.field(default_factory=dict, init=False, repr=False,
                                   compare=False, hash=False)

  def __post_init__(self):
    speeds = (1.0,) * self.num_workers if self.speeds is None else tuple(
        float(s) for s in self.speeds)
    object.__setattr__(self, "speeds", speeds)
    checks = [
        ("workers", self.num_workers, self.num_workers >= 1, "an integer >= 1"),
        ("compute_time", self.compute_s, self.compute_s > 0, "seconds > 0"),
        ("network", self.bandwidth, self.bandwidth > 0, _BANDWIDTH_HELP),
        ("latency", self.latency, self.latency >= 0, "seconds >= 0"),
        ("servers", self.servers, self.servers >= 1, "an integer >= 1"),
        ("cluster", self.worker_nodes, self.worker_nodes >= 0,
         "a profile with a count of worker machines >= 0"),
        ("worker_speeds", speeds,
         len(speeds) == self.num_workers and all(s > 0 for s in speeds),
         f"{self.num_workers} speeds > 0, one per worker"),
        ("jitter", self.jitter, self.jitter >= 0, "a sigma >= 0"),
        ("jitter_correlation", self.jitter_correlation, 0 <= self.jitter_correlation < 1,
         "a correlation in [0, 1)"),
        ("straggler_prob", self.straggler_prob, 0 <= self.straggler_prob <= 1,
         "a probability in [0, 1]"),
        ("straggler_slowdown", self.straggler_slowdown, self.straggler_slowdown >= 1,
         "a factor >= 1"),
    ]
    # computed from the model, or read from a checked profile: never given
    for name in ("model_bytes", "server_s", "order_s", "message_bytes", "reply_bytes",
                 "central_bandwidth"):
      if (getattr(self, name) or 0) < 0:
        raise ValueError(f"{name} {getattr(self, name)!r}: >= 0")
    for field, value, ok, allowed in checks:
      if not ok:
        raise ConfigError(field, value, allowed)

  @classmethod
  def build(cls, num_workers: int, model_bytes: float, *, compute_s: float | None = None,
            flops_per_batch: float | None = None, profile: str = "cpu",
            utilization: float = DEFAULT_UTILIZATION, network: str | float = "10gbps",
            **kwargs) -> CostModel:
    """A cost model whose compute time is given, or flops_per_batch / achieved FLOP/s."""
    if (compute_s is None) == (flops_per_batch is None):
      raise ConfigError("compute_time", compute_s,
                        "seconds per batch, or unset with a FLOP count per batch")
    if compute_s is None:
      compute_s = flops_per_batch / achieved_flops(profile, utilization)
    bandwidth = parse_bandwidth(network) if isinstance(network, str) else float(network)
    return cls(num_workers=num_workers, compute_s=compute_s, model_bytes=model_bytes,
               bandwidth=bandwidth, **kwargs)

  def uniform(self, stream: str, worker: int, iteration: int) -> float:
    """A uniform draw in [0, 1) that depends only on (seed, stream, worker, iteration)."""
    return float(self._block(stream, worker, iteration)[iteration % _BLOCK])

  def _block(self, stream: str | None, worker: int, iteration: int) -> np.ndarray:
    # Draws come in blocks of iterations, so that a schedule costs one generator
    # per block rather than per call; the result is independent of call order.
    # Stream None holds the compute times themselves. A block is kept as an
    # array, not a list of floats: with many workers each uses a few draws of
    # each of its blocks, and Python floats took 4 x the bytes (42 MB of a
    # 1,024-worker gossip schedule's cache; BENCHMARKS.md).
    key = (stream, worker, iteration // _BLOCK)
    block = self._draws.get(key)
    if block is None:
      stream_id = 0 if stream is None else _stream_id(stream)
      rng = np.random.default_rng([self.seed, stream_id, worker, key[2]])
      block = (self._compute_times(rng, worker, key[2]) if stream is None
               else rng.random(_BLOCK))
      self._draws[key] = block
    return block

  def _compute_times(self, rng: np.random.Generator, worker: int, block: int) -> np.ndarray:
    """Compute times of one block of iterations: speed, jitter, stragglers."""
    seconds = np.full(_BLOCK, self.compute_s / self.speeds[worker])
    if self.jitter > 0:
      # Lognormal with mean exactly 1: E[exp(sigma z - sigma^2 / 2)] = 1, for
      # z standard normal; correlated, z = sqrt(rho) z_c + sqrt(1 - rho) z_w
      # still is, with z_c common to all workers at that iteration.
      z = rng.standard_normal(_BLOCK)
      if self.jitter_correlation > 0:
        rho = self.jitter_correlation
        z = np.sqrt(rho) * self._common_normals(block) + np.sqrt(1 - rho) * z
      seconds *= np.exp(self.jitter * z - 0.5 * self.jitter ** 2)
    if self.straggler_prob > 0:
      late = self._block("straggler", worker, block * _BLOCK) < self.straggler_prob
      seconds[late] *= self.straggler_slowdown
    return seconds

  def _common_normals(self, block: int) -> np.ndarray:
    """Standard normals of one block of iterations, the same for every
    worker: a pure function of (seed, iteration)."""
    key = ("common jitter", None, block)
    if key not in self._draws:
      rng = np.random.default_rng([self.seed, _stream_id(key[0]), block])
      self._draws[key] = rng.standard_normal(_BLOCK)
    return self._draws[key]

  def compute_time(self, worker: int, iteration: int) -> float:
    """Seconds for `worker`'s batch of `iteration`: speed, jitter and stragglers."""
    return float(self._block(None, worker, iteration)[iteration % _BLOCK])

  def transfer_time(self, nbytes: float) -> float:
    """Seconds for one message on an idle link."""
    return self.latency + nbytes / self.bandwidth

  def ring_allreduce_time(self) -> float:
    """Ring all-reduce of the model: 2(M-1) phases moving 1/M of it each."""
    m = self.num_workers
    return 2 * (m - 1) / m * self.model_bytes / self.bandwidth + 2 * (m - 1) * self.latency

  @property
  def push_bytes(self) -> float:
    """Bytes of a worker's message (to the servers, or to a peer): compressed,
    or the model."""
    return self.model_bytes if self.message_bytes is None else self.message_bytes

  @property
  def pull_bytes(self) -> float:
    """Bytes of the servers' reply to a pull: compressed, or the model."""
    return self.model_bytes if self.reply_bytes is None else self.reply_bytes

  def allreduce(self) -> tuple[float, float]:
    """(seconds, bytes all workers send) of one synchronous exchange: a ring
    all-reduce of the model, or, with compressed messages (which do not add
    up on the way: top-k's supports differ), a ring all-gather of them, M - 1
    phases each forwarding one whole message."""
    m = self.num_workers
    if self.message_bytes is None:
      return self.ring_allreduce_time(), 2 * (m - 1) * self.model_bytes
    return ((m - 1) * (self.message_bytes / self.bandwidth + self.latency),
            m * (m - 1) * self.message_bytes)
