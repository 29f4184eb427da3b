"""Discrete-event schedules: determinism, policies (SSP's bound), a global
budget (every worker works until it is spent), statistics, F3.

An asynchronous schedule's length is a budget of updates (or samples); a
synchronous one's, its steps."""
import collections

import numpy as np
import pytest

from jaxdl.cluster import (Budget, CostModel, Schedule, centralized, decentralized,
                           elastic, gossip, synchronous)
from jaxdl.errors import ConfigError
from jaxdl.trace import KINDS, summarize

FAMILIES = {
    "asp": lambda c, n: centralized(c, n),
    "ssp": lambda c, n: centralized(c, n, staleness_bound=2),
    "easgd": lambda c, n: elastic(c, n, period=4),
    "gosgd": lambda c, n: gossip(c, n, probability=0.5),
    "ad_psgd": lambda c, n: decentralized(c, n),
    "bsp": lambda c, n: synchronous(c, n, "ps"),
    "ar_sgd": lambda c, n: synchronous(c, n, "allreduce"),
    "local_sgd": lambda c, n: synchronous(c, n, "local", period=3),
}


def _cost(num_workers=4, **kwargs) -> CostModel:
  fields = dict(compute_s=0.1, model_bytes=4e7, bandwidth=1.25e9, latency=5e-5,
                speeds=tuple(1.0 + 0.25 * w for w in range(num_workers)), jitter=0.3,
                straggler_prob=0.05, seed=0)
  return CostModel(num_workers, **{**fields, **kwargs})


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_same_schedule_other_seed_another(family):
  events = FAMILIES[family](_cost(), 40)
  assert isinstance(events, Schedule) and events
  assert events == FAMILIES[family](_cost(), 40)
  assert events != FAMILIES[family](_cost(seed=1), 40)
  assert all(e.kind in KINDS for e in events)
  times = [e.time for e in events]
  assert times == sorted(times)
  assert events.bytes_total > 0


def test_bandwidth_changes_the_centralized_schedule():
  assert centralized(_cost(), 30) != centralized(_cost(bandwidth=7e9), 30)


def _check_versions(events):
  """A pull reads exactly the applies before it; an apply counts them."""
  applies = 0
  for e in events:
    if e.kind == "apply":
      applies += 1
      assert e.version == applies
    elif e.kind == "pull":
      assert e.version == applies


def _updates(events, m):
  return [sum(e.kind in ("apply", "local") and e.worker == w for e in events) for w in range(m)]


@pytest.mark.parametrize("bound", [None, 0, 1, 3])
def test_centralized_loop_and_versions(bound):
  cost, m = _cost(5), 5
  events = centralized(cost, 150, staleness_bound=bound)
  _check_versions(events)
  assert sum(_updates(events, m)) == 150 and events[-1].kind == "apply"
  for w in range(m):  # pull, apply, pull, ...: at most one iteration in flight at the end
    mine = [(e.kind, e.iteration) for e in events if e.worker == w and e.kind != "wait"]
    assert mine == [(k, i) for i in range(len(mine)) for k in ("pull", "apply")][:len(mine)]
  # every pull and push sent, those still in flight at the end included
  pulls = sum(e.kind == "pull" for e in events)
  assert 2 * 150 <= events.bytes_total / cost.model_bytes <= 150 + pulls + m


ASYNC = {
    "asp": lambda c, n: centralized(c, n),
    "dc/lc_asgd": lambda c, n: centralized(c, Budget(n * 11, (8, 8, 8, 32))),
    "easgd": lambda c, n: elastic(c, n, period=4),
    "gosgd": lambda c, n: gossip(c, n, probability=0.5),
    "ad_psgd": lambda c, n: decentralized(c, n),
}


@pytest.mark.parametrize("family", ASYNC)
def test_every_worker_works_until_the_budget_is_spent(family):
  # One worker 4x slower than three others, compute only: the fast ones make
  # about 4x its updates, and none stops before the end.
  speeds = (1.0, 1.0, 1.0, 0.25)
  cost = CostModel(4, compute_s=0.1, model_bytes=0.0, latency=0.0, speeds=speeds)
  events = ASYNC[family](cost, 260)
  counts = _updates(events, 4)
  for fast in counts[:3]:
    assert fast / counts[3] == pytest.approx(4.0, abs=0.5)
  end = events[-1].time
  for w, speed in enumerate(speeds):  # each worker's last update: within an iteration of the end
    last = max(e.time for e in events if e.worker == w and e.kind in ("apply", "local"))
    assert end - last <= 0.1 / speed + 1e-9


def test_a_budget_of_samples_counts_each_workers_batch():
  budget = Budget(1000, (8, 8, 8, 32))
  events = centralized(_cost(), budget)
  counts = _updates(events, 4)
  samples = sum(n * b for n, b in zip(counts, budget.batch_sizes))
  assert 1000 <= samples < 1000 + 32  # the update that reaches the budget ends the run
  assert not centralized(_cost(), 0) and not gossip(_cost(), Budget(0), 1.0)


def test_ssp_workers_wait_only_for_the_bound():
  # The same 4x slower worker: under SSP the fast ones wait for it, at most
  # bound + 1 iterations ahead; under ASP nobody waits.
  cost = CostModel(4, compute_s=0.1, model_bytes=0.0, latency=0.0, speeds=(1, 1, 1, 0.25))
  events = centralized(cost, 200, staleness_bound=2)
  counts = _updates(events, 4)
  assert max(counts) - min(counts) <= 3 and min(counts) > 0
  waits = summarize(events, 4)["wait_s"]
  assert all(w > 0 for w in waits[:3]) and waits[3] == 0
  assert summarize(centralized(cost, 200), 4)["wait_total_s"] == 0


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_ssp_never_breaks_its_bound(bound):
  m = 6
  events = centralized(_cost(m, straggler_prob=0.2, straggler_slowdown=6.0), 60,
                       staleness_bound=bound)
  clocks = [0] * m
  for e in events:
    if e.kind == "pull":
      assert e.iteration == clocks[e.worker]
      assert min(clocks) >= e.iteration - bound
    elif e.kind == "apply":
      clocks[e.worker] += 1
    assert max(clocks) - min(clocks) <= bound + 1
  assert any(e.kind == "wait" and e.duration > 0 for e in events)
  waits = summarize(events, m)["wait_s"]
  assert max(waits) > 0


def test_ssp_zero_is_lock_step():
  events = centralized(_cost(5), 100, staleness_bound=0)
  position = {(e.kind, e.worker, e.iteration): i for i, e in enumerate(events)}
  for c in range(19):
    last_apply = max(position["apply", w, c] for w in range(5))
    first_pull = min(position["pull", w, c + 1] for w in range(5))
    assert last_apply < first_pull


def test_asp_with_one_worker_has_no_staleness():
  stats = summarize(centralized(_cost(1), 50), 1)
  assert stats["staleness_histogram"] == {0: 50}
  assert stats["staleness_max"] == 0 and stats["staleness_mean"] == 0


@pytest.mark.parametrize("m", [2, 4, 7])
def test_zero_delay_asp_staleness_is_m_minus_one(m):
  cost = CostModel(m, compute_s=1.0, model_bytes=0.0, latency=0.0)
  events = centralized(cost, 20 * m)
  stats = summarize(events, m)
  # First round: worker w's gradient lands after w others; then always M - 1.
  expected = collections.Counter(range(m)) + collections.Counter({m - 1: m * 19})
  assert stats["staleness_histogram"] == dict(expected)
  assert stats["simulated_time_s"] == pytest.approx(20.0)
  assert stats["updates"] == m * 20 and stats["bytes_total"] == 0.0


def test_elastic_exchanges_every_period():
  cost = _cost()
  events = elastic(cost, 72, period=4)
  assert sum(_updates(events, 4)) == 72
  for w in range(4):
    mine = [e for e in events if e.worker == w]
    steps = [e.iteration for e in mine if e.kind == "local"]
    assert steps == list(range(len(steps)))
    exchanges = [e for e in mine if e.kind == "exchange"]
    assert [e.iteration for e in exchanges] == [i for i in steps if (i + 1) % 4 == 0][
        :len(exchanges)] and len(exchanges) >= len(steps) // 4 - 1
    for x in exchanges[:-1]:  # the next local step waits for the center's reply
      after = next(e for e in mine if e.kind == "local" and e.iteration == x.iteration + 1)
      assert after.time > x.time
  exchanged = summarize(events, 4)["updates"]
  assert 2 * exchanged <= events.bytes_total / cost.model_bytes <= 2 * exchanged + 4


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_gossip_goes_to_other_workers_at_the_given_probability(p):
  m = 8
  events = gossip(_cost(m), m * 400, probability=p)
  sent = [e for e in events if e.kind == "send"]
  assert all(e.peer != e.worker and 0 <= e.peer < m for e in sent)
  assert len(sent) / (m * 400) == pytest.approx(p, abs=0.03)
  received = collections.Counter(e.peer for e in sent)
  assert set(received) == set(range(m))
  assert events.bytes_total == len(sent) * _cost(m).model_bytes


def test_a_gossip_message_is_sent_after_the_step_and_arrives_later():
  events = gossip(_cost(), 200, probability=0.5)
  index = {(e.kind, e.worker, e.iteration): i for i, e in enumerate(events)}
  arrivals = [e for e in events if e.kind == "gossip"]
  assert arrivals
  for e in arrivals:
    sent = index["send", e.worker, e.iteration]
    assert index["local", e.worker, e.iteration] < sent < index["gossip", e.worker, e.iteration]
    assert events[sent].peer == e.peer and events[sent].time < e.time


def test_a_gossip_sender_waits_only_while_its_last_message_is_in_flight():
  def local_times(cost, p):
    return [(e.worker, e.iteration, e.time) for e in gossip(cost, 50, p) if e.kind == "local"]

  fast = _cost(model_bytes=4e5)  # 0.3 ms a message, steps of 57-100 ms
  assert sorted(local_times(fast, 1.0)) == sorted(local_times(fast, 0.0))
  assert not any(e.kind in ("send", "gossip") for e in gossip(_cost(1), 20, 1.0))
  slow = gossip(_cost(model_bytes=4e8), 200, 1.0)  # 0.32 s a message: pushes wait
  in_flight, merged_at = {}, {}
  for e in slow:
    if e.kind == "send":
      assert e.worker not in in_flight  # one message a worker at a time
      in_flight[e.worker] = e.iteration
    elif e.kind == "gossip":
      assert in_flight.pop(e.worker) == e.iteration
      merged_at[e.worker] = e.time
    elif e.kind == "wait":  # from the push's step to the last message's merge
      assert e.time == merged_at[e.worker] and e.duration > 0
  waits = [e for e in slow if e.kind == "wait"]
  assert len(waits) > 100
  follows = {(e.worker, e.iteration, e.time) for e in slow if e.kind == "send"}
  assert all((e.worker, e.iteration, e.time) in follows for e in waits)
  assert sum(summarize(slow, 4)["wait_s"]) == pytest.approx(sum(e.duration for e in waits))


def test_decentralized_pull_average_apply():
  m, events = 5, decentralized(_cost(5), 150)
  assert sum(_updates(events, m)) == 150
  for w in range(m):
    mine = [e.kind for e in events if e.worker == w]
    assert mine == (["pull", "average", "apply"] * len(mine))[:len(mine)]
    assert all(e.peer not in (w, -1) and e.peer < m
               for e in events if e.worker == w and e.kind == "average")
  averages = sum(e.kind == "average" for e in events)
  assert 2 * averages <= events.bytes_total / _cost().model_bytes <= 2 * (averages + m)
  assert summarize(events, m)["staleness_mean"] is None
  single = decentralized(_cost(1), 3)
  assert [e.kind for e in single] == ["pull", "apply"] * 3


@pytest.mark.parametrize("mode", ["ps", "allreduce", "local"])
def test_synchronous_steps_and_barrier_waits(mode):
  m, cost = 4, _cost(4)
  events = synchronous(cost, 12, mode, period=3)
  steps = [e for e in events if e.kind == "step"]
  assert [e.iteration for e in steps] == list(range(12)) and all(e.worker == -1 for e in steps)
  waits = [e for e in events if e.kind == "wait"]
  assert waits and all(e.duration > 0 for e in waits)
  if mode == "local":  # only the averaging steps have a barrier
    assert {e.iteration for e in waits} <= {2, 5, 8, 11}
  stats = summarize(events, m)
  assert stats["updates"] == 12 and stats["batches"] == 48
  assert stats["wait_total_s"] == pytest.approx(sum(e.duration for e in waits))
  if mode == "allreduce":  # ring: each worker sends 2(M-1)/M models per step
    assert events.bytes_total == 12 * 2 * 3 * cost.model_bytes


def test_local_sgd_is_faster_than_allreduce():
  cost = _cost()
  t_local = summarize(synchronous(cost, 30, "local", period=5), 4)["simulated_time_s"]
  t_ar = summarize(synchronous(cost, 30, "allreduce"), 4)["simulated_time_s"]
  assert t_local < t_ar


def test_ps_time_grows_with_workers_faster_than_allreduce():
  def seconds(m, mode):
    events = synchronous(_cost(m, speeds=None, jitter=0.0, straggler_prob=0.0), 20, mode)
    return summarize(events, m)["simulated_time_s"]

  growth = {mode: seconds(16, mode) / seconds(2, mode) for mode in ("ps", "allreduce")}
  assert growth["ps"] > 2 * growth["allreduce"]


@pytest.mark.parametrize("call, field", [
    (lambda c: centralized(c, -1), "budget"),
    (lambda c: centralized(c, 2.5), "budget"),
    (lambda c: centralized(c, 5, staleness_bound=-1), "staleness_bound"),
    (lambda c: elastic(c, 5, period=0), "communication_period"),
    (lambda c: gossip(c, 5, probability=1.5), "gossip_probability"),
    (lambda c: synchronous(c, 5, "ring"), "sync_mode"),
    (lambda c: synchronous(c, 5, "local", period=0), "communication_period"),
])
def test_bad_policies_are_programming_errors(call, field):
  # Users' settings are validated by the algorithms' Settings; a schedule given
  # an out-of-range argument is a bug: a ValueError naming it, not a ConfigError.
  with pytest.raises(ValueError, match=f"^{field}=") as info:
    call(_cost())
  assert not isinstance(info.value, ConfigError)


def test_a_large_schedule_keeps_its_invariants():
  # Its speed (about 1 s) is measured by bench/schedule.py, not asserted here.
  m, bound = 24, 3
  events = centralized(_cost(m, speeds=None), 48_000, staleness_bound=bound)
  _check_versions(events)
  clocks = [0] * m
  for e in events:
    if e.kind == "pull":
      assert min(clocks) >= e.iteration - bound
    elif e.kind == "apply":
      clocks[e.worker] += 1
  assert sum(clocks) == 48_000 and max(clocks) - min(clocks) <= bound + 1
  assert summarize(events, m)["updates"] == 48_000


# Finding F3 of IPDPS'21, timing only: ResNet-50 on Titan Vs, batch 32 per worker.
RESNET50 = dict(model_bytes=25.6e6 * 4, flops_per_batch=4.1e9 * 3 * 32, profile="titan-v")
BATCH = 32
F3_PS = {"BSP": lambda c, n: synchronous(c, n, "ps"),
         "ASP": lambda c, n: centralized(c, n * c.num_workers),
         "SSP s=3": lambda c, n: centralized(c, n * c.num_workers, staleness_bound=3)}
F3_DECENTRALIZED = {"AR-SGD": lambda c, n: synchronous(c, n, "allreduce"),
                    "AD-PSGD": lambda c, n: decentralized(c, n * c.num_workers)}
F3_INFO = {"EASGD t=4": lambda c, n: elastic(c, n * c.num_workers, period=4),
           "GoSGD p=1": lambda c, n: gossip(c, n * c.num_workers, probability=1.0)}


def _samples_per_s(schedule, network, workers, servers=1, iterations=100):
  cost = CostModel.build(workers, network=network, servers=servers, jitter=0.1, **RESNET50)
  return summarize(schedule(cost, iterations), workers)["batches_per_s"] * BATCH


def test_f3_parameter_server_scales_worse_and_more_so_on_a_slow_network():
  table, mean = {}, lambda xs: sum(xs) / len(xs)
  lines = ["", "F3: samples/s (speedup 4 -> 24 workers), ResNet-50, titan-v, 1 PS shard",
           f"{'':10s}" + "".join(f"{n:>28s}" for n in ("10gbps", "56gbps"))]
  for name, schedule in {**F3_PS, **F3_DECENTRALIZED, **F3_INFO}.items():
    cells = ""
    for network in ("10gbps", "56gbps"):
      few, many = (_samples_per_s(schedule, network, m) for m in (4, 24))
      table[name, network] = many / few
      cells += f"{few:9.0f} -> {many:7.0f} ({many / few:4.2f}x)"
    lines.append(f"{name:10s}{cells}")
  gap = {}
  for network in ("10gbps", "56gbps"):
    ps = [table[n, network] for n in F3_PS]
    dec = [table[n, network] for n in F3_DECENTRALIZED]
    assert max(ps) < min(dec), network
    gap[network] = mean(dec) / mean(ps)
  lines.append("speedup ratio decentralized / PS: " +
               ", ".join(f"{n} {g:.2f}" for n, g in gap.items()))
  print("\n".join(lines))
  assert gap["10gbps"] > gap["56gbps"] * 1.2


def test_more_server_shards_relieve_the_bottleneck():
  asp = F3_PS["ASP"]
  rates = [_samples_per_s(asp, "10gbps", 24, servers=k, iterations=40) for k in (1, 2, 4)]
  assert rates[0] < rates[1] < rates[2]
  assert rates[1] == pytest.approx(2 * rates[0], rel=0.1)  # the shard links are the limit


def test_bsp_at_a_server_by_hand():
  """Two workers (1 s and 0.5 s a batch), one server link of 1 model/s with
  0.1 s latency, 3 steps. Pushes queue in the order the workers finish;
  after each barrier but the last the server sends the model to each worker
  in turn, first to worker g mod 2 at step g. Times worked out on paper."""
  cost = CostModel(2, compute_s=1.0, model_bytes=1e9, bandwidth=1e9, latency=0.1,
                   speeds=(1.0, 2.0))
  events = synchronous(cost, 3, "ps")
  assert [e.time for e in events if e.kind == "step"] == pytest.approx([2.6, 6.8, 11.0])
  waits = {(e.iteration, e.worker): e.duration for e in events if e.kind == "wait"}
  assert waits == pytest.approx({(0, 0): 1.6, (0, 1): 2.1, (1, 0): 2.1, (1, 1): 1.6,
                                 (2, 0): 1.1, (2, 1): 2.6})
  assert all(e.time == pytest.approx({0: 2.6, 1: 6.8, 2: 11.0}[e.iteration])
             for e in events if e.kind == "wait")
  assert events.bytes_total == 10 * 1e9  # 3 x 2 pushes, 2 x 2 pulls
  assert events.queued_s == pytest.approx((1.5, 1.5))


def test_gossip_between_two_workers_by_hand():
  """With p = 1 each of two workers sends every step to the other; the first
  steps end after their batches' compute time (1 s and 0.5 s). A message
  takes 1.1 s to merge (1 s on the links, 0.1 s latency), longer than either
  step: from its second step on, each worker's push waits for its last
  message's merge, then the worker computes on. Both go at the links' pace,
  a step every 1.1 s."""
  cost = CostModel(2, compute_s=1.0, model_bytes=1e9, bandwidth=1e9, latency=0.1,
                   speeds=(1.0, 2.0))
  events = gossip(cost, 12, probability=1.0)
  local = {w: [(e.iteration, e.time) for e in events if e.kind == "local" and e.worker == w]
           for w in (0, 1)}
  for w, ends in ((0, [1.0, 2.0]), (1, [0.5, 1.0])):
    ends += [ends[-1] + 1.1 * k for k in range(1, len(local[w]) - 1)]
    assert local[w] == [(i, pytest.approx(t)) for i, t in enumerate(ends)]
  assert len(local[0]) + len(local[1]) == 12
  sent = [e for e in events if e.kind == "send"]
  assert all(e.peer == 1 - e.worker for e in sent)
  # worker 1's second push (at 1 s) waits for its first message's merge, at 1.6 s;
  # worker 0's (at 2 s), for its first's at 2.1 s
  waits = [(e.worker, e.iteration, e.time, e.duration) for e in events if e.kind == "wait"]
  assert waits[:2] == [(1, 1, pytest.approx(1.6), pytest.approx(0.6)),
                       (0, 1, pytest.approx(2.1), pytest.approx(0.1))]
  assert all(d == pytest.approx(0.6 if w else 0.1) for w, _, _, d in waits)


def test_elastic_by_hand():
  """One worker, 1 s a batch, a link of 1 model/s with 0.1 s latency, an
  exchange every 2 local steps: the push arrives 1.1 s after the second step
  (the exchange), the reply 1.1 s later, then the next step's second."""
  cost = CostModel(1, compute_s=1.0, model_bytes=1e9, bandwidth=1e9, latency=0.1)
  events = elastic(cost, 4, period=2)
  assert [(e.kind, e.iteration) for e in events] == [
      ("local", 0), ("local", 1), ("exchange", 1), ("local", 2), ("local", 3)]
  assert [e.time for e in events] == pytest.approx([1.0, 2.0, 3.1, 5.2, 6.2])
  assert events.bytes_total == 2e9  # one push, one reply
  # period 1: an exchange after every step; two workers' pushes queue at the server
  two = CostModel(2, compute_s=1.0, model_bytes=1e9, bandwidth=1e9, latency=0.1,
                  speeds=(1.0, 2.0))
  first = [(e.kind, e.worker, e.time) for e in elastic(two, 6, period=1)][:4]
  assert first == [("local", 1, 0.5), ("local", 0, 1.0), ("exchange", 1, pytest.approx(1.6)),
                   ("exchange", 0, pytest.approx(2.6))]


@pytest.mark.parametrize("build,field,value,allowed", [
    (lambda c, v: elastic(c, 4, period=v), "communication_period", 0,
     "an integer >= 1 (local steps between exchanges)"),
    (lambda c, v: gossip(c, 4, probability=v), "gossip_probability", 1.5,
     "a probability in [0, 1]"),
    (lambda c, v: synchronous(c, v), "iterations", -1, "an integer >= 0"),
    (lambda c, v: synchronous(c, v), "iterations", 1.5, "an integer >= 0"),
    (lambda c, v: synchronous(c, 2, v), "sync_mode", "ring", "one of ps, allreduce, local"),
    (lambda c, v: synchronous(c, 2, "local", v), "communication_period", 0,
     "an integer >= 1 (local steps between averagings)"),
    (lambda c, v: centralized(c, 4, staleness_bound=v), "staleness_bound", -1,
     "an integer >= 0, or None for ASP"),
    (lambda c, v: centralized(c, 4, staleness_bound=v), "staleness_bound", 2.0,
     "an integer >= 0, or None for ASP"),
])
def test_a_schedule_refuses_an_argument_out_of_range(build, field, value, allowed):
  cost = CostModel(2, compute_s=1.0, model_bytes=1e6, bandwidth=1e9)
  with pytest.raises(ValueError) as error:
    build(cost, value)
  assert str(error.value) == f"{field}={value!r}: {allowed}"


def test_bsp_serves_the_pulls_in_rotation_by_hand():
  """Three workers (1, 0.5 and 0.25 s a batch), one server link of 1 model/s
  with 0.1 s latency. Pushes queue in finishing order (w2, w1, w0: barrier
  3.35); the server then sends the model to w0, w1, w2 at step 0 (ready
  4.45, 5.45, 6.45) and to w1, w2, w0 at step 1 (barrier 8.55; ready 11.65,
  9.65, 10.65), so step 2's barrier is w0's push, 12.65 + 1.1. Worked out on
  paper."""
  cost = CostModel(3, compute_s=1.0, model_bytes=1e9, bandwidth=1e9, latency=0.1,
                   speeds=(1.0, 2.0, 4.0))
  events = synchronous(cost, 3, "ps")
  assert [e.time for e in events if e.kind == "step"] == pytest.approx([3.35, 8.55, 13.75])
  waits = {(e.iteration, e.worker): e.duration for e in events if e.kind == "wait"}
  assert waits == pytest.approx({(0, 0): 2.35, (0, 1): 2.85, (0, 2): 3.1,
                                 (1, 0): 3.1, (1, 1): 2.6, (1, 2): 1.85,
                                 (2, 0): 1.1, (2, 1): 3.6, (2, 2): 2.85})
  # queued on the server's links: w0's push 1.25 s at step 0 and its pull 2 s
  # at step 1; w1's push 0.75, pull 1, push 0.5; w2's pull 2, push 0.75, pull 1,
  # push 0.25
  assert events.queued_s == pytest.approx((3.25, 2.25, 4.0))


def test_a_bsp_worker_done_at_the_barrier_records_no_wait():
  """Free messages: the barrier is the slowest worker's finish, and it does
  not wait for itself."""
  cost = CostModel(2, compute_s=1.0, model_bytes=0, bandwidth=1e9, latency=0,
                   speeds=(1.0, 2.0))
  events = synchronous(cost, 2, "ps")
  assert [(e.kind, e.worker, e.time, e.duration) for e in events] == [
      ("wait", 1, 1.0, 0.5), ("step", -1, 1.0, 0.0), ("wait", 1, 2.0, 0.5),
      ("step", -1, 2.0, 0.0)]


def test_decentralized_by_hand():
  """One worker: pull, compute 1 s, apply; nothing to average with. Two: each
  sends its model to the other after its batch (1.0 + 0.1 + 1.0) and gets
  the peer's back (another 1.1 s); both average at 3.2 and go on."""
  cost = dict(compute_s=1.0, model_bytes=1e9, bandwidth=1e9, latency=0.1)
  one = decentralized(CostModel(1, **cost), 3)
  assert [(e.kind, e.time) for e in one] == [("pull", 0.0), ("apply", 1.0), ("pull", 1.0),
                                              ("apply", 2.0), ("pull", 2.0), ("apply", 3.0)]
  two = decentralized(CostModel(2, **cost), 4)
  averages = [(e.worker, e.peer, e.iteration, e.time) for e in two if e.kind == "average"]
  assert averages == [(0, 1, 0, pytest.approx(3.2)), (1, 0, 0, pytest.approx(3.2)),
                      (0, 1, 1, pytest.approx(6.4)), (1, 0, 1, pytest.approx(6.4))]


def test_a_reply_queued_behind_the_peers_own_message_is_charged_to_the_waiter():
  """w0 (0.5 s a batch) sends to w1 at 0.5 (arrives 1.6); w1 (1 s) sent its own
  model at 1.0, which holds its up-link until 2.1; the reply, ready to leave
  at 1.6 + 0.1 latency, waits 0.4 s, charged to w0, who waits for it; it
  arrives at 3.1, when w0 averages."""
  cost = CostModel(2, compute_s=1.0, model_bytes=1e9, bandwidth=1e9, latency=0.1,
                   speeds=(2.0, 1.0))
  events = decentralized(cost, 2)
  assert [(e.worker, e.time) for e in events if e.kind == "average"][0] == (
      0, pytest.approx(3.1))
  assert events.queued_s == pytest.approx((0.4, 0.0))


def test_schedule_defaults_and_edges():
  cost = CostModel(3, compute_s=1.0, model_bytes=1e6, bandwidth=1e9)
  assert list(synchronous(cost, 0)) == []  # no iterations: an empty schedule
  assert list(synchronous(cost, 3)) == list(synchronous(cost, 3, "allreduce", 1))


def test_a_random_peer_is_uniform_over_the_others():
  from jaxdl.cluster.schedule import _other
  for m in (2, 3, 5):
    for worker in range(m):
      peers = [_other(u, worker, m) for u in np.arange(0, 1, 1 / (60 * (m - 1)))]
      counts = collections.Counter(peers)
      assert worker not in counts and set(counts.values()) == {60}, (m, worker, counts)
      # the largest draw below 1 picks the last other worker
      assert _other(1 - 2**-53, worker, m) == (m - 1 if worker < m - 1 else m - 2)


def test_ssp_by_hand():
  """Four workers computing 1.5, 1, 1 and 3 s a batch, 0.5 s each way to the
  server (latency only), SSP with bound 0. w1 and w2 apply at 2.0, w0 at 2.5,
  and all three wait for w3, who applies at 4.0; the longest-waiting pull
  first (w1, w2, then w0), then w3's. A pull records its 0.5 s transfer, an
  apply its iteration's compute seconds, a wait how long the worker idled (version -1: none).
  Worked out on paper."""
  cost = CostModel(4, compute_s=3.0, model_bytes=0.0, latency=0.5, speeds=(2.0, 3.0, 3.0, 1.0))
  events = centralized(cost, 6, staleness_bound=0)
  got = [(e.time, e.kind, e.worker, e.iteration, e.version, e.duration) for e in events]
  approx = pytest.approx
  assert got == [
      (0.0, "pull", 0, 0, 0, 0.5), (0.0, "pull", 1, 0, 0, 0.5), (0.0, "pull", 2, 0, 0, 0.5),
      (0.0, "pull", 3, 0, 0, 0.5),
      (2.0, "apply", 1, 0, 1, approx(1.0)), (2.0, "apply", 2, 0, 2, approx(1.0)),
      (2.5, "apply", 0, 0, 3, approx(1.5)), (4.0, "apply", 3, 0, 4, approx(3.0)),
      (4.0, "wait", 1, 1, -1, approx(2.0)), (4.0, "pull", 1, 1, 4, 0.5),
      (4.0, "wait", 2, 1, -1, approx(2.0)), (4.0, "pull", 2, 1, 4, 0.5),
      (4.0, "wait", 0, 1, -1, approx(1.5)), (4.0, "pull", 0, 1, 4, 0.5),
      (4.0, "pull", 3, 1, 4, 0.5),
      (6.0, "apply", 1, 1, 5, approx(1.0)), (6.0, "apply", 2, 1, 6, approx(1.0)),
  ]


def test_a_worker_released_at_the_instant_it_blocks_records_no_wait():
  """Two equal workers under SSP 0: the first to apply blocks, and the other's
  apply at the same instant releases it; it idled 0 s, so no "wait" event."""
  cost = CostModel(2, compute_s=1.0, model_bytes=0.0, latency=0.5)
  events = centralized(cost, 20, staleness_bound=0)
  assert [e.kind for e in events if e.kind == "wait"] == []
  assert [e.time for e in events if e.kind == "apply"] == pytest.approx(
      [2.0 * (i // 2 + 1) for i in range(20)])


@pytest.mark.parametrize("mode,expected", [
    ("allreduce", [(1.0, "wait", 1, 0, 0.5), (2.2, "step", -1, 0, 0.0),
                   (3.2, "wait", 1, 1, 0.5), (4.4, "step", -1, 1, 0.0)]),
    ("local", [(1.0, "step", -1, 0, 0.0), (2.0, "wait", 1, 1, 1.0),
               (3.2, "step", -1, 1, 0.0)]),
])
def test_allreduce_and_local_sgd_by_hand(mode, expected):
  """Two workers (1 and 0.5 s a batch), links of 1 model/s with 0.1 s latency:
  a ring all-reduce of two takes 2(M-1)/M = 1 model's time plus 2(M-1) = 2
  latencies, 1.2 s. The faster worker waits at each barrier for the slower;
  local SGD (period 2) has a barrier every second step only."""
  cost = CostModel(2, compute_s=1.0, model_bytes=1e9, bandwidth=1e9, latency=0.1,
                   speeds=(1.0, 2.0))
  events = synchronous(cost, 2, mode, period=2)
  got = [(e.time, e.kind, e.worker, e.iteration, e.duration) for e in events]
  assert got == [tuple(pytest.approx(x) if isinstance(x, float) else x for x in row)
                 for row in expected]
  # a ring has no queue; a model crosses each link twice per round, and
  # local SGD averages every step unless told
  assert events.queued_s == (0.0, 0.0)
  assert events.bytes_total == (2 if mode == "allreduce" else 1) * 2 * 1e9
  assert synchronous(cost, 2, "local") == synchronous(cost, 2, "allreduce")


def test_a_central_process_serves_one_update_at_a_time_by_hand():
  """A measured server time (a real engine's, `jaxdl calibrate`): two
  workers, 1 s a gradient, free messages, 3 s of the server per update. Both
  push at 1 s; the server applies worker 0's at 4 s and worker 1's at 7 s;
  worker 0 is back at 5 s and waits until 7 s, and so on: the server
  bounds the run at one update every 3 s."""
  cost = CostModel(2, compute_s=1.0, model_bytes=0, bandwidth=1e9, latency=0, server_s=3.0)
  events = centralized(cost, 4)
  applies = [(e.worker, e.time, e.duration) for e in events if e.kind == "apply"]
  assert applies == [(0, 4.0, 1.0), (1, 7.0, 1.0), (0, 10.0, 1.0), (1, 13.0, 1.0)]
  # queued at the server: worker 0 at 5 s (2 s) and 11 s (2 s), worker 1 at 1 s (3 s), 8 s (2 s)
  assert events.queued_s == (4.0, 5.0)


def test_a_coordinator_grants_one_event_at_a_time_by_hand():
  """A measured coordinator time per event (0.5 s), two workers, 1 s a
  gradient, no messages: worker 0's step is granted at 1.5 s, worker 1's,
  asked at 1 s too, at 2 s; each next step starts when its grant ends."""
  cost = CostModel(2, compute_s=1.0, model_bytes=0, bandwidth=1e9, latency=0, order_s=0.5)
  events = gossip(cost, 6, probability=0.0)
  assert [(e.worker, e.time) for e in events] == [
      (0, 1.5), (1, 2.0), (0, 3.0), (1, 3.5), (0, 4.5), (1, 5.0)]
  # every message too: its send (by the sender, which goes on after it) and its merge
  kinds = [(e.kind, e.worker, e.time) for e in gossip(cost, 3, probability=1.0)]
  assert kinds == [("local", 0, 1.5), ("send", 0, 1.5), ("local", 1, 2.0), ("send", 1, 2.0),
                   ("gossip", 0, 3.5), ("gossip", 1, 4.0), ("local", 0, 4.5)]
  # AD-PSGD: five calls an update. Worker 0's gradient grant and pair end at
  # 2 s, worker 1's (queued) at 3 s; the peer's grant of worker 0's average
  # (asked at 2 s) ends at 3.5 s, of worker 1's at 4 s; releasing the pair
  # and the apply's grant: worker 0 at 5 s, worker 1 at 6 s. One worker: two.
  kinds = [(e.kind, e.worker, e.time) for e in decentralized(cost, 2)]
  assert kinds == [("pull", 0, 0.0), ("pull", 1, 0.0), ("average", 0, 3.5),
                   ("average", 1, 4.0), ("apply", 0, 5.0), ("pull", 0, 5.0), ("apply", 1, 6.0)]
  one = CostModel(1, compute_s=1.0, model_bytes=0, bandwidth=1e9, latency=0, order_s=0.5)
  assert [(e.kind, e.time) for e in decentralized(one, 2)] == [
      ("pull", 0.0), ("apply", 2.0), ("pull", 2.0), ("apply", 4.0)]
  # EASGD: each local step granted (0.5 s), each exchange served (2 s)
  cost = CostModel(1, compute_s=1.0, model_bytes=0, bandwidth=1e9, latency=0, order_s=0.5,
                   server_s=2.0)
  assert [(e.kind, e.iteration, e.time) for e in elastic(cost, 4, period=2)] == [
      ("local", 0, 1.5), ("local", 1, 3.0), ("exchange", 1, 5.0), ("local", 2, 6.5),
      ("local", 3, 8.0)]


def test_a_budget_below_zero_is_refused_and_a_plain_schedule_moved_nothing():
  with pytest.raises(ValueError) as error:  # a programming error: no user sets a budget
    Budget(-1)
  assert str(error.value) == "budget=-1: an integer >= 0 (samples, or updates)"
  assert Schedule([]).bytes_total == 0.0 and Schedule([]).queued_s == ()


@pytest.mark.parametrize("mode", ["allreduce", "ps"])
def test_a_partitioned_synchronous_schedule_by_hand(mode):
  """With a partitioner (proportional after one step): step 0's times go to
  it, the new split is recorded at the clock where step 1 starts, and step 1's
  compute times scale with each worker's new batch; every step's times are
  the schedule's batch_seconds."""
  from jaxdl.partition import Partitioner, Policy
  cost = _cost(2, speeds=(1.0, 3.0), jitter=0.0, straggler_prob=0.0)
  partitioner = Partitioner(Policy("proportional", every=1), (32, 32))
  events = synchronous(cost, 2, mode, partitioner=partitioner)
  t0 = [cost.compute_time(w, 0) for w in range(2)]
  assert t0[0] == pytest.approx(3 * t0[1])
  [split] = [e for e in events if e.kind == "partition"]
  assert (split.worker, split.iteration, split.sizes) == (-1, 1, (16, 48))
  assert partitioner.sizes == (16, 48)
  first = [e for e in events if e.kind == "step"][0]
  if mode == "allreduce":  # everyone starts step 1 after the ring
    assert first.time == pytest.approx(max(t0) + cost.ring_allreduce_time())
    assert split.time == first.time
  else:  # after the slowest pull of step 0's model
    assert split.time > first.time
  t1 = [cost.compute_time(w, 1) * b / 32 for w, b in enumerate((16, 48))]
  np.testing.assert_allclose(events.batch_seconds, [[t0[0], t1[0]], [t0[1], t1[1]]])
