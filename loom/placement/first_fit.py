"""First-fit: the first node (by index) that holds the whole job; otherwise
free GPUs collected in node order."""

from __future__ import annotations

import numpy as np

from loom.core.protocols import PLACERS
from loom.hardware.state import Allocation, ClusterState
from loom.placement.common import best_over_types, masked_free, take_in_order
from loom.workload.job import JobSpec


@PLACERS.register("first-fit")
class FirstFit:
    name = "first-fit"

    def place(self, job: JobSpec, gpus: int, state: ClusterState, allowed: np.ndarray | None = None
              ) -> Allocation | None:
        free = masked_free(state, allowed)
        fits = free >= gpus
        node = int(fits.argmax())
        if fits[node]:
            return Allocation.single(node, gpus)

        def in_order(group_free: np.ndarray) -> Allocation | None:
            return take_in_order(group_free, np.flatnonzero(group_free), gpus)

        return best_over_types(state, free, gpus, in_order)
