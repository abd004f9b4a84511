"""Runtime record of a job, shared by the simulator and the live service.

Policies read these; only a backend writes them. Work is measured in
"reference seconds": a job with rate 1 finishes its work in `spec.duration`.
"""

from __future__ import annotations

from enum import IntEnum

from loom.core.plan import ParallelPlan
from loom.hardware.state import Allocation
from loom.workload.job import JobSpec


class JobState(IntEnum):
    ANNOUNCED = 0  # known ahead of submission, not yet queued
    PENDING = 1
    RUNNING = 2
    FINISHED = 3
    REJECTED = 4  # can never run here (e.g. larger than the cluster)
    FAILED = 5  # ended by a job-level error (script, framework): terminal
    RECOVERING = 6  # hit by a failure, out of the queue while recovery runs (ctx.held: its survivors)


class Job:
    __slots__ = (
        "spec", "job_id", "gpus", "key", "state", "allocation", "plan", "remaining", "rate", "since",
        "first_start", "last_start", "end_time", "preemptions", "migrations", "resizes", "failures",
        "gpu_seconds", "finish_version", "reason",
    )

    def __init__(self, spec: JobSpec, key: int) -> None:
        self.spec = spec
        self.job_id = spec.job_id  # copied out of the spec: read in every hot loop
        self.gpus = spec.gpus
        self.key = key  # dense index, stable for the run
        self.state = JobState.PENDING
        self.allocation: Allocation | None = None
        self.plan: ParallelPlan | None = None
        self.remaining = float(spec.duration or 0.0)
        self.rate = 0.0
        self.since = spec.submit_time  # time `remaining` was last brought up to date
        self.first_start: float | None = None
        self.last_start: float | None = None
        self.end_time: float | None = None
        self.preemptions = 0
        self.migrations = 0
        self.resizes = 0
        self.failures = 0  # times evicted by a node failure
        self.gpu_seconds = 0.0
        self.finish_version = 0
        self.reason = ""

    def remaining_at(self, now: float) -> float:
        """Work left at `now` given the current rate (no side effects)."""
        if self.state is not JobState.RUNNING:
            return self.remaining
        return max(0.0, self.remaining - self.rate * (now - self.since))

    def expected_end(self, now: float) -> float:
        """When the job would finish at its current rate (inf if stalled)."""
        if self.state is not JobState.RUNNING or self.rate <= 0:
            return float("inf")
        return now + self.remaining_at(now) / self.rate

    def __repr__(self) -> str:
        return f"Job({self.spec.job_id!r}, {self.state.name}, gpus={self.spec.gpus})"
