"""The discrete-event loop: jump from event to event, one scheduling round
per instant at which something changed.

Arrivals are read from the time-sorted trace through a cursor instead of
being pushed onto the heap, so the heap only holds what is in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappop

from loom.core.context import SchedulingContext, oracle_runtime
from loom.core.decisions import Decision, Preempt, Release, Resize
from loom.core.jobs import Job, JobState
from loom.core.protocols import Placer, Policy, SpeedModel
from loom.errors import LoomInputError
from loom.hardware.state import ClusterState
from loom.hardware.topology import Topology
from loom.perf.interruptions import InterruptionModel
from loom.sim.backend import SimBackend
from loom.sim.events import EventKind, EventQueue, NodeFailure
from loom.sim.health import NodeHealth
from loom.sim.interruptions import Interruptions, InterruptionTotals
from loom.sim.recovery import Recovery, RecoveryConfig, RecoveryRecord
from loom.sim.speed import TraceDurationSpeed
from loom.workload.job import JobSpec
from loom.workload.job_failures import FailurePlan

ProgressCallback = Callable[[float], None]
FREES_CAPACITY = (Preempt, Release, Resize)
MAX_FOLLOWUPS = 64  # follow-up rounds at one instant
PROGRESS_EVERY = 16384


@dataclass
class SimulationResult:
    topology: Topology
    jobs: list[Job]
    decisions: list[tuple[float, Decision]]
    events: int
    rounds: int
    sim_wall_s: float
    busy_gpu_seconds: float
    failed_gpu_seconds: float
    start_time: float
    end_time: float
    rejected: dict[str, str] = field(default_factory=dict)
    # wall seconds of each policy.schedule() call and the pending-queue length it saw:
    # the scheduler's decision latency, per event (Crius §8.7-style overhead figures)
    round_seconds: list[float] = field(default_factory=list)
    round_queue: list[int] = field(default_factory=list)
    # GPU-seconds spent on pauses, checkpoints and lost work (None: interruptions not priced)
    interruptions: InterruptionTotals | None = None
    recoveries: list[RecoveryRecord] = field(default_factory=list)  # one per job hit by a failure


class Simulation:
    def __init__(
        self,
        topology: Topology,
        specs: Sequence[JobSpec],
        policy: Policy,
        placer: Placer,
        speed: SpeedModel | None = None,
        *,
        round_interval: float | None = None,
        failures: Sequence[NodeFailure] = (),
        runtime_estimate: Callable[[Job], float] = oracle_runtime,
        log_decisions: bool = True,
        interruptions: InterruptionModel | None = None,
        recovery: RecoveryConfig | None = None,
        job_failures: Mapping[str, Sequence[FailurePlan]] | None = None,
        hang_watchdog_s: float = 600.0,
        infra_repair_s: float = 0.85 * 86400,
    ) -> None:
        self.topology = topology
        self.policy = policy
        self.round_interval = round_interval
        speed = speed or TraceDurationSpeed()
        prepare = getattr(speed, "prepare", None)
        if prepare is not None:
            specs = prepare(specs, topology)
        ordered = sorted(specs, key=lambda s: s.submit_time)
        self.jobs = [Job(spec, key) for key, spec in enumerate(ordered)]
        self.by_id = {job.job_id: job for job in self.jobs}
        if len(self.by_id) != len(self.jobs):
            raise LoomInputError("job ids must be unique within a trace", field="job_id")
        self.events = EventQueue()
        self.ctx = SchedulingContext(topology, ClusterState(topology), placer, {}, {}, {}, {},
                                     runtime_estimate=runtime_estimate)
        self.log: list[tuple[float, Decision]] | None = [] if log_decisions else None
        self.interruptions = Interruptions(interruptions) if interruptions is not None else None
        self.backend = SimBackend(self.ctx, self.by_id, speed, self.events, self.log, self.interruptions)
        bind = getattr(speed, "bind", None)
        if bind is not None:  # optional hook: models that read the live context (interference)
            bind(self.ctx)
        self.hang_watchdog_s = hang_watchdog_s
        self.infra_repair_s = infra_repair_s
        for job_id, plans in (job_failures or {}).items():
            job = self.by_id.get(job_id)
            if job is None:
                raise LoomInputError(f"failure plan for unknown job '{job_id}'", field="job_failures")
            self.backend.failure_plans[job.key] = sorted(plans, key=lambda p: p.at_progress_s)
        self.recovery = None
        if recovery is not None:
            self.recovery = Recovery(recovery, self.ctx,
                                     lambda at, payload: self.events.push(at, EventKind.TIMER, payload))
        self.rejected: dict[str, str] = {}
        self._capacity: dict[tuple[str | None, ...], int] = {}
        self.health = NodeHealth(topology.node_gpus.tolist())
        for job in self.jobs:
            if job.spec.announce_time is not None:
                job.state = JobState.ANNOUNCED
                self.events.push(job.spec.announce_time, EventKind.ANNOUNCE, job.key)
        for failure in failures:
            node = topology.node_index.get(failure.node)
            if node is None:
                raise LoomInputError(f"unknown node '{failure.node}' in failure list", field="failures.node")
            self.events.push(failure.at, EventKind.NODE_FAILURE, (node, failure.repair_after))

    # ------------------------------------------------------------------ loop
    def run(self, progress: ProgressCallback | None = None) -> SimulationResult:
        wall = time.perf_counter()
        jobs, events, ctx, backend = self.jobs, self.events, self.ctx, self.backend
        heap = events.heap  # read directly: this loop is the simulator's hot path
        inf = float("inf")
        cursor, n = 0, len(jobs)
        handled = rounds = 0
        round_pending = False
        followup_at, followups = -inf, 0
        clock, round_seconds, round_queue = time.perf_counter, [], []
        next_progress = PROGRESS_EVERY
        now = jobs[0].spec.submit_time if jobs else 0.0
        start_time = now
        while True:
            next_arrival = jobs[cursor].spec.submit_time if cursor < n else inf
            now = heap[0][0] if heap and heap[0][0] < next_arrival else next_arrival
            if now == inf:
                break
            ctx.now = now
            dirty = False
            while heap and heap[0][0] == now:
                _, kind, _, payload = heappop(heap)
                if kind == EventKind.FINISH:
                    job = jobs[payload[0]]
                    if job.finish_version != payload[1] or job.state is not JobState.RUNNING:
                        continue  # stale: the job was preempted, migrated or resized since
                    backend.finish(job, now)
                elif kind == EventKind.ROUND:
                    round_pending = round_pending and payload != "periodic"
                else:
                    self._handle(kind, payload, now)
                dirty = True
                handled += 1
            while cursor < n and jobs[cursor].spec.submit_time == now:
                self._arrive(jobs[cursor])
                cursor += 1
                handled += 1
                dirty = True
            if dirty:
                tick = clock()
                decisions = self.policy.schedule(ctx)
                round_seconds.append(clock() - tick)
                round_queue.append(len(ctx.pending))
                if decisions:
                    backend.apply(decisions, now)
                    if followup_at != now:
                        followup_at, followups = now, 0
                    if followups < MAX_FOLLOWUPS and any(type(d) in FREES_CAPACITY for d in decisions):
                        # capacity freed in this round: give the policy another look now
                        # (bounded, so a policy that keeps preempting cannot stall time)
                        events.push(now, EventKind.ROUND, "follow-up")
                        followups += 1
                rounds += 1
                if self.round_interval and (ctx.pending or ctx.reservations) and not round_pending:
                    events.push(now + self.round_interval, EventKind.ROUND, "periodic")
                    round_pending = True
            if progress is not None and handled >= next_progress:
                progress(now)
                next_progress = handled + PROGRESS_EVERY
        # the last moment a job held GPUs: a finish, or the stop of a job left unfinished
        end_time = max((j.end_time if j.end_time is not None else j.since
                        for j in jobs if j.first_start is not None), default=start_time)
        if progress is not None:
            progress(end_time)
        return SimulationResult(
            topology=self.topology, jobs=jobs, decisions=self.log or [], events=handled, rounds=rounds,
            sim_wall_s=time.perf_counter() - wall, busy_gpu_seconds=backend.busy_gpu_seconds,
            failed_gpu_seconds=self.health.failed_gpu_seconds(start_time, end_time),
            round_seconds=round_seconds, round_queue=round_queue,
            interruptions=self.interruptions.totals if self.interruptions is not None else None,
            recoveries=self.recovery.records if self.recovery is not None else [],
            start_time=start_time, end_time=end_time,
            rejected=self.rejected,
        )

    # -------------------------------------------------------------- handlers
    def _arrive(self, job: Job) -> None:
        spec = job.spec
        self.ctx.announced.pop(job.job_id, None)
        kinds = spec.gpu_types or (spec.gpu_type,)
        capacity = self._capacity.get(kinds)
        if capacity is None:
            capacity = self._capacity[kinds] = max(self.topology.max_gpus_of_type(k) for k in kinds)
        if spec.duration is None:
            job.state = JobState.REJECTED
            job.reason = (f"no duration: the trace gives work (model '{spec.model}', {spec.iterations} iterations); "
                          "use a speed model that derives time from work, e.g. --speed-model estimator")
            self.rejected[job.job_id] = job.reason
            return
        if spec.gpus > capacity:
            job.state = JobState.REJECTED
            pool = (f"{'/'.join(k for k in kinds if k)} GPUs of one type" if kinds != (None,)
                    else "GPUs of one type (jobs never span types)")
            job.reason = f"asks for {spec.gpus} GPUs; the cluster has at most {capacity} {pool}"
            self.rejected[job.job_id] = job.reason
            return
        job.state = JobState.PENDING
        job.since = spec.submit_time
        self.ctx.pending[job.job_id] = job

    def _handle(self, kind: int, payload: object, now: float) -> None:
        if kind == EventKind.ANNOUNCE:
            job = self.jobs[payload]  # type: ignore[index]
            self.ctx.announced[job.job_id] = job
        elif kind == EventKind.NODE_FAILURE:
            node, repair_after = payload  # type: ignore[misc]
            if not self.health.is_down(node):
                if self.recovery is not None:
                    self.recovery.node_failed(node, now, lambda job: self.backend.fail(job, now))
                else:
                    self._evict_all(node, now)
                self.ctx.state.fail_node(node)
            repair_at = self.health.fail(node, now, repair_after)
            if repair_at is not None:
                self.events.push(repair_at, EventKind.NODE_REPAIR, node)
        elif kind == EventKind.NODE_REPAIR:
            if self.health.repair(payload, now):  # type: ignore[arg-type]
                self.ctx.state.repair_node(payload)  # type: ignore[arg-type]
                if self.recovery is not None:
                    self.recovery.node_repaired(payload)  # type: ignore[arg-type]
        elif kind == EventKind.JOB_FAILURE:
            self._job_failure(payload, now)  # type: ignore[arg-type]
        elif kind == EventKind.TIMER:
            action, rid = payload  # type: ignore[misc]
            if action == "expire" and rid in self.ctx.reservations:
                self.backend.apply([Release(rid, "reservation reached its end time")], now)
            elif action == "recover" and self.recovery is not None:
                self.recovery.ready(rid, now, lambda decisions: self.backend.apply(decisions, now))

    def _job_failure(self, payload: tuple[int, int], now: float) -> None:
        """Fire a job's next failure plan: script/framework errors end it, a hang restarts it in
        place after the watchdog notices, an infrastructure fault takes one of its nodes down."""
        job = self.jobs[payload[0]]
        if job.finish_version != payload[1] or job.state is not JobState.RUNNING:
            return  # stale: the job moved or stopped since the failure was planned
        plan = self.backend.failure_plans[job.key].pop(0)
        alloc = job.allocation
        assert alloc is not None
        if plan.kind == "hang":
            job.failures += 1
            self.backend.hang(job, now, self.hang_watchdog_s)
        elif plan.kind == "infrastructure":
            node = alloc.nodes[(job.key + job.failures) % len(alloc.nodes)]
            self._handle(EventKind.NODE_FAILURE, (node, self.infra_repair_s), now)
        else:
            self.backend.terminate(job, now, f"{plan.kind} error after {plan.at_progress_s:.0f}s of progress")
            if self.log is not None:
                self.log.append((now, Preempt(job.job_id, f"failed: {job.reason}")))

    def _evict_all(self, node: int, now: float) -> None:
        """Every job on a failing node goes back to the queue (progress kept)."""
        name = self.topology.node_names[node]
        victims = [j for j in self.ctx.running.values() if node in j.allocation.nodes]  # type: ignore[union-attr]
        for job in victims:
            self.backend.fail(job, now)
            job.failures += 1
            job.state = JobState.PENDING
            self.ctx.pending[job.job_id] = job
            if self.log is not None:
                self.log.append((now, Preempt(job.job_id, f"evicted: node {name} failed")))
