"""Random-fit: random nodes among those that can hold the job.

A single-node job goes to a random node with enough free GPUs. A multi-node
job that asks for whole nodes (a multiple of the node size) takes that many
random fully-free nodes; otherwise free GPUs are collected from nodes in a
random order. Multi-node jobs never span GPU types (`best_over_types`).
Deterministic for a seed: the generator is created in the constructor, so a
fresh placer with the same seed makes the same sequence of choices.
"""

from __future__ import annotations

import numpy as np

from loom.core.protocols import PLACERS
from loom.hardware.state import Allocation, ClusterState
from loom.placement.common import best_over_types, masked_free, take_in_order
from loom.workload.job import JobSpec


@PLACERS.register("random-fit")
class RandomFit:
    name = "random-fit"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def place(self, job: JobSpec, gpus: int, state: ClusterState, allowed: np.ndarray | None = None
              ) -> Allocation | None:
        free = masked_free(state, allowed)
        fits = np.flatnonzero(free >= gpus)
        if fits.size:
            return Allocation.single(int(self.rng.choice(fits)), gpus)
        capacity = state.topology.node_gpus
        return best_over_types(state, free, gpus, lambda f: self._multi_node(f, capacity, gpus))

    def _multi_node(self, free: np.ndarray, capacity: np.ndarray, gpus: int) -> Allocation | None:
        usable = np.flatnonzero(free > 0)
        if int(free[usable].sum()) < gpus:
            return None
        sizes = np.unique(capacity[usable])
        if sizes.size == 1 and gpus % int(sizes[0]) == 0:
            size = int(sizes[0])
            whole = usable[free[usable] == size]
            need = gpus // size
            if whole.size >= need:
                nodes = np.sort(self.rng.choice(whole, size=need, replace=False))
                return Allocation(tuple(int(n) for n in nodes), (size,) * need)
        return take_in_order(free, self.rng.permutation(usable), gpus)
