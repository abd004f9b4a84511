"""A plain-data description of a topology, for `loom clusters show` and reports."""

from __future__ import annotations

from typing import Any

import numpy as np

from loom.hardware.topology import Topology


def describe(topo: Topology) -> dict[str, Any]:
    tiers = []
    for level, tier in enumerate(topo.tiers):
        per_switch = np.bincount(topo.switch_of[level])
        lo, hi = int(per_switch.min()), int(per_switch.max())
        tiers.append({
            "name": tier.name,
            "switches": topo.num_switches(level),
            "bandwidth_gbps": tier.bandwidth_gbps,
            "latency_us": tier.latency_us,
            "oversubscription": tier.oversubscription,
            "nodes_per_switch": f"{lo}" if lo == hi else f"{lo}–{hi}",
            "minipod": level == topo.minipod_tier,
        })
    return {
        "name": topo.name,
        "description": topo.description,
        "nodes": topo.num_nodes,
        "gpus": topo.total_gpus,
        "tiers": tiers,
        "gpu_types": topo.gpus_by_type(),
    }
