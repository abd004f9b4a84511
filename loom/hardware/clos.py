"""Synthetic multi-tier Clos / fat-tree clusters (core → minipod → leaf → node)."""

from __future__ import annotations

from loom.errors import LoomInputError
from loom.hardware.topology import NodeDef, Tier, Topology

MAX_NODES_PER_MINIPOD = 128

# A non-blocking (1:1) three-tier InfiniBand fabric like Arnold's: NDR 400 Gb/s
# ports at every tier; each tier crossed adds about a switch hop of latency.
DEFAULT_TIERS = (
    Tier("core", bandwidth_gbps=400.0, latency_us=3.0),
    Tier("minipod", bandwidth_gbps=400.0, latency_us=2.0),
    Tier("leaf", bandwidth_gbps=400.0, latency_us=1.0),
)


def clos(
    name: str,
    *,
    minipods: int,
    nodes: int,
    gpus_per_node: int = 8,
    gpu_type: str = "H800",
    nodes_per_leaf: int = 16,
    tiers: tuple[Tier, ...] = DEFAULT_TIERS,
    description: str = "",
) -> Topology:
    """Spread `nodes` evenly over `minipods`, then fill leaves of `nodes_per_leaf`.

    Node names are zero-padded (`node0007`) so that sorting by name is the
    physical order, which is what group-unaware baselines use for ranks.
    """
    if minipods < 1 or nodes < minipods:
        raise LoomInputError(f"need 1 ≤ minipods ≤ nodes, got minipods={minipods}, nodes={nodes}", field="minipods")
    if gpus_per_node < 1 or nodes_per_leaf < 1:
        raise LoomInputError("gpus_per_node and nodes_per_leaf must be ≥ 1", field="gpus_per_node")
    per_pod = [nodes // minipods + (1 if p < nodes % minipods else 0) for p in range(minipods)]
    if max(per_pod) > MAX_NODES_PER_MINIPOD:
        raise LoomInputError(
            f"{max(per_pod)} nodes per minipod exceeds the {MAX_NODES_PER_MINIPOD} a minipod holds; add minipods",
            field="nodes",
        )
    width = len(str(nodes - 1))
    defs = []
    index = 0
    for pod, count in enumerate(per_pod):
        for k in range(count):
            leaf = k // nodes_per_leaf
            defs.append(
                NodeDef(
                    name=f"node{index:0{width}d}",
                    path=("core", f"mp{pod}", f"leaf{leaf}"),
                    gpu_type=gpu_type,
                    gpus=gpus_per_node,
                )
            )
            index += 1
    return Topology.build(name, tiers, defs, minipod_tier="minipod", description=description)
