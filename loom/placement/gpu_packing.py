"""GPU-packing: fewest nodes, then fewest leaf switches.

Single-node jobs go to the tightest node, ties broken towards the fullest
leaf, so free capacity stays in whole nodes and whole leaves for big jobs.
Multi-node jobs go inside one leaf when a leaf can hold them on the minimum
node count (the tightest such leaf wins); otherwise nodes are taken fullest
first, preferring nodes in leaves with more free GPUs.
"""

from __future__ import annotations

import numpy as np

from loom.core.protocols import PLACERS
from loom.hardware.state import Allocation, ClusterState
from loom.placement.common import (
    NOT_FIT,
    best_over_types,
    fewest_nodes_then_remainder,
    masked_free,
    take_in_order,
)
from loom.workload.job import JobSpec


@PLACERS.register("gpu-packing")
class GpuPacking:
    name = "gpu-packing"

    def place(self, job: JobSpec, gpus: int, state: ClusterState, allowed: np.ndarray | None = None
              ) -> Allocation | None:
        free = masked_free(state, allowed)
        leaf_of = state.topology.switch_of[state.topology.leaf_tier]
        leaf_free = np.bincount(leaf_of, weights=free, minlength=state.topology.num_switches(state.topology.leaf_tier))
        fits = free >= gpus
        if fits.any():
            cand = np.flatnonzero(fits)
            key = np.lexsort((leaf_free[leaf_of[cand]], free[cand]))
            return Allocation.single(int(cand[key[0]]), gpus)
        return best_over_types(state, free, gpus, lambda f: _multi_node(f, gpus, leaf_of))


def _multi_node(free: np.ndarray, gpus: int, leaf_of: np.ndarray) -> Allocation | None:
    minimum = fewest_nodes_then_remainder(free, gpus)
    if minimum is None:
        return None
    leaf_free = np.bincount(leaf_of, weights=free)
    best, best_slack = None, NOT_FIT
    for leaf in np.flatnonzero(leaf_free >= gpus):
        local = np.where(leaf_of == leaf, free, 0)
        alloc = fewest_nodes_then_remainder(local, gpus)
        if alloc is not None and len(alloc.nodes) == len(minimum.nodes) and leaf_free[leaf] - gpus < best_slack:
            best, best_slack = alloc, leaf_free[leaf] - gpus
    if best is not None:
        return best
    order = np.lexsort((-leaf_free[leaf_of], -free))
    alloc = take_in_order(free, order, gpus)
    return alloc if alloc is not None and len(alloc.nodes) <= len(minimum.nodes) else minimum

