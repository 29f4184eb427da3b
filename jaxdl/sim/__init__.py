"""Deterministic cluster simulation: cost model, schedules and their events."""
from __future__ import annotations

from jaxdl.sim.cost import (DEFAULT_UTILIZATION, DEVICE_PROFILES, CostModel, Link, Network,
                            achieved_flops, parse_bandwidth, parse_cluster, send_over)
from jaxdl.sim.events import KINDS, Event, read_trace, write_trace
from jaxdl.sim.schedule import (SYNC_MODES, Schedule, centralized, decentralized, elastic,
                                gossip, summarize, synchronous)

__all__ = [
    "DEFAULT_UTILIZATION", "DEVICE_PROFILES", "CostModel", "Link", "Network",
    "achieved_flops", "parse_bandwidth", "parse_cluster", "send_over",
    "KINDS", "Event", "read_trace", "write_trace",
    "SYNC_MODES", "Schedule", "centralized", "decentralized", "elastic", "gossip",
    "summarize", "synchronous",
]
