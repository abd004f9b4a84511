"""Group-unaware baseline placements of a pretraining job (Arnold §4 baselines).

A baseline asks a registered placer for ``shape.gpus`` GPUs restricted to the
wholly free nodes of the job's node size, so it takes whole nodes, then lays
ranks out in the default order of a scheduler unaware of the job's groups
(`default_grid`: nodes sorted by name, ranks filling them in order).
"""

from __future__ import annotations

import inspect

import numpy as np

from loom.core.protocols import PLACERS
from loom.errors import LoomInputError
from loom.hardware.state import Allocation, ClusterState
from loom.placement.arnold.problem import JobShape, default_grid, free_nodes
from loom.workload.job import JobSpec

BASELINES = ("best-fit", "random-fit", "gpu-packing", "topo-aware")


def make_placer(placer_name: str, seed: int = 0) -> object:
    """The registered placer; `seed` goes to placers whose constructor takes one."""
    factory = PLACERS.get(placer_name)
    try:
        takes_seed = "seed" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        takes_seed = False
    return factory(seed=seed) if takes_seed else factory()


def whole_free_mask(shape: JobShape, state: ClusterState) -> np.ndarray:
    """Nodes wholly free (not failed, not reserved) with exactly the job's node size."""
    topo = state.topology
    mask = np.zeros(topo.num_nodes, dtype=bool)
    nodes = free_nodes(state)
    mask[nodes[topo.node_gpus[nodes] == shape.gpus_per_node]] = True
    return mask


def baseline_allocation(placer_name: str, shape: JobShape, state: ClusterState, seed: int = 0) -> Allocation | None:
    """The placer's whole-node allocation for the job, or None if it finds nothing."""
    allowed = whole_free_mask(shape, state)
    if int(allowed.sum()) < shape.nodes:
        return None
    placer = make_placer(placer_name, seed)
    job = JobSpec(f"arnold-baseline-{placer_name}", 0.0, shape.gpus)
    alloc = placer.place(job, shape.gpus, state, allowed)
    if alloc is None:
        return None
    _check_whole_nodes(placer_name, alloc, shape, allowed, state)
    return alloc


def baseline_grid(placer_name: str, shape: JobShape, state: ClusterState, seed: int = 0) -> np.ndarray | None:
    """`grid[r, c] = node` of the baseline placement (default rank order), or None."""
    alloc = baseline_allocation(placer_name, shape, state, seed)
    if alloc is None:
        return None
    return default_grid(shape, list(alloc.nodes), state.topology)


def _check_whole_nodes(name: str, alloc: Allocation, shape: JobShape, allowed: np.ndarray,
                       state: ClusterState) -> None:
    topo = state.topology
    nodes = list(alloc.nodes)
    if len(set(nodes)) != len(nodes):
        raise LoomInputError(f"placer '{name}' listed a node twice: {alloc.describe(topo)}", field="placer")
    outside = [n for n in nodes if not allowed[n]]
    if outside:
        raise LoomInputError(
            f"placer '{name}' used nodes that are not wholly free: "
            f"{', '.join(topo.node_names[n] for n in outside[:5])}", field="placer")
    partial = [(n, g) for n, g in zip(alloc.nodes, alloc.gpus) if g != topo.node_gpus[n]]
    if partial:
        n, g = partial[0]
        raise LoomInputError(
            f"placer '{name}' returned a partial node ({topo.node_names[n]}: {g} of {int(topo.node_gpus[n])} GPUs); "
            "Arnold baselines must take whole nodes", field="placer")
    if len(nodes) != shape.nodes or alloc.total != shape.gpus:
        raise LoomInputError(
            f"placer '{name}' returned {len(nodes)} nodes / {alloc.total} GPUs; the job needs "
            f"{shape.nodes} whole nodes ({shape.gpus} GPUs)", field="placer")
