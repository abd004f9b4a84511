"""Best-fit: the tightest single node; otherwise the fewest nodes, the
remainder on the tightest node left (minimises stranded GPUs)."""

from __future__ import annotations

import numpy as np

from loom.core.protocols import PLACERS
from loom.hardware.state import Allocation, ClusterState
from loom.placement.common import (
    best_over_types,
    fewest_nodes_indexed,
    fewest_nodes_then_remainder,
    masked_free,
    tightest_node,
)
from loom.workload.job import JobSpec


@PLACERS.register("best-fit")
class BestFit:
    name = "best-fit"

    def place(self, job: JobSpec, gpus: int, state: ClusterState, allowed: np.ndarray | None = None
              ) -> Allocation | None:
        if allowed is None:  # every node may be used: the state's index answers without a pass over the nodes
            node = state.tightest(gpus)
            return Allocation.single(node, gpus) if node is not None else fewest_nodes_indexed(state, gpus)
        free = masked_free(state, allowed)
        node = tightest_node(free, gpus)
        if node is not None:
            return Allocation.single(node, gpus)
        return best_over_types(state, free, gpus, lambda f: fewest_nodes_then_remainder(f, gpus))
