"""The core: owns the job lifecycle, the cluster state and reservations, runs
policy rounds and hands decisions to a backend; turns what the backend
reports into lifecycle transitions.

The same object drives the simulator (`loom.sim.engine`) and the live
service: it knows nothing of which world it is in. A world feeds it

* jobs (`add`, `announce`, `submit`, `cancel`),
* observations and answers (`observe(event)`, see `loom.core.events`),
* scheduling rounds (`round(now)`) when something changed,

and the core answers with decisions sent to `backend.apply` and timers set
through `backend.set_timer`. Everything it did is in `record`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Sequence
from time import perf_counter
from typing import Any

from loom.core.backend import Backend, InventoryChanged
from loom.core.context import Reservation, SchedulingContext, spec_runtime
from loom.core.decisions import (
    Cancel,
    Decision,
    Diagnose,
    Localize,
    Migrate,
    Preempt,
    Release,
    Reserve,
    Resize,
    Resume,
    Start,
    Timer,
)
from loom.core.events import (
    DecisionAccepted,
    DecisionDone,
    DecisionFailed,
    Event,
    FaultsLocalized,
    JobDiagnosed,
    JobFailed,
    JobFinished,
    JobProgress,
    JobRestarted,
    JobStarted,
    JobStopped,
    NodeDown,
    NodeDrained,
    NodeUp,
    TimerFired,
)
from loom.core.jobs import Job
from loom.core.lifecycle import TERMINAL, TRANSITIONS, IllegalTransition, JobState
from loom.core.protocols import Placer, Policy
from loom.core.record import NodeEventRecord, RunRecord
from loom.errors import LoomInputError
from loom.hardware.state import DRAINED, NO_RESERVATION, Allocation, ClusterState
from loom.workload.job import JobSpec

S = JobState
# members bound once: enum attribute lookups are slow in the simulator's hot loop
ANNOUNCED, PENDING, STARTING, RUNNING, STOPPING, SUSPENDED, RECOVERING, FINISHED = (
    S.ANNOUNCED, S.PENDING, S.STARTING, S.RUNNING, S.STOPPING, S.SUSPENDED, S.RECOVERING, S.FINISHED)


class DecisionError(RuntimeError):
    """A policy returned a decision that cannot be applied: a bug in the policy."""


class Scheduler:
    def __init__(self, backend: Backend, policy: Policy, placer: Placer, *,
                 runtime_estimate: Callable[[Job], float] | None = None, recovery: Any = None,
                 log_decisions: bool = True) -> None:
        inventory = backend.inventory()
        self.topology, self.generation = inventory.topology, inventory.generation
        self.backend = backend
        self.policy = policy
        self.ctx = SchedulingContext(self.topology, ClusterState(self.topology), placer, {}, {}, {}, {},
                                     runtime_estimate=runtime_estimate or spec_runtime)
        self.record = RunRecord(log_decisions)
        self._log = self.record.transitions.add
        coder = self.record.transitions.coder  # the transitions every job makes, pre-coded
        self._at, self._code, self._started_code = coder(STARTING, RUNNING, "JobStarted")
        self._finished_code = coder(RUNNING, FINISHED, "JobFinished")[2]
        self._start_code = {s: coder(s, STARTING, "start decision")[2] for s in _STARTABLE}  # by old state
        self._resume_code = {s: coder(s, STARTING, "resume decision")[2] for s in _STARTABLE}
        self.jobs: dict[str, Job] = {}
        self.rejected: dict[str, str] = {}
        self.busy_gpu_seconds = 0.0
        self.round_seconds: list[float] = []  # wall seconds of each policy round (decision latency)
        self.round_queue: list[int] = []  # pending-queue length each round saw
        self._inflight: dict[int, Decision] = {}  # decisions sent to the backend, not yet answered, by ticket
        self._first_launch: set[str] = set()  # jobs whose launch under way is their first
        self._launch: dict[str, int] = {}  # job → ticket of its launch under way
        self._cancelling: set[str] = set()
        self._next_ticket = 0
        self._capacity: dict[tuple[str, ...] | str | None, int] = {}
        self.recovery = None
        if recovery is not None:
            from loom.core.recovery import Recovery

            self.recovery = Recovery(recovery, self)
        self._observers: dict[type, Callable[[Any], None]] = {
            JobStarted: self._on_started, JobProgress: self._on_progress, JobStopped: self._on_stopped,
            JobFinished: self._on_finished, JobFailed: self._on_failed, JobRestarted: self._on_restarted,
            NodeDown: self._on_node_down, NodeUp: self._on_node_up, NodeDrained: self._on_node_drained,
            DecisionAccepted: _ignore, DecisionDone: self._on_done, DecisionFailed: self._on_decision_failed,
            TimerFired: self._on_timer, InventoryChanged: self._on_inventory,
            JobDiagnosed: self._on_step, FaultsLocalized: self._on_step,
        }
        self._issuers: dict[type, Callable[[Any, float], None]] = {
            Start: self._start, Resume: self._start, Preempt: self._stop, Cancel: self._stop,
            Migrate: self._move, Resize: self._move, Reserve: self._reserve, Release: self._release,
            Timer: self._timer, Diagnose: self._ask, Localize: self._ask,
        }
        observers = self._observers

        def sink(event: Event) -> None:  # `observe`, with the handler table bound once
            observers[type(event)](event)

        sink.handlers = observers  # type: ignore[attr-defined]  # see `loom.core.backend.handler_for`
        self.sink = sink  # what the backend reports to (a harness may wrap it and bind the wrapper)
        backend.bind(sink)

    @property
    def unanswered(self) -> list[Decision]:
        """Decisions handed to the backend that it has not answered yet."""
        return list(self._inflight.values())

    # ------------------------------------------------------------------ jobs in
    def add(self, spec: JobSpec) -> Job:
        """Learn of a job (numbered in the order jobs are added); it waits for `submit`."""
        if spec.job_id in self.jobs:
            raise LoomInputError(f"job id '{spec.job_id}' is already known; job ids must be unique",
                                 field="job_id")
        job = self.jobs[spec.job_id] = Job(spec, len(self.jobs))
        self.record.ids.append(spec.job_id)
        if spec.announce_time is not None:
            job.state = S.ANNOUNCED
        return job

    def add_all(self, specs: Sequence[JobSpec]) -> list[Job]:
        """`[self.add(spec) for spec in specs]`, in bulk (a whole trace at once)."""
        ids = [spec.job_id for spec in specs]
        known = self.jobs
        if len(set(ids)) != len(ids) or (known and not known.keys().isdisjoint(ids)):
            return [self.add(spec) for spec in specs]  # a duplicate: `add` raises at its first repeat
        first = len(known)
        enabled = gc.isenabled()
        gc.disable()  # 100k new jobs would set off many collections, none of which finds garbage
        try:
            jobs = [Job(spec, key) for key, spec in enumerate(specs, first)]
        finally:
            if enabled:
                gc.enable()
        known.update(zip(ids, jobs))
        self.record.ids.extend(ids)
        for job in jobs:
            if job.spec.announce_time is not None:
                job.state = S.ANNOUNCED
        return jobs

    def announce(self, job: Job) -> None:
        """A planned job becomes visible to policies ahead of its submission (for reservations)."""
        self.ctx.announced[job.job_id] = job

    def submit(self, job: Job, at: float) -> bool:
        """The job enters the queue, or is rejected if no pool of one GPU type could ever hold it
        (False also for a job withdrawn before it arrived)."""
        if job.state in TERMINAL:
            return False
        if self.ctx.announced:
            self.ctx.announced.pop(job.job_id, None)
        spec = job.spec
        key = spec.gpu_types or spec.gpu_type  # the cache key: no tuple built per job
        capacity = self._capacity.get(key)
        if capacity is None:
            kinds = spec.gpu_types or (spec.gpu_type,)
            capacity = self._capacity[key] = max(self.topology.max_gpus_of_type(k) for k in kinds)
        if spec.gpus > capacity:
            kinds = spec.gpu_types or (spec.gpu_type,)
            pool = (f"{'/'.join(k for k in kinds if k)} GPUs of one type" if kinds != (None,)
                    else "GPUs of one type (jobs never span types)")
            self.reject(job, f"asks for {spec.gpus} GPUs; the cluster has at most {capacity} {pool}", at)
            return False
        if job.state is ANNOUNCED:
            self._to(job, PENDING, "submitted", at)
        job.since = at
        self.ctx.pending[job.job_id] = job
        return True

    def adopt(self, job: Job, allocation: Allocation, at: float, *, progress: float | None = None,
              rate: float | None = None, first_start: float | None = None) -> None:
        """Take over a job the backend is already running on `allocation` (a live service restarted
        while its jobs kept running): it becomes RUNNING there with no start decision, so it is
        never launched twice. For a job that is waiting (PENDING, SUSPENDED, or ANNOUNCED: a job
        re-added after the restart); its GPUs must be free (else `AllocationError`, a reconciliation
        bug). Recorded as two transitions (through STARTING, the lifecycle's only way to RUNNING)
        whose event says it was adopted. `first_start`: when it first started, if known (else `at`)."""
        if job.state not in (PENDING, SUSPENDED, ANNOUNCED):
            raise DecisionError(f"cannot adopt job '{job.job_id}': it is {job.state.name}, "
                                "expected PENDING/SUSPENDED/ANNOUNCED")
        ctx = self.ctx
        ctx.state.allocate(allocation)
        ctx.pending.pop(job.job_id, None)
        ctx.announced.pop(job.job_id, None)
        if job.state is ANNOUNCED:
            self._to(job, PENDING, "submitted", at)
        self._to(job, STARTING, "adopted: found running", at)
        self._to(job, RUNNING, "adopted", at)
        job.allocation, job.held_since, job.last_start, job.since = allocation, at, at, at
        if job.first_start is None:
            job.first_start = first_start if first_start is not None else at
        if rate is not None:  # as for JobStarted: the rate and progress the backend knows
            job.rate = rate
        if progress is not None:
            job.progress = progress
        ctx.running[job.job_id] = job
        ctx.releases.add(job.key, ctx.expected_end(job), allocation.total)

    def reject(self, job: Job, reason: str, at: float) -> None:
        self.ctx.announced.pop(job.job_id, None)
        self._to(job, S.REJECTED, "rejected on submission", at)
        job.reason = reason
        self.rejected[job.job_id] = reason

    def cancel(self, job_id: str, reason: str, at: float) -> bool:
        """Withdraw a job; False if it had already ended. A job holding GPUs stops first."""
        job = self.jobs.get(job_id)
        if job is None or job.state in (S.FINISHED, S.FAILED, S.REJECTED, S.CANCELLED):
            return False
        if job.state in (S.STARTING, S.RUNNING):
            self.issue([Cancel(job_id, reason)], at)
        elif job.state is S.STOPPING:
            self._cancelling.add(job_id)
        else:
            if job.state is S.RECOVERING and self.recovery is not None:
                self.recovery.forget(job, at)
            self.ctx.pending.pop(job_id, None)
            self.ctx.announced.pop(job_id, None)
            self._end(job, S.CANCELLED, f"cancelled: {reason}", at)
        return True

    def close(self) -> RunRecord:
        """End of the run: the policy's own counters (e.g. reservation violations) go into the record,
        so reports read the record and never the policy object."""
        from dataclasses import asdict, is_dataclass

        summary_stats = getattr(self.policy, "summary_stats", None)
        stats = summary_stats() if callable(summary_stats) else getattr(self.policy, "stats", None)
        if is_dataclass(stats) and not isinstance(stats, type):
            stats = asdict(stats)
        self.record.policy_name = getattr(self.policy, "name", type(self.policy).__name__)
        if isinstance(stats, dict):
            self.record.policy_stats = {str(k): {str(a): b for a, b in v.items()} if isinstance(v, dict) else v
                                        for k, v in stats.items()}
        return self.record

    # ------------------------------------------------------------------ rounds
    def round(self, now: float) -> list[Decision]:
        """One scheduling round: ask the policy, carry out what it decided."""
        ctx = self.ctx
        ctx.now = now
        tick = perf_counter()
        decisions = self.policy.schedule(ctx)
        self.round_seconds.append(perf_counter() - tick)
        self.round_queue.append(len(ctx.pending))
        if decisions:
            self.issue(decisions, now)
        self.record.transitions.compact()
        return decisions

    def issue(self, decisions: Iterable[Decision], at: float) -> None:
        """Check, record and carry out decisions in order (each logged before its consequences,
        e.g. a reservation released because its job started)."""
        record, issuers = self.record, self._issuers
        log = record.decisions if record.log_decisions else None
        for d in decisions:
            try:
                issuer = issuers[type(d)]
            except KeyError:
                raise DecisionError(f"unknown decision type {type(d).__name__}") from None
            if log is not None:
                log.append((at, d))
            issuer(d, at)

    def _job(self, job_id: str, *expected: JobState) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise DecisionError(f"decision names unknown job '{job_id}'")
        if job.state not in expected:
            raise DecisionError(f"job '{job_id}' is {job.state.name}, expected {'/'.join(s.name for s in expected)}")
        return job

    def _send(self, d: Decision, job: Job, at: float) -> None:
        """Hand a job decision to the backend under a new ticket (its answer may come back at once)."""
        ticket = self._next_ticket = self._next_ticket + 1
        self._inflight[ticket] = d
        self.backend.apply(d, ticket, at)

    def _start(self, d: Start | Resume, at: float) -> None:
        job = self.jobs.get(d.job_id)
        if job is None or job.state not in _STARTABLE:
            self._job(d.job_id, PENDING, SUSPENDED, RECOVERING)  # raises, naming what is wrong
        ctx, job_id = self.ctx, d.job_id
        ctx.state.allocate(d.allocation)
        ctx.pending.pop(job_id, None)
        ran_before = job.first_start is not None
        old = job.state
        job.state = STARTING  # _to, inlined (every job passes here): all of _STARTABLE may go to STARTING
        self._at(at)
        self._code(job.key << 32 | (self._resume_code if ran_before else self._start_code)[old])
        job.allocation, job.plan, job.held_since, job.last_start = d.allocation, d.plan, at, at
        if not ran_before:
            job.first_start = at
        ctx.starting[job_id] = job
        ticket = self._next_ticket = self._next_ticket + 1  # _send, inlined: every job passes here
        self._inflight[ticket] = d
        self.backend.apply(d, ticket, at)
        if job.state is STARTING and job.allocation is d.allocation:  # not up yet: a launch under way
            self._launch[job_id] = ticket
            if not ran_before:
                self._first_launch.add(job_id)
            # its GPUs come back no sooner than its work is done
            ctx.releases.add(job.key, at + ctx.runtime_estimate(job), d.allocation.total)
        if ctx.reservations:
            for rid in [r.reservation_id for r in ctx.reservations.values() if r.for_job == job_id]:
                self.issue([Release(rid, f"job {job_id} started: its reservation is used up")], at)

    def _stop(self, d: Preempt | Cancel, at: float) -> None:
        job = self._job(d.job_id, S.RUNNING, S.STARTING)
        self._take_off(job, at)
        if isinstance(d, Cancel):
            self._cancelling.add(job.job_id)
        else:
            job.preemptions += 1
        self._to(job, S.STOPPING, f"{type(d).__name__.lower()} decision", at)
        self.ctx.stopping[job.job_id] = job
        self._send(d, job, at)

    def _move(self, d: Migrate | Resize, at: float) -> None:
        job = self._job(d.job_id, S.RUNNING)
        before = job.allocation
        assert before is not None
        if isinstance(d, Migrate) and d.allocation.total != before.total:
            raise DecisionError(f"migrate of '{job.job_id}' changes its GPU count; use Resize")
        if d.pause_s < 0:
            raise DecisionError(f"negative pause for '{job.job_id}'")
        self._count_gpu_time(job, at)
        state = self.ctx.state
        state.release(before)
        state.allocate(d.allocation)
        job.allocation, job.last_start = d.allocation, at
        job.plan = d.plan  # a plan is tuned for its GPUs: it never outlives them
        if isinstance(d, Resize):
            job.resizes += 1
        else:
            job.migrations += 1
        self._send(d, job, at)

    def _reserve(self, d: Reserve, at: float) -> None:
        ctx = self.ctx
        if d.reservation_id in ctx.reservations:
            raise DecisionError(f"reservation {d.reservation_id} already exists")
        ctx.state.reserve(d.nodes, d.reservation_id)
        ctx.reservations[d.reservation_id] = Reservation(d.reservation_id, d.nodes, d.until, d.for_job)
        ctx.next_reservation_id = max(ctx.next_reservation_id, d.reservation_id + 1)
        self.backend.set_timer(d.until, ("expire", d.reservation_id))

    def _release(self, d: Release, at: float) -> None:
        if self.ctx.reservations.pop(d.reservation_id, None) is None:
            raise DecisionError(f"no reservation {d.reservation_id} to release")
        self.ctx.state.unreserve(d.reservation_id)

    def _timer(self, d: Timer, at: float) -> None:
        if d.at < at:
            raise DecisionError(f"timer in the past ({d.at} < {at})")
        self.backend.set_timer(d.at, ("wake", None))

    # ------------------------------------------------------------------ events in
    def observe(self, event: Event) -> None:
        """Apply one backend event (the backend's sink)."""
        self._observers[type(event)](event)

    def _expecting(self, job_id: str, *states: JobState) -> Job | None:
        """The job if it is in one of `states`; None (a stale observation, counted) otherwise."""
        job = self.jobs.get(job_id)
        if job is None or job.state not in states:
            self.record.stale_events += 1
            return None
        return job

    def _on_started(self, ev: JobStarted) -> None:
        # the simulator's hot path: the lookups of _answered, _expecting, _to and _report inlined
        job_id, at, rate, progress, ticket = ev  # unpacked at once: named-tuple field reads are slow
        if ticket is not None and self._inflight.pop(ticket, None) is None:
            self.record.stale_events += 1
        job = self.jobs.get(job_id)
        if job is None or job.state is not STARTING:
            self.record.stale_events += 1
            return
        ctx = self.ctx
        del ctx.starting[job_id]
        if self._launch:  # a launch that did not come up at once
            self._launch.pop(job_id, None)
            self._first_launch.discard(job_id)
        job.setup_s += at - job.last_start  # type: ignore[operator]
        job.state = RUNNING
        self._at(at)
        self._code(job.key << 32 | self._started_code)
        ctx.running[job_id] = job
        if rate is not None:
            job.rate = rate
        if progress is not None:
            job.progress = progress
        job.since = at
        # ctx.expected_end(job), inlined: once per start
        rate, now = job.rate, ctx.now
        if rate <= 0:
            end = float("inf")
        else:
            left = ctx.runtime_estimate(job) - rate * (now - at)
            end = now + max(0.0, left) / rate
        ctx.releases.add(job.key, end, job.allocation.total)  # type: ignore[union-attr]

    def _on_progress(self, ev: JobProgress) -> None:
        if ev.ticket is not None:
            self._answered(ev.ticket)
        job = self._expecting(ev.job_id, RUNNING)
        if job is not None:
            self._report(job, ev.at, ev.rate, ev.progress)

    def _on_restarted(self, ev: JobRestarted) -> None:
        job = self._expecting(ev.job_id, S.RUNNING)
        if job is None:
            return
        job.failures += 1
        job.last_start = ev.at
        self._log(ev.at, job.key, RUNNING, RUNNING, f"restarted in place: {ev.cause}")
        self._report(job, ev.at, ev.rate, ev.progress)

    def _report(self, job: Job, at: float, rate: float | None, progress: float | None) -> None:
        if rate is not None:
            job.rate = rate
        if progress is not None:
            job.progress = progress
        job.since = at
        self.ctx.releases.add(job.key, self.ctx.expected_end(job), job.allocation.total)  # type: ignore[union-attr]

    def _on_stopped(self, ev: JobStopped) -> None:
        if ev.ticket is not None:
            self._answered(ev.ticket)
        job = self._expecting(ev.job_id, STOPPING)
        if job is None:
            return
        del self.ctx.stopping[job.job_id]
        if ev.progress is not None:
            job.progress = ev.progress
        if job.job_id in self._cancelling:
            self._cancelling.discard(job.job_id)
            self._end(job, S.CANCELLED, "JobStopped (cancelled)", ev.at)
            return
        # back of the queue; a job stopped before its first launch came up never ran
        self._to(job, S.SUSPENDED if job.first_start is not None else PENDING, "JobStopped", ev.at)
        self.ctx.pending[job.job_id] = job

    def _on_finished(self, ev: JobFinished) -> None:
        job_id, at, progress = ev
        job = self.jobs.get(job_id)
        old = job.state if job is not None else None
        if old is RUNNING:  # the simulator's hot path: _take_off and _end inlined
            ctx = self.ctx
            alloc = job.allocation
            gpu_s = (at - job.held_since) * alloc.total  # type: ignore[union-attr]
            job.gpu_seconds += gpu_s
            self.busy_gpu_seconds += gpu_s
            job.held_since = at
            ctx.state.release(alloc)  # type: ignore[arg-type]
            del ctx.running[job_id]
            ctx.releases.remove(job.key)
            job.state, job.end_time, job.rate = FINISHED, at, 0.0
            if progress is not None:
                job.progress = progress
            self._at(at)
            self._code(job.key << 32 | self._finished_code)
        elif old is STOPPING:
            del self.ctx.stopping[job.job_id]  # type: ignore[union-attr]
            self._cancelling.discard(job.job_id)  # type: ignore[union-attr]
            self._end(job, FINISHED, "JobFinished", ev.at)  # type: ignore[arg-type]
        else:
            self.record.stale_events += 1

    def _on_failed(self, ev: JobFailed) -> None:
        job = self._expecting(ev.job_id, S.RUNNING, S.STARTING, S.STOPPING)
        if job is None:
            return
        if job.state is S.STARTING:
            self._launch_failed(job, ev.at, ev.cause)
            return
        if job.state is S.STOPPING:  # it died while stopping: it stopped, from its last checkpoint
            self._on_stopped(JobStopped(job.job_id, ev.at, ev.progress))
            return
        self._take_off(job, ev.at)
        if ev.progress is not None:
            job.progress = ev.progress
        if ev.fatal and not (ev.diagnose and self.recovery is not None):
            self._end(job, S.FAILED, f"JobFailed: {ev.cause}", ev.at)
            job.reason = ev.cause
            return
        job.failures += 1
        if self.recovery is not None:
            self.recovery.job_failed(job, ev.nodes, ev.at, ev.cause, diagnose=ev.diagnose)
        else:
            self._to(job, S.SUSPENDED, f"JobFailed: {ev.cause}", ev.at)
            self.ctx.pending[job.job_id] = job

    def _launch_failed(self, job: Job, at: float, reason: str) -> None:
        """A launch did not come up: free its GPUs, put the job back at the head of the queue."""
        self._launch.pop(job.job_id, None)
        ran_before = job.job_id not in self._first_launch
        self._first_launch.discard(job.job_id)
        del self.ctx.starting[job.job_id]
        self.ctx.releases.remove(job.key)
        self._release_gpus(job, at)
        job.setup_s += at - job.last_start  # type: ignore[operator]
        if not ran_before:
            job.first_start = None  # its first start never happened
        self._to(job, S.SUSPENDED if ran_before else S.PENDING, f"launch failed: {reason}", at)
        self._requeue_first(job)

    def _requeue_first(self, job: Job) -> None:
        pending = self.ctx.pending
        rest = dict(pending)
        pending.clear()
        pending[job.job_id] = job
        pending.update(rest)

    def _on_done(self, ev: DecisionDone) -> None:
        self._answered(ev.ticket)

    def _answered(self, ticket: int) -> None:
        if self._inflight.pop(ticket, None) is None:
            self.record.stale_events += 1

    def _on_decision_failed(self, ev: DecisionFailed) -> None:
        d = self._inflight.pop(ev.ticket, None)
        if d is None:
            self.record.stale_events += 1
            return
        job = self.jobs[d.job_id]  # type: ignore[union-attr]
        self.record.failed_decisions.append((ev.at, d, ev.reason))
        if isinstance(d, (Diagnose, Localize)):
            if self.recovery is not None:
                self.recovery.step_failed(job, d, ev.reason, ev.at)
            return
        if isinstance(d, (Start, Resume)):
            # the launch under way (or one answered before `apply` returned), not an older one
            if job.state is S.STARTING and self._launch.get(job.job_id, ev.ticket) == ev.ticket:
                self._launch_failed(job, ev.at, ev.reason)
        elif job.state is S.RUNNING:  # a move or stop that broke half-way: the job is gone
            self._on_failed(JobFailed(job.job_id, ev.at, f"{type(d).__name__} failed: {ev.reason}"))
        elif job.state is S.STOPPING:
            self._on_stopped(JobStopped(job.job_id, ev.at))

    def _ask(self, d: Diagnose | Localize, at: float) -> None:
        """A step of the recovery pipeline, for the backend to carry out (see `loom.core.recovery`)."""
        self._send(d, self._job(d.job_id, S.RECOVERING), at)

    def _on_step(self, ev: JobDiagnosed | FaultsLocalized) -> None:
        if ev.ticket is not None:
            self._answered(ev.ticket)
        job = self.jobs.get(ev.job_id)
        if job is None or self.recovery is None or not self.recovery.step_done(job, ev):
            self.record.stale_events += 1

    def _on_timer(self, ev: TimerFired) -> None:
        action, arg = ev.token
        if action == "expire" and arg in self.ctx.reservations:
            self.issue([Release(arg, "reservation reached its end time")], ev.at)
        elif action == "recover" and self.recovery is not None:
            self.recovery.ready(arg, ev.at)

    # ------------------------------------------------------------------ nodes
    def _on_node_down(self, ev: NodeDown) -> None:
        state, node = self.ctx.state, ev.node
        name = self.topology.node_names[node]
        self.record.node_events.append(NodeEventRecord(ev.at, name, "down", ev.cause))
        if state.failed[node]:
            return
        cause = f"node {name} failed" + (f": {ev.cause}" if ev.cause else "")
        # whatever still holds GPUs there lost them (a backend may report the node before its jobs)
        for job in [j for j in self.ctx.running.values() if node in j.allocation.nodes]:  # type: ignore[union-attr]
            self._on_failed(JobFailed(job.job_id, ev.at, cause, nodes=(node,)))
        for job in [j for j in self.ctx.starting.values() if node in j.allocation.nodes]:  # type: ignore[union-attr]
            self._launch_failed(job, ev.at, cause)
        if self.recovery is not None:
            self.recovery.node_down(node)
        state.fail_node(node)

    def _on_node_up(self, ev: NodeUp) -> None:
        state, node = self.ctx.state, ev.node
        self.record.node_events.append(NodeEventRecord(ev.at, self.topology.node_names[node], "up"))
        if state.reserved_by[node] == DRAINED:
            state.reserve([node], NO_RESERVATION)
        if state.failed[node]:
            state.repair_node(node)
        if self.recovery is not None:  # a node recovery cordoned or lost may become a hot spare now
            self.recovery.node_repaired(node)

    def _on_node_drained(self, ev: NodeDrained) -> None:
        """Nothing new is placed on a drained node; what runs there goes on until it ends."""
        self.record.node_events.append(NodeEventRecord(ev.at, self.topology.node_names[ev.node], "drained",
                                                       ev.cause))
        self.ctx.state.reserve([ev.node], DRAINED)

    def _on_inventory(self, ev: InventoryChanged) -> None:
        from loom.core.inventory import adopt

        adopt(self, ev.inventory, ev.at)

    # ------------------------------------------------------------------ helpers
    def _to(self, job: Job, new: JobState, event: str, at: float) -> None:
        old = job.state
        if new not in TRANSITIONS[old]:
            raise IllegalTransition(job.job_id, old, new, event)
        job.state = new
        self._log(at, job.key, old, new, event)

    def _end(self, job: Job, state: JobState, event: str, at: float) -> None:
        self._to(job, state, event, at)
        job.end_time = at
        job.rate = 0.0

    def _count_gpu_time(self, job: Job, at: float) -> None:
        gpu_s = (at - job.held_since) * job.allocation.total  # type: ignore[union-attr]
        job.gpu_seconds += gpu_s
        self.busy_gpu_seconds += gpu_s
        job.held_since = at

    def _release_gpus(self, job: Job, at: float) -> None:
        self._count_gpu_time(job, at)
        self.ctx.state.release(job.allocation)  # type: ignore[arg-type]

    def _take_off(self, job: Job, at: float) -> None:
        """Off its GPUs: a running or starting job stops holding them (the record keeps its allocation)."""
        self._release_gpus(job, at)
        if job.state is RUNNING:
            del self.ctx.running[job.job_id]
            self.ctx.releases.remove(job.key)
        else:  # its launch is called off: the time spent launching is set-up, and a first launch never happened
            del self.ctx.starting[job.job_id]
            self.ctx.releases.remove(job.key)
            self._launch.pop(job.job_id, None)
            job.setup_s += at - job.last_start  # type: ignore[operator]
            if job.job_id in self._first_launch:
                self._first_launch.discard(job.job_id)
                job.first_start = None
        job.rate = 0.0


_STARTABLE = frozenset({PENDING, SUSPENDED, RECOVERING})


def _ignore(_: Event) -> None:
    return None
