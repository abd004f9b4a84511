"""From the nodes a job got to the `Placement` the estimator prices.

Ranks fill nodes in the order given, G per node, Megatron's order: tensor
parallel fastest, then data parallel, then pipeline (rank = t + tp·(d + dp·p)).
A DP group is the ranks sharing (t, p); a PP group those sharing (t, d). For
each kind the widest group's minipod count and the oversubscription of the
uplinks it must use are what the communication model needs: a group whose
members sit under more than one switch of a tier sends through that tier's
uplinks, so the largest oversubscription among such tiers applies.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.hardware.topology import Topology
from loom.perf.inputs import Placement


def placement_of(
    nodes: Sequence[int], plan: ParallelPlan, topology: Topology, gpus: Sequence[int] | None = None
) -> Placement:
    """Spread of `plan`'s DP and PP groups when its ranks fill `nodes` in order
    (`gpus[i]` ranks on nodes[i]; all of each node's GPUs by default)."""
    if not len(nodes):
        raise LoomInputError("a placement needs at least one node", field="nodes")
    node_ids = np.asarray(nodes, dtype=np.int64)
    per_node = topology.node_gpus[node_ids] if gpus is None else np.asarray(gpus, dtype=np.int64)
    rank_node = np.repeat(node_ids, per_node)
    if rank_node.size < plan.world_size:
        raise LoomInputError(
            f"{plan.world_size} ranks do not fit on {rank_node.size} GPUs of the given nodes", field="nodes"
        )
    grid = rank_node[: plan.world_size].reshape(plan.pp, plan.dp, plan.tp)
    dp_groups = grid.transpose(0, 2, 1).reshape(-1, plan.dp)  # [(p, t), d]
    pp_groups = grid.transpose(1, 2, 0).reshape(-1, plan.pp)  # [(d, t), p]
    dp_minipods, dp_over = _spread(dp_groups, topology)
    pp_minipods, pp_over = _spread(pp_groups, topology)
    return Placement(dp_minipods, pp_minipods, dp_over, pp_over)


def _spread(groups: np.ndarray, topology: Topology) -> tuple[int, float]:
    """(most minipods any group spans, worst uplink oversubscription it uses)."""
    if groups.shape[1] == 1:
        return 1, 1.0
    switches = topology.switch_of[:, groups]  # [tiers, groups, members]
    spans = _distinct_per_row(switches)  # [tiers, groups]
    minipods = int(spans[topology.minipod_tier].max())
    crossed = spans.max(axis=1) > 1  # tiers some group spreads over
    over = [tier.oversubscription for tier, hit in zip(topology.tiers, crossed, strict=True) if hit]
    return minipods, max(1.0, float(max(over, default=1.0)))


def _distinct_per_row(values: np.ndarray) -> np.ndarray:
    ordered = np.sort(values, axis=-1)
    return 1 + (np.diff(ordered, axis=-1) != 0).sum(axis=-1)
