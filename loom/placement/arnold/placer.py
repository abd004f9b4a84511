"""Arnold behind the core's placer protocol, so simulations can use it.

A job is placed topology-aligned when it takes whole nodes (GPUs a multiple
of the node size, at least `min_nodes` nodes); smaller jobs go to best-fit.
Its parallel shape is the job's model's best plan from the estimator when the
trace names a `loom.perf` preset, else TP = the node size and PP = 1 (a
documented default: such jobs have only DP groups to align). The returned
allocation lists nodes in rank order, which is how the simulator and the live
launcher hand ranks out.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from loom.core.plan import ParallelPlan
from loom.core.protocols import PLACERS
from loom.hardware.state import Allocation, ClusterState
from loom.placement.arnold.problem import JobShape
from loom.placement.best_fit import BestFit
from loom.workload.job import JobSpec


@PLACERS.register("arnold")
class ArnoldPlacer:
    name = "arnold"

    def __init__(self, alpha: float = 0.3, time_limit_s: float = 0.5, min_nodes: int = 2, seed: int = 0) -> None:
        self.alpha = alpha
        self.time_limit_s = time_limit_s
        self.min_nodes = min_nodes
        self.seed = seed
        self.fallback = BestFit()
        self._shapes: dict[str, JobShape] = {}  # job → shape of its last placement, until started

    def place(self, job: JobSpec, gpus: int, state: ClusterState, allowed: np.ndarray | None = None
              ) -> Allocation | None:
        from loom.placement.arnold.solver import arnold_place

        topo = state.topology
        for type_id in range(len(topo.gpu_types)):
            per_node = int(topo.node_gpus[topo.node_type == type_id].max()) if (topo.node_type == type_id).any() else 0
            if per_node == 0 or gpus % per_node or gpus // per_node < self.min_nodes:
                continue
            if job.gpu_type is not None and topo.gpu_types[type_id] != job.gpu_type:
                continue
            whole = (state.free == topo.node_gpus) & (topo.node_type == type_id) & (topo.node_gpus == per_node)
            if allowed is not None:
                whole &= allowed
            free = np.flatnonzero(whole)
            if len(free) < gpus // per_node:
                continue
            shape = _shape_for(job.model or "", gpus, per_node, topo.gpu_types[type_id])
            result = arnold_place(shape, topo, free, self.alpha, time_limit_s=self.time_limit_s, seed=self.seed)
            nodes = _rank_order(result.grid)
            self._shapes[job.job_id] = shape
            return Allocation(tuple(nodes), (per_node,) * len(nodes))
        return self.fallback.place(job, gpus, state, allowed)

    def plan_for(self, job: JobSpec, allocation: Allocation) -> ParallelPlan | None:
        """The dp×tp×pp shape this placer aligned the job's nodes for."""
        shape = self._shapes.pop(job.job_id, None)
        if shape is None or shape.gpus != allocation.total:
            return None
        return ParallelPlan(dp=shape.dp, tp=shape.tp, pp=shape.pp)


def _rank_order(grid: np.ndarray) -> list[int]:
    """Nodes in global-rank order: stage by stage (columns), replicas within."""
    return [int(n) for n in grid.T.ravel()]


@lru_cache(maxsize=4096)
def _shape_for(model: str, gpus: int, per_node: int, gpu_type: str) -> JobShape:
    from loom.errors import LoomInputError
    from loom.perf import preset, preset_names
    from loom.perf.inputs import Hardware, TrainingJob
    from loom.perf.search import Choices, fastest_plan

    if model in preset_names():
        try:
            spec = preset(model)
            # A notional pretraining batch (512, rounded down to a multiple of the GPU count), not the
            # job's batch by `loom.perf.inputs.estimator_job`: that rule picks other shapes for some jobs
            # (e.g. llama2-70b on 128 H800 GPUs: dp·tp·pp 16·2·4 → 128·1·1), so it is a decision of its own.
            job = TrainingJob(spec, max(gpus, 512) // gpus * gpus)
            best = fastest_plan(job, Hardware(gpu_type, gpus_per_node=per_node), gpus, choices=Choices(vpp=1))
            if best is not None and (best.plan.dp * best.plan.tp) % per_node == 0 and best.plan.tp <= per_node:
                return JobShape(best.plan.dp, best.plan.tp, best.plan.pp, per_node)
        except LoomInputError:
            pass
    return JobShape(gpus // per_node, per_node, 1, per_node)
