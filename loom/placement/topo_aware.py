"""Topo-aware: lowest common switch first (Slurm topology/tree style).

A job that fits on one node goes to the tightest such node, ties broken
towards the fuller leaf. Otherwise, walking up from the leaf tier (leaf, then
minipod, then higher tiers), the first tier with a switch whose free GPUs hold
the job wins; among that tier's switches the one with the least free capacity
that still fits is taken (best fit, lowest index on ties). Its nodes are then
filled leaf by leaf, fuller leaves (fewer free GPUs) first so that emptier
leaves stay whole for later jobs; inside a leaf nodes with more free GPUs come
first (fewer nodes), then by index. When the chosen switch is above the
minipod tier (the job fits in no single minipod), the intermediate switches
under it are taken with the most free first, so the job spans as few minipods
as it can; the fuller-leaf rule applies inside each. Multi-node jobs never
span GPU types.

Per-switch free GPUs come from `ClusterState.switch_free(tier)` (cached) when
nothing is masked; with an `allowed` mask or several GPU types they are summed
from the masked per-node array.
"""

from __future__ import annotations

import numpy as np

from loom.core.protocols import PLACERS
from loom.hardware.state import Allocation, ClusterState
from loom.hardware.topology import Topology
from loom.placement.common import best_over_types, masked_free, take_in_order
from loom.workload.job import JobSpec


@PLACERS.register("topo-aware")
class TopoAware:
    name = "topo-aware"

    def place(self, job: JobSpec, gpus: int, state: ClusterState, allowed: np.ndarray | None = None
              ) -> Allocation | None:
        topo = state.topology
        free = masked_free(state, allowed)
        leaf_of = topo.switch_of[topo.leaf_tier]
        fits = free >= gpus
        if fits.any():
            leaf_free = self._switch_free(state, free, topo.leaf_tier, allowed)
            cand = np.flatnonzero(fits)
            key = np.lexsort((leaf_free[leaf_of[cand]], free[cand]))
            return Allocation.single(int(cand[key[0]]), gpus)
        if allowed is None and topo.homogeneous:
            return self._multi_node(state, free, gpus, cached=True)
        return best_over_types(state, free, gpus, lambda f: self._multi_node(state, f, gpus, cached=False))

    @staticmethod
    def _switch_free(state: ClusterState, free: np.ndarray, tier: int, allowed: np.ndarray | None) -> np.ndarray:
        topo = state.topology
        if allowed is None:
            return state.switch_free(tier)
        return TopoAware._sum(topo, free, tier)

    def _multi_node(self, state: ClusterState, free: np.ndarray, gpus: int, cached: bool) -> Allocation | None:
        topo = state.topology
        if int(free.sum()) < gpus:
            return None
        leaf_of = topo.switch_of[topo.leaf_tier]
        leaf_free = state.switch_free(topo.leaf_tier) if cached else self._sum(topo, free, topo.leaf_tier)
        for tier in range(topo.leaf_tier, -1, -1):
            per_switch = state.switch_free(tier) if cached else self._sum(topo, free, tier)
            slack = np.where(per_switch >= gpus, per_switch - gpus, np.iinfo(np.int64).max)
            switch = int(slack.argmin())
            if per_switch[switch] < gpus:
                continue
            members = np.flatnonzero((topo.switch_of[tier] == switch) & (free > 0))
            # Sort keys, last = primary: switches of the tiers between the chosen
            # one and the leaf with more free first (fewest spanned), then
            # fuller leaves, then nodes with more free GPUs, then index.
            keys = [members, -free[members], leaf_free[leaf_of[members]]]
            for mid in range(topo.leaf_tier - 1, tier, -1):
                mid_free = state.switch_free(mid) if cached else self._sum(topo, free, mid)
                keys += [topo.switch_of[mid][members], -mid_free[topo.switch_of[mid][members]]]
            order = members[np.lexsort(tuple(keys))]
            return take_in_order(free, order, gpus)
        return None

    @staticmethod
    def _sum(topo: Topology, free: np.ndarray, tier: int) -> np.ndarray:
        return np.bincount(topo.switch_of[tier], weights=free, minlength=topo.num_switches(tier)).astype(np.int64)

