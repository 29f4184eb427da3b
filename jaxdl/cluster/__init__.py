"""The modelled cluster: device profiles, links and a cost model, and the
discrete-event schedules of each algorithm family on it (events: jaxdl.trace)."""
from __future__ import annotations

from jaxdl.cluster.async_schedules import centralized, decentralized, elastic, gossip
from jaxdl.cluster.cost import (DEFAULT_UTILIZATION, DEVICE_LINKS, DEVICE_PROFILES, EMULATED,
                                MODELLED, CostModel, Profile, achieved_flops, check, is_profile,
                                parse_bandwidth, parse_cluster, read_profile)
from jaxdl.cluster.network import Link, Network, send_over
from jaxdl.cluster.schedule import Budget, Schedule
from jaxdl.cluster.sync_schedules import SYNC_MODES, synchronous

__all__ = [
    "DEFAULT_UTILIZATION", "DEVICE_LINKS", "DEVICE_PROFILES", "EMULATED", "MODELLED", "CostModel",
    "Link", "Network", "Profile", "achieved_flops", "check", "is_profile", "parse_bandwidth", "parse_cluster",
    "read_profile", "send_over",
    "SYNC_MODES", "Budget", "Schedule", "centralized", "decentralized", "elastic", "gossip",
    "synchronous",
]
