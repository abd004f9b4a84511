"""The core's record of a job: what policies see, in either world.

Only the core writes it, from decisions and from what a backend reports;
policies read it. It holds what can be observed of a real job — spec,
lifecycle state, allocation, plan, start and end times, the throughput and
progress the backend last reported — never a backend's internals (the
simulator keeps its exact work ledger to itself). Work is measured in
"reference seconds": a job at rate 1 does `spec.duration` of work in
`spec.duration` seconds.
"""

from __future__ import annotations

from loom.core.lifecycle import JobState
from loom.core.plan import ParallelPlan
from loom.hardware.state import Allocation
from loom.workload.job import JobSpec

__all__ = ["Job", "JobState"]


class Job:
    __slots__ = (
        "allocation",
        "diagnosis",
        "end_time",
        "failures",
        "first_start",
        "gpu_seconds",
        "gpus",
        "held_since",
        "job_id",
        "key",
        "last_start",
        "migrations",
        "plan",
        "preemptions",
        "progress",
        "rate",
        "reason",
        "resizes",
        "setup_s",
        "since",
        "spec",
        "state",
    )

    def __init__(self, spec: JobSpec, key: int) -> None:
        self.spec = spec
        self.job_id = spec.job_id  # copied out of the spec: read in every hot loop
        self.gpus = spec.gpus
        self.key = key  # submission order number, dense and stable for the run (ties in queue orders)
        self.state = JobState.PENDING
        self.allocation: Allocation | None = None
        self.plan: ParallelPlan | None = None
        self.rate = 0.0  # observed throughput (reference s of work per s); 0 while not running
        self.since = spec.submit_time  # when `rate` and `progress` were last reported
        self.progress = 0.0  # work done by `since`, as last reported (reference seconds)
        self.first_start: float | None = None  # GPUs first committed to a launch that succeeded
        self.last_start: float | None = None  # GPUs last committed (start, resume, migrate, resize)
        self.end_time: float | None = None
        self.preemptions = 0
        self.migrations = 0
        self.resizes = 0
        self.failures = 0  # infrastructure failures and hangs it went through
        self.gpu_seconds = 0.0  # GPU time held (kept up to date at every allocation change)
        self.held_since = 0.0  # when the current allocation's GPU time was last counted
        self.setup_s = 0.0  # time spent STARTING (launches: image pull, model and data load)
        self.reason = ""
        self.diagnosis: str | None = None  # why its last failure happened, when a diagnosis ran

    def __repr__(self) -> str:
        return f"Job({self.spec.job_id!r}, {self.state.name}, gpus={self.spec.gpus})"
