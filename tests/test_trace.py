"""The trace of a run: the event format, trace files, step ends and statistics."""
import json

import pytest

from jaxdl.cluster import CostModel, centralized, elastic, gossip, synchronous
from jaxdl.trace import KINDS, Event, read_trace, step_ends, summarize, write_trace


def _cost(num_workers=4) -> CostModel:
  return CostModel(num_workers, compute_s=0.1, model_bytes=4e7, jitter=0.3, seed=0)


def test_json_leaves_out_unset_fields_and_round_trips():
  pull = Event(1.5, "pull", 2, iteration=3, duration=0.25, version=7)
  assert json.loads(pull.to_json()) == {"time": 1.5, "kind": "pull", "worker": 2,
                                        "iteration": 3, "duration": 0.25, "version": 7}
  gossip_event = Event(2.0, "gossip", 0, iteration=1, peer=3)
  assert json.loads(gossip_event.to_json()) == {"time": 2.0, "kind": "gossip", "worker": 0,
                                                "iteration": 1, "peer": 3}
  step = Event(3.0, "step", -1, iteration=4)  # all workers: worker -1, left out
  assert json.loads(step.to_json()) == {"time": 3.0, "kind": "step", "iteration": 4}
  for event in (pull, gossip_event, step, Event(0.5, "wait", 1, iteration=0, duration=0.5)):
    assert Event.from_json(event.to_json()) == event


def test_write_and_read_a_schedule(tmp_path):
  events = (list(centralized(_cost(), 5, staleness_bound=1))
            + list(synchronous(_cost(), 3, "local", period=2)))
  assert {e.kind for e in events} >= {"pull", "apply", "wait", "step"}
  path = tmp_path / "trace.jsonl"
  write_trace(path, events)
  assert len(path.read_text().splitlines()) == len(events)
  assert list(read_trace(path)) == events
  with open(path, "a") as f:  # blank lines are skipped
    f.write("\n  \n")
  assert list(read_trace(str(path))) == events


def test_a_torn_last_line_is_left_out_where_asked(tmp_path):
  path = tmp_path / "trace.jsonl"
  write_trace(path, [Event(0.0, "pull", 0, 0)])
  with open(path, "a") as f:
    f.write('{"time": 1.0, "kind": "pu')  # an append cut short
  assert list(read_trace(path, torn_tail=True)) == [Event(0.0, "pull", 0, 0)]
  with pytest.raises(ValueError, match="line 2"):
    list(read_trace(path))


def test_every_event_kind_is_known_and_documented():
  import jaxdl.trace
  assert KINDS == ("pull", "apply", "local", "exchange", "send", "gossip", "average", "step",
                   "wait", "restart", "partition")
  assert all(f'"{kind}"' in jaxdl.trace.__doc__ for kind in KINDS)


def test_step_ends_counts_a_synchronous_step_as_m_iterations():
  events = [Event(1.0, "step", -1, iteration=0),
            Event(1.5, "wait", 2, iteration=1, duration=0.5),
            Event(2.0, "step", -1, iteration=1),
            Event(3.0, "step", -1, iteration=2)]
  assert step_ends(events, 4) == [0, 2, 3]
  schedule = synchronous(_cost(), 12, "local", period=3)
  ends = step_ends(schedule, 4)
  assert ends == [i for i, e in enumerate(schedule) if e.kind == "step"]
  assert len(ends) == 12


def test_step_ends_at_every_m_th_apply_or_local():
  events = [Event(0.0, "pull", 0, iteration=0, version=0),
            Event(0.0, "pull", 1, iteration=0, version=0),
            Event(0.0, "pull", 2, iteration=0, version=0),
            Event(1.0, "apply", 1, iteration=0, version=1),
            Event(1.0, "pull", 1, iteration=1, version=1),
            Event(1.1, "apply", 1, iteration=1, version=2),  # the same worker counts
            Event(1.2, "wait", 0, iteration=0, duration=0.2),
            Event(1.3, "apply", 0, iteration=0, version=3),   # 3rd: step 0 ends
            Event(2.0, "local", 2, iteration=0),
            Event(2.0, "exchange", 2, iteration=0),
            Event(2.1, "gossip", 2, iteration=0, peer=1),
            Event(2.2, "average", 2, iteration=0, peer=0),
            Event(2.5, "local", 0, iteration=1),
            Event(3.0, "apply", 2, iteration=0, version=4)]  # 6th: step 1 ends
  assert step_ends(events, 3) == [7, 13]
  assert step_ends(events, 1) == [3, 5, 7, 8, 12, 13]
  assert step_ends(events[:7], 3) == []


@pytest.mark.parametrize("schedule", [
    lambda cost, n: centralized(cost, n, staleness_bound=2),
    lambda cost, n: elastic(cost, n, period=4),
    lambda cost, n: gossip(cost, n, probability=0.5),
])
def test_a_budget_of_n_steps_has_n_step_ends(schedule):
  m, n = 4, 18
  events = schedule(_cost(m), n * m)  # n steps of m updates
  ends = step_ends(events, m)
  assert len(ends) == n and ends[-1] == len(events) - 1  # the budget's last update ends it
  iterations = [i for i, e in enumerate(events) if e.kind in ("apply", "local")]
  assert ends == iterations[m - 1::m]


def test_a_step_is_a_global_batch_of_samples():
  # Batch sizes 1 and 3: a step is 4 samples, however many updates that takes.
  events = [Event(float(t), "apply", w, iteration=t) for t, w in enumerate([1, 0, 0, 0, 1, 0])]
  assert step_ends(events, (1, 3)) == [1, 4]       # 3+1 = 4; 4+1+1+3 = 9 >= 8
  assert step_ends(events, 2) == [1, 3, 5]         # with equal sizes: every 2 updates


def test_summarize_counts_staleness_waits_and_traffic():
  events = [Event(0.0, "pull", 0, iteration=0, version=0),
            Event(0.0, "pull", 1, iteration=0, version=0),
            Event(1.0, "apply", 0, iteration=0, version=1),  # nothing landed between
            Event(1.0, "pull", 0, iteration=1, version=1),
            Event(2.0, "apply", 1, iteration=0, version=2),  # worker 0's landed first
            Event(2.5, "wait", 1, iteration=1, duration=0.5),
            Event(4.0, "apply", 0, iteration=1, version=3)]  # worker 1's landed first
  stats = summarize(events, 2, bytes_total=6.0)
  assert stats["simulated_time_s"] == 4.0
  assert stats["counts"] == {"apply": 3, "pull": 3, "wait": 1}
  assert stats["updates"] == 3 and stats["batches"] == 3
  assert stats["batches_per_s"] == pytest.approx(0.75)
  assert stats["staleness_histogram"] == {0: 1, 1: 2}
  assert stats["staleness_mean"] == pytest.approx(2 / 3) and stats["staleness_max"] == 1
  assert stats["wait_s"] == [0.0, 0.5] and stats["wait_total_s"] == 0.5
  assert stats["bytes_total"] == 6.0 and stats["queued_s"] == []


def test_summarize_a_synchronous_schedule_counts_m_batches_per_step():
  events = [Event(1.0, "step", -1, iteration=0), Event(2.0, "step", -1, iteration=1)]
  stats = summarize(events, 4)
  assert stats["updates"] == 2 and stats["batches"] == 8
  assert stats["staleness_mean"] is None and stats["staleness_max"] is None
  assert stats["bytes_total"] is None  # a plain list carries no traffic


def test_summarize_takes_traffic_from_the_schedule_unless_given():
  schedule = centralized(_cost(), 3)
  stats = summarize(schedule, 4)
  assert stats["bytes_total"] == schedule.bytes_total > 0
  assert stats["queued_s"] == list(schedule.queued_s)
  assert summarize(schedule, 4, bytes_total=1.0)["bytes_total"] == 1.0


def test_summarize_empty_and_explicit_bytes():
  stats = summarize([], 2, bytes_total=5.0)
  assert stats["simulated_time_s"] == 0.0 and stats["bytes_total"] == 5.0
  assert stats["wait_s"] == [0.0, 0.0] and stats["staleness_histogram"] == {}
