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


def spec_runtime(job: Job) -> float:
    """Remaining run time at the requested size from the spec's duration and the progress the
    backend last reported (the simulator plugs in its exact ledger instead: an oracle)."""
    return max(0.0, (job.spec.duration or 0.0) - job.progress)


@dataclass(slots=True)
class SchedulingContext:
    """Live view for policies. The backend owns and updates it; policies only
    read it (their changes go through a `RoundPlan` and come back as decisions).

    `pending` is in queue order (arrival, preempted jobs rejoin at the back);
    `running` holds RUNNING jobs; `starting` those whose launch is under way
    and `stopping` those asked to stop (neither may be moved; a starting job's
    GPUs are taken, a stopping job's are already given back);
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
    runtime_estimate: Callable[[Job], float] = spec_runtime
    releases: ReleaseIndex = field(default_factory=ReleaseIndex)
    now: float = 0.0
    next_reservation_id: int = 0
    spare_reservation: int | None = None  # hot spares: only preemptible jobs may use them
    held: dict[str, Allocation] = field(default_factory=dict)  # recovering jobs' surviving GPUs (idle)
    starting: dict[str, Job] = field(default_factory=dict)
    stopping: dict[str, Job] = field(default_factory=dict)

    def expected_end(self, job: Job) -> float:
        """When a running job is expected to end, by the runtime estimate."""
        if job.rate <= 0:
            return float("inf")
        done = job.rate * (self.now - job.since)
        left = max(0.0, self.runtime_estimate(job) - done)
        return self.now + left / job.rate

    def remaining_work(self, job: Job) -> float:
        """Work a job has left now by the runtime estimate and its reported rate."""
        return max(0.0, self.runtime_estimate(job) - job.rate * (self.now - job.since))

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
