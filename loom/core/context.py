"""What a policy sees in a scheduling round, in either world."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from loom.core.jobs import Job
from loom.core.protocols import Placer
from loom.core.releases import ReleaseIndex
from loom.hardware.state import Allocation, ClusterState
from loom.hardware.topology import Topology


@dataclass(frozen=True, slots=True)
class Reservation:
    reservation_id: int
    nodes: tuple[int, ...]
    until: float
    for_job: str


def oracle_runtime(job: Job) -> float:
    """Remaining work at the requested size: the trace's own duration (an oracle)."""
    return job.remaining


@dataclass(slots=True)
class SchedulingContext:
    """Live view for policies. The backend owns and updates it; policies only
    read it (their changes go through a `RoundPlan` and come back as decisions).

    `pending` is in queue order (arrival, preempted jobs rejoin at the back);
    `releases` lists running jobs by expected end (for shadow times);
    `runtime_estimate(job)` is the scheduler's belief of a job's remaining run
    time at its requested size: the oracle in simulation by default, a
    predictor later.
    """

    topology: Topology
    state: ClusterState
    placer: Placer
    pending: dict[str, Job]
    running: dict[str, Job]
    announced: dict[str, Job]
    reservations: dict[int, Reservation]
    runtime_estimate: Callable[[Job], float] = oracle_runtime
    releases: ReleaseIndex = field(default_factory=ReleaseIndex)
    now: float = 0.0
    next_reservation_id: int = 0
    spare_reservation: int | None = None  # hot spares: only preemptible jobs may use them
    held: dict[str, Allocation] = field(default_factory=dict)  # recovering jobs' surviving GPUs (idle)

    def expected_end(self, job: Job) -> float:
        """When a running job is expected to end, by the runtime estimate."""
        if job.rate <= 0:
            return float("inf")
        done = job.rate * (self.now - job.since)
        left = max(0.0, self.runtime_estimate(job) - done)
        return self.now + left / job.rate

    def reservation_for(self, job_id: str) -> int | None:
        """The reservation whose nodes `job_id` may use besides unreserved ones (hot spares
        for a preemptible job without a reservation of its own)."""
        for rid, res in self.reservations.items():
            if res.for_job == job_id:
                return rid
        if self.spare_reservation is not None:
            job = self.pending.get(job_id) or self.running.get(job_id)
            if job is not None and job.spec.preemptible:
                return self.spare_reservation
        return None
