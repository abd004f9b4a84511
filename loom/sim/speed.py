"""Speed models: how fast a job progresses on the GPUs it got."""

from __future__ import annotations

from loom.core.jobs import Job
from loom.core.protocols import SPEED_MODELS
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology


@SPEED_MODELS.register("trace")
class TraceDurationSpeed:
    """Rate 1 on the requested GPUs, so a job runs for its recorded duration.

    On a different GPU count (a resize) progress scales linearly with GPUs:
    the simplest model that conserves GPU-seconds. The estimator-based model
    (loom.perf) replaces this when jobs carry model specs.
    """

    name = "trace"

    def rate(self, job: Job, allocation: Allocation, topology: Topology) -> float:
        return allocation.total / job.spec.gpus
