"""The simulated backend: applies decisions to the cluster state and jobs,
keeping each job's progress exact between events (piecewise-constant rates)."""

from __future__ import annotations

from loom.core.context import Reservation, SchedulingContext
from loom.core.decisions import (
    Decision,
    Migrate,
    Preempt,
    Release,
    Reserve,
    Resize,
    Resume,
    Start,
    Timer,
)
from loom.core.jobs import Job, JobState
from loom.core.protocols import SpeedModel
from loom.hardware.state import Allocation, ClusterState
from loom.sim.events import EventKind, EventQueue
from loom.sim.interruptions import Interruptions
from loom.workload.job_failures import FailurePlan


class DecisionError(RuntimeError):
    """A policy returned a decision that cannot be applied: a bug in the policy."""


class SimBackend:
    def __init__(self, ctx: SchedulingContext, jobs: dict[str, Job], speed: SpeedModel, events: EventQueue,
                 log: list[tuple[float, Decision]] | None, interruptions: Interruptions | None = None) -> None:
        self.ctx = ctx
        self.interruptions = interruptions  # None: pauses are the policies' own (`pause_s`)
        self.failure_plans: dict[int, list[FailurePlan]] = {}  # job key → job-level failures ahead
        self.state: ClusterState = ctx.state
        self.jobs = jobs
        self.speed = speed
        self.events = events
        self.log = log
        self.busy_gpu_seconds = 0.0

    # --------------------------------------------------------------- apply
    def apply(self, decisions: list[Decision], now: float) -> None:
        """Apply in order, logging each before its consequences (e.g. a reservation
        released because its job started)."""
        for d in decisions:
            handler = _HANDLERS.get(type(d))
            if handler is None:
                raise DecisionError(f"unknown decision type {type(d).__name__}")
            if self.log is not None:
                self.log.append((now, d))
            handler(self, d, now)

    def _job(self, job_id: str, *expected: JobState) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise DecisionError(f"decision names unknown job '{job_id}'")
        if job.state not in expected:
            raise DecisionError(f"job '{job_id}' is {job.state.name}, expected {'/'.join(s.name for s in expected)}")
        return job

    def _start(self, d: Start | Resume, now: float) -> None:
        job = self._job(d.job_id, JobState.PENDING)
        self.state.allocate(d.allocation)
        del self.ctx.pending[job.job_id]
        self.ctx.running[job.job_id] = job
        job.state = JobState.RUNNING
        job.plan = d.plan
        primitive = "start" if job.first_start is None else "resume"
        if job.first_start is None:
            job.first_start = now
        self._run_on(job, d.allocation, now, primitive=primitive)
        for rid in [r.reservation_id for r in self.ctx.reservations.values() if r.for_job == job.job_id]:
            self.apply([Release(rid, f"job {job.job_id} started: its reservation is used up")], now)

    def _preempt(self, d: Preempt, now: float) -> None:
        job = self._job(d.job_id, JobState.RUNNING)
        self._end_segment(job, now, "preempt")
        self.stop(job, now)
        job.preemptions += 1
        job.state = JobState.PENDING
        self.ctx.pending[job.job_id] = job

    def _migrate(self, d: Migrate | Resize, now: float) -> None:
        job = self._job(d.job_id, JobState.RUNNING)
        if isinstance(d, Migrate) and d.allocation.total != job.allocation.total:  # type: ignore[union-attr]
            raise DecisionError(f"migrate of '{job.job_id}' changes its GPU count; use Resize")
        self._settle(job, now)
        self._end_segment(job, now, "move")
        before = job.allocation
        self.state.release(before)  # type: ignore[arg-type]
        self.state.allocate(d.allocation)
        if isinstance(d, Resize):
            job.resizes += 1
            job.plan = d.plan or job.plan
        else:
            job.migrations += 1
        if d.pause_s < 0:
            raise DecisionError(f"negative pause for '{job.job_id}'")
        self._run_on(job, d.allocation, now, d.pause_s, "resize" if isinstance(d, Resize) else "migrate", before)

    def _reserve(self, d: Reserve, now: float) -> None:
        if d.reservation_id in self.ctx.reservations:
            raise DecisionError(f"reservation {d.reservation_id} already exists")
        self.state.reserve(d.nodes, d.reservation_id)
        self.ctx.reservations[d.reservation_id] = Reservation(
            d.reservation_id, d.nodes, d.until, d.for_job)
        self.ctx.next_reservation_id = max(self.ctx.next_reservation_id, d.reservation_id + 1)
        self.events.push(d.until, EventKind.TIMER, ("expire", d.reservation_id))

    def _release(self, d: Release, now: float) -> None:
        if self.ctx.reservations.pop(d.reservation_id, None) is None:
            raise DecisionError(f"no reservation {d.reservation_id} to release")
        self.state.unreserve(d.reservation_id)

    def _timer(self, d: Timer, now: float) -> None:
        if d.at < now:
            raise DecisionError(f"timer in the past ({d.at} < {now})")
        self.events.push(d.at, EventKind.TIMER, ("wake", None))

    # ------------------------------------------------------------ progress
    def _run_on(self, job: Job, alloc: Allocation, now: float, pause_s: float = 0.0, primitive: str | None = None,
                before: Allocation | None = None, hold_s: float = 0.0) -> None:
        """Run `job` on `alloc` from `now`. With an interruption model the `primitive` that put it
        there (start, resume, migrate, resize) is priced by it and `pause_s` is ignored."""
        rate = self.speed.rate(job, alloc, self.ctx.topology)
        if not rate > 0:
            raise DecisionError(f"speed model gave rate {rate} for job '{job.job_id}'")
        if self.interruptions is not None and primitive is not None:
            pause_s, divisor = self.interruptions.on_run(job, alloc, now, primitive, rate, before, hold_s)
            rate /= divisor  # time-slicing overhead
        if job.key in self.failure_plans:
            self._plan_failure(job, now, rate, pause_s)
        job.remaining += rate * pause_s  # a pause costs as much work as it lasts, on the GPUs held
        job.allocation = alloc
        job.rate = rate
        job.since = now
        job.last_start = now
        job.finish_version += 1
        self.events.push(now + job.remaining / rate, EventKind.FINISH, (job.key, job.finish_version))
        self.ctx.releases.add(job.key, self.ctx.expected_end(job), alloc.total)

    def _plan_failure(self, job: Job, now: float, rate: float, extra_s: float) -> None:
        """Schedule the job's next job-level failure: when its progress reaches the plan's
        threshold on this run segment (pause and checkpoint stalls on the way count as time)."""
        plans = self.failure_plans[job.key]
        if not plans:
            return
        done = (job.spec.duration or 0.0) - job.remaining  # `remaining` holds no charges yet
        wall = max(0.0, plans[0].at_progress_s - done) / rate
        at = now + extra_s + wall
        if self.interruptions is not None:
            seg = self.interruptions.segments.get(job.key)
            if seg is not None:  # stalls are spread over the segment, the pause comes first
                passed = min(seg.checkpoints, int(wall // self.interruptions.interval))
                at = seg.progress_from + wall + passed * seg.stall_s
        self.events.push(at, EventKind.JOB_FAILURE, (job.key, job.finish_version + 1))

    def terminate(self, job: Job, now: float, reason: str) -> None:
        """A job-level error ends the job for good (its GPU time so far is wasted; nothing is redone)."""
        self._end_segment(job, now, "terminate")
        self.stop(job, now)
        job.state = JobState.FAILED
        job.end_time = now
        job.reason = reason

    def hang(self, job: Job, now: float, watchdog_s: float) -> None:
        """The job stopped progressing at `now`; the watchdog notices `watchdog_s` later and it
        restarts in place from its last checkpoint (the GPUs stay held meanwhile)."""
        self._end_segment(job, now, "failure")
        self._settle(job, now)
        self._run_on(job, job.allocation, now, watchdog_s, "resume", hold_s=watchdog_s)  # type: ignore[arg-type]

    def _settle(self, job: Job, now: float) -> None:
        """Bring `remaining` and GPU-seconds up to `now` before the rate or allocation changes."""
        elapsed = now - job.since
        job.remaining = max(0.0, job.remaining - job.rate * elapsed)
        gpu_s = elapsed * job.allocation.total  # type: ignore[union-attr]
        job.gpu_seconds += gpu_s
        self.busy_gpu_seconds += gpu_s
        job.since = now

    def stop(self, job: Job, now: float) -> None:
        """Take a running job off its GPUs (preemption, failure), keeping its progress."""
        self._settle(job, now)
        self.state.release(job.allocation)  # type: ignore[arg-type]
        del self.ctx.running[job.job_id]
        self.ctx.releases.remove(job.key)
        job.rate = 0.0
        job.finish_version += 1

    def _end_segment(self, job: Job, now: float, cause: str) -> None:
        """Settle the job's checkpoint timeline: refund pause and stalls not reached, add back
        the progress a failure lost (interruption model only)."""
        if self.interruptions is None:
            return
        self._settle(job, now)
        unspent = self.interruptions.end_segment(job, now, cause)
        job.remaining = max(0.0, job.remaining - job.rate * unspent)

    def fail(self, job: Job, now: float) -> None:
        """A failure took the job down: it loses the work since its last durable checkpoint."""
        self._end_segment(job, now, "failure")
        self.stop(job, now)

    def finish(self, job: Job, now: float) -> None:
        self._end_segment(job, now, "finish")
        self._settle(job, now)
        job.remaining = 0.0
        self.state.release(job.allocation)  # type: ignore[arg-type]
        del self.ctx.running[job.job_id]
        self.ctx.releases.remove(job.key)
        job.state = JobState.FINISHED
        job.end_time = now
        job.rate = 0.0


_HANDLERS = {
    Start: SimBackend._start,
    Resume: SimBackend._start,
    Preempt: SimBackend._preempt,
    Migrate: SimBackend._migrate,
    Resize: SimBackend._migrate,
    Reserve: SimBackend._reserve,
    Release: SimBackend._release,
    Timer: SimBackend._timer,
}
