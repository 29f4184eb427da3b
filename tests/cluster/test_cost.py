"""The simulated cluster's cost model: parsing, compute draws, links."""
import dataclasses
import zlib

import numpy as np
import pytest

from jaxdl.cluster import (DEVICE_PROFILES, CostModel, Link, Network, achieved_flops,
                           parse_bandwidth, parse_cluster, send_over)
from jaxdl.errors import ConfigError


@pytest.mark.parametrize("text, expected", [
    ("10gbps", 1.25e9), ("56gbps", 7e9), ("100mbps", 12.5e6), ("1.5gbit", 1.5e9 / 8),
    ("25GB/s", 25e9), ("10 Gbps", 1.25e9), ("25GBps", 25e9), ("800 kbit/s", 1e5),
    ("3B/s", 3.0),
])
def test_parse_bandwidth(text, expected):
  assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "fast", "10", "0gbps", "-1gbps", "10gbpsx", "10 xb/s"])
def test_parse_bandwidth_rejects_bad_text(text):
  with pytest.raises(ConfigError, match="--network") as info:
    parse_bandwidth(text)
  assert info.value.field == "network" and "10gbps" in info.value.allowed


@pytest.mark.parametrize("text, expected", [
    ("24x titan-v", (24, "titan-v")), ("titan-v", (None, "titan-v")), ("8xh100", (8, "h100")),
    (" 4 x A100 ", (4, "a100")), ("cpu", (None, "cpu")),
])
def test_parse_cluster(text, expected):
  assert parse_cluster(text) == expected


@pytest.mark.parametrize("text", ["", "24x", "0x h100", "24x tpu", "x h100", "h100 x 2"])
def test_parse_cluster_rejects_bad_text(text):
  with pytest.raises(ConfigError, match="--cluster"):
    parse_cluster(text)


def test_device_profiles_and_achieved_flops():
  for name in ("cpu", "titan-v", "v100", "a100", "h100", "h200"):
    assert DEVICE_PROFILES[name] > 0
  assert DEVICE_PROFILES["titan-v"] == 14.9e12
  assert achieved_flops("titan-v") == pytest.approx(14.9e12 * 0.4)
  assert achieved_flops("titan-v", 1.0) == 14.9e12
  with pytest.raises(ConfigError, match="--cluster=") as info:  # a user's --cluster
    achieved_flops("tpu")
  assert info.value.field == "cluster"
  for utilization in (0.0, 1.5):  # internal: a programming error, not a user's
    with pytest.raises(ValueError, match="utilization") as info:
      achieved_flops("titan-v", utilization)
    assert not isinstance(info.value, ConfigError)


def test_build_from_flops_or_seconds():
  cost = CostModel.build(4, 1e6, flops_per_batch=5.96e12, profile="titan-v",
                         network="56gbps")
  assert cost.compute_s == pytest.approx(1.0) and cost.bandwidth == 7e9
  assert cost.speeds == (1.0,) * 4
  assert CostModel.build(2, 1e6, compute_s=0.5, network=1e9).compute_s == 0.5
  for kwargs in ({}, {"compute_s": 1.0, "flops_per_batch": 1e9}):
    with pytest.raises(ConfigError, match="--compute-time"):
      CostModel.build(2, 1e6, **kwargs)


@pytest.mark.parametrize("field, value", [
    ("num_workers", 0), ("compute_s", 0.0), ("bandwidth", 0.0), ("latency", -1.0),
    ("servers", 0), ("speeds", (1.0,)), ("speeds", (1.0, 0.0)), ("jitter", -0.1),
    ("jitter_correlation", -0.1), ("jitter_correlation", 1.0),
    ("jitter_correlation", float("nan")),
    ("straggler_prob", 1.5), ("straggler_slowdown", 0.5),
])
def test_cost_model_rejects_bad_fields(field, value):
  with pytest.raises(ConfigError):
    CostModel(**{"num_workers": 2, "compute_s": 1.0, "model_bytes": 1e6, field: value})


def test_negative_model_bytes_is_a_programming_error():
  # Computed from the model, never given by a user: a ValueError, not a ConfigError.
  with pytest.raises(ValueError, match="model_bytes") as info:
    CostModel(2, 1.0, -1.0)
  assert not isinstance(info.value, ConfigError)


def _noisy(**kwargs) -> CostModel:
  fields = dict(num_workers=3, compute_s=0.2, model_bytes=1e6, jitter=0.3,
                straggler_prob=0.1, seed=7)
  return CostModel(**{**fields, **kwargs})


def test_compute_time_is_deterministic_and_independent_of_call_order():
  keys = [(w, i) for w in range(3) for i in range(0, 2000, 7)]
  forward = _noisy()
  a = [forward.compute_time(w, i) for w, i in keys]
  backward = _noisy()
  b = [backward.compute_time(w, i) for w, i in reversed(keys)][::-1]
  assert a == b
  assert _noisy().compute_time(*keys[-1]) == a[-1]
  other = _noisy(seed=8)
  assert [other.compute_time(w, i) for w, i in keys] != a
  assert dataclasses.replace(forward, seed=8).compute_time(0, 0) == other.compute_time(0, 0)


def test_draws_are_plain_floats_of_the_seeded_blocks():
  """A draw is a Python float, the block's generator's value: the rule
  written out, for iterations in a first and a later block of 512."""
  cost = CostModel(3, 0.2, 0.0, jitter=0.3, seed=7)
  for w, i in [(0, 0), (2, 5), (1, 1000)]:
    rng = np.random.default_rng([7, 0, w, i // 512])
    seconds = np.full(512, 0.2) * np.exp(0.3 * rng.standard_normal(512) - 0.5 * 0.3 ** 2)
    assert type(cost.compute_time(w, i)) is float
    assert cost.compute_time(w, i) == seconds.tolist()[i % 512]
  assert type(cost.uniform("gossip", 1, 3)) is float


def test_speeds_divide_compute_time():
  cost = CostModel(2, 0.4, 0.0, speeds=(1.0, 4.0))
  assert cost.compute_time(0, 3) == pytest.approx(0.4)
  assert cost.compute_time(1, 3) == pytest.approx(0.1)


def test_lognormal_jitter_has_mean_one():
  cost = CostModel(4, 1.0, 0.0, jitter=0.5, seed=3)
  times = np.array([cost.compute_time(w, i) for w in range(4) for i in range(10_000)])
  assert times.mean() == pytest.approx(1.0, abs=0.02)
  assert np.log(times).std() == pytest.approx(0.5, abs=0.02)
  assert len(set(times.tolist())) == times.size


def test_correlated_jitter_keeps_each_factor_and_correlates_the_workers():
  """rho 0.6, sigma 0.25, 20,000 iterations of 2 workers. Each worker's
  factors are independent across iterations: the mean's standard error is
  sqrt(exp(sigma^2) - 1) / sqrt(n) = 0.0018, the log-factors' standard
  deviation's sigma / sqrt(2n) = 0.0013, the correlation's (1 - rho^2) /
  sqrt(n) = 0.0045; the tolerances are about 5 of each."""
  n, sigma, rho = 20_000, 0.25, 0.6
  cost = CostModel(2, 1.0, 0.0, jitter=sigma, jitter_correlation=rho, seed=5)
  factors = np.array([[cost.compute_time(w, i) for i in range(n)] for w in range(2)])
  assert factors.mean(axis=1) == pytest.approx([1.0, 1.0], abs=0.01)
  assert np.log(factors).std(axis=1) == pytest.approx([sigma, sigma], abs=0.006)
  assert np.corrcoef(np.log(factors))[0, 1] == pytest.approx(rho, abs=0.02)
  independent = CostModel(2, 1.0, 0.0, jitter=sigma, seed=5)
  logs = np.log([[independent.compute_time(w, i) for i in range(n)] for w in range(2)])
  assert np.corrcoef(logs)[0, 1] == pytest.approx(0.0, abs=0.03)


def test_correlated_jitter_is_the_rule_written_out():
  """Worker w's factor at iteration c: exp(sigma (sqrt(rho) z_c + sqrt(1 -
  rho) z_wc) - sigma^2 / 2), z_wc the uncorrelated draw of the same worker
  and iteration, z_c one normal per iteration from its own seeded stream;
  rho 0 (given or left out) is the uncorrelated draw bit for bit."""
  sigma, rho, common_stream = 0.3, 0.4, zlib.crc32(b"common jitter") + 1
  plain = CostModel(3, 0.2, 0.0, jitter=sigma, straggler_prob=0.1, seed=7)
  zero = CostModel(3, 0.2, 0.0, jitter=sigma, jitter_correlation=0.0, straggler_prob=0.1,
                   seed=7)
  tied = CostModel(3, 0.2, 0.0, jitter=sigma, jitter_correlation=rho, seed=7)
  for w, i in [(0, 0), (2, 5), (1, 1000), (2, 1000)]:
    own = np.random.default_rng([7, 0, w, i // 512]).standard_normal(512)[i % 512]
    common = np.random.default_rng([7, common_stream, i // 512]).standard_normal(512)[i % 512]
    z = np.sqrt(rho) * common + np.sqrt(1 - rho) * own
    assert tied.compute_time(w, i) == pytest.approx(0.2 * np.exp(sigma * z - sigma ** 2 / 2),
                                                    rel=1e-12)
    assert zero.compute_time(w, i) == plain.compute_time(w, i)
  assert [zero.compute_time(w, i) for w in range(3) for i in range(0, 3000, 11)] == [
      plain.compute_time(w, i) for w in range(3) for i in range(0, 3000, 11)]


def test_stragglers_at_the_stated_rate():
  cost = CostModel(4, 1.0, 0.0, straggler_prob=0.1, straggler_slowdown=5.0, seed=1)
  times = np.array([cost.compute_time(w, i) for w in range(4) for i in range(10_000)])
  assert set(np.round(times, 9).tolist()) == {1.0, 5.0}
  assert (times > 1).mean() == pytest.approx(0.1, abs=0.01)


def test_transfer_and_ring_allreduce_times():
  cost = CostModel(4, 1.0, 2e9, bandwidth=1e9, latency=0.01)
  assert cost.transfer_time(1e9) == pytest.approx(1.01)
  assert cost.ring_allreduce_time() == pytest.approx(2 * 3 / 4 * 2 + 6 * 0.01)
  assert CostModel(1, 1.0, 2e9).ring_allreduce_time() == 0.0


def test_link_serialises_messages():
  link = Link(bandwidth=1e9, latency=0.5)
  assert link.send(0.0, 1e9) == pytest.approx(1.5)   # starts at once
  assert link.send(0.0, 2e9) == pytest.approx(3.5)   # queues behind the first
  assert link.send(10.0, 1e9) == pytest.approx(11.5)  # link idle: starts when ready
  a, b = Link(1e9), Link(1e9)
  a.send(0.0, 3e9)
  assert send_over((a, b), 1.0, 1e9) == pytest.approx(4.0)  # waits for both links
  assert b.free_at == pytest.approx(4.0)


def test_server_links_are_shared_and_shards_split_the_load():
  def last_push(servers: int) -> float:
    net = Network(CostModel(8, 1.0, 1e9, bandwidth=1e9, latency=0.0, servers=servers))
    return max(net.push(w, 0.0) for w in range(8))

  assert last_push(1) == pytest.approx(8.0)  # the one server link carries all 8 models
  assert last_push(2) == pytest.approx(4.0)
  assert last_push(8) == pytest.approx(1.0)  # capped by each worker's own link
  net = Network(CostModel(2, 1.0, 1e9, bandwidth=1e9, latency=0.0))
  assert net.push(0, 0.0) == pytest.approx(1.0)
  assert net.pull(1, 0.0) == pytest.approx(1.0)  # full duplex: pulls do not queue behind
  assert net.push(1, 0.0) == pytest.approx(2.0)
  assert net.queued_s == [0.0, 1.0] and net.bytes_total == 3e9


def test_peer_links_are_per_worker():
  net = Network(CostModel(4, 1.0, 1e9, bandwidth=1e9, latency=0.0))
  assert net.peer(0, 1, 0.0) == pytest.approx(1.0)
  assert net.peer(2, 3, 0.0) == pytest.approx(1.0)  # disjoint links: in parallel
  assert net.peer(2, 1, 0.0) == pytest.approx(2.0)  # 1's downlink is busy


def test_a_machines_workers_share_its_link_and_reach_one_another_free():
  """worker_nodes=2: workers 0 and 2 on machine 0, 1 and 3 on machine 1
  (round robin), each machine one link its workers share, the server's
  links at central_bandwidth."""
  cost = CostModel(4, 1.0, 1e9, bandwidth=1e9, latency=0.5, worker_nodes=2,
                   central_bandwidth=4e9)
  net = Network(cost)
  assert net.push(0, 0.0) == pytest.approx(1.5)  # machine 0's uplink, 1 s; the server's 0.25 s
  assert net.push(1, 0.0) == pytest.approx(1.5)  # machine 1's: in parallel
  assert net.push(2, 0.0) == pytest.approx(2.5)  # behind worker 0 on machine 0's uplink
  assert net.queued_s == [0.0, 0.25, 1.0, 0.0]  # the longer of its waits at both ends
  assert net.pull(3, 0.0) == pytest.approx(1.5)  # full duplex: the downlink is free
  assert net.peer(0, 2, 7.0) == 7.0  # one machine: no link
  assert net.peer(0, 3, 7.0) == pytest.approx(8.5)  # across: 0's uplink, 1's downlink
  assert net.bytes_total == 6e9  # a message between two workers of one machine counts too
  # each worker its own link (worker_nodes 0): as before
  alone = Network(CostModel(4, 1.0, 1e9, bandwidth=1e9, latency=0.5, central_bandwidth=4e9))
  assert [alone.push(w, 0.0) for w in range(3)] == pytest.approx([1.5, 1.5, 1.5])
