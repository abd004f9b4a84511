"""The two seams of the scheduling core, and their registries.

A `Policy` decides *when* and *which* (it returns decisions); a `Placer`
decides *where* (it returns an allocation on a state it does not mutate).
Neither knows whether it runs in the simulator or live: both see only a
`SchedulingContext` and a `ClusterState`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from loom.registry import Registry

if TYPE_CHECKING:
    from loom.core.context import SchedulingContext
    from loom.core.decisions import Decision
    from loom.core.jobs import Job
    from loom.hardware.state import Allocation, ClusterState
    from loom.hardware.topology import Topology
    from loom.workload.job import JobSpec


@runtime_checkable
class Policy(Protocol):
    name: str

    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        """Called once per scheduling round; must not mutate `ctx`."""
        ...


@runtime_checkable
class Placer(Protocol):
    name: str

    def place(
        self, job: JobSpec, gpus: int, state: ClusterState, allowed: np.ndarray | None = None
    ) -> Allocation | None:
        """GPUs for `job` (gang: all `gpus` or None) on nodes where `allowed` is True."""
        ...


@runtime_checkable
class SpeedModel(Protocol):
    """Progress rate of a job on an allocation (1.0 = as recorded in its trace)."""

    name: str

    def rate(self, job: Job, allocation: Allocation, topology: Topology) -> float: ...

    # Optional: `prepare(specs, topology) -> list[JobSpec]` is called once before
    # a run so a model can give jobs without a duration one (see EstimatorSpeed).


POLICIES: Registry[type] = Registry(
    "policy",
    "loom.policies",
    ("loom.policies.fcfs", "loom.policies.sjf", "loom.policies.easy", "loom.policies.priority",
     "loom.policies.quota", "loom.policies.reservation", "loom.policies.crius", "loom.policies.gavel",
     "loom.policies.gandiva", "loom.policies.elasticflow", "loom.policies.sia", "loom.policies.sia_arena",
     "loom.policies.gavel_arena", "loom.policies.sla"),
    homes={"reserve": "loom.policies.reservation"},
)
PLACERS: Registry[type] = Registry(
    "placer",
    "loom.placers",
    (
        "loom.placement.first_fit",
        "loom.placement.best_fit",
        "loom.placement.gpu_packing",
        "loom.placement.random_fit",
        "loom.placement.topo_aware", "loom.placement.arnold.placer",
    ),
    homes={"arnold": "loom.placement.arnold.placer"},
)
SPEED_MODELS: Registry[type] = Registry(
    "speed model", "loom.speed_models", ("loom.sim.speed", "loom.sim.estimator_speed", "loom.sim.arena_profile"),
    homes={"trace": "loom.sim.speed", "estimator": "loom.sim.estimator_speed"},
)
