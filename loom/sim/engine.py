"""The discrete-event loop: jump from event to event, one scheduling round
per instant at which something changed.

The simulation is the core (`loom.core.scheduler.Scheduler`: lifecycle,
policy rounds, recovery) driven by the simulated backend (`SimBackend`: the
world, on a heap of typed events) and a clock. Arrivals are read from the
time-sorted trace through a cursor instead of being pushed onto the heap, so
the heap only holds what is in flight.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappop
from operator import attrgetter
from typing import TYPE_CHECKING

from loom.core.decisions import Decision, Preempt, Release, Resize
from loom.core.jobs import Job
from loom.core.protocols import Placer, Policy, SpeedModel
from loom.core.record import RunRecord
from loom.core.scheduler import Scheduler
from loom.errors import LoomInputError
from loom.hardware.topology import Topology
from loom.sim.backend import SimBackend
from loom.sim.events import (
    Announce,
    Cancellation,
    EventKind,
    EventQueue,
    NodeFails,
    RoundDue,
)
from loom.sim.health import NodeHealth
from loom.sim.speed import TraceDurationSpeed
from loom.workload.job import JobSpec

if TYPE_CHECKING:  # the optional features' modules load when a run uses them (a plain replay never does)
    from loom.core.recovery import Recovery, RecoveryConfig, RecoveryRecord
    from loom.perf.interruptions import InterruptionModel
    from loom.sim.interruptions import InterruptionTotals
    from loom.sim.launch import LaunchModel
    from loom.workload.faults import NodeFailure
    from loom.workload.job_failures import FailurePlan

ProgressCallback = Callable[[float], None]
FREES_CAPACITY = (Preempt, Release, Resize)
MAX_FOLLOWUPS = 64  # follow-up rounds at one instant
PROGRESS_EVERY = 16384


def _frees_capacity(decisions: list[Decision]) -> bool:
    """Whether a round gave GPUs back (a plain loop: this runs after every round that decided something)."""
    for d in decisions:
        if type(d) in FREES_CAPACITY:
            return True
    return False
FINISH, LAUNCH, TIMER, ROUND = int(EventKind.FINISH), int(EventKind.LAUNCH), int(EventKind.TIMER), int(EventKind.ROUND)


@dataclass
class SimulationResult:
    topology: Topology
    jobs: list[Job]
    record: RunRecord
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

    @property
    def decisions(self) -> list[tuple[float, Decision]]:
        return self.record.decisions


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
        runtime_estimate: Callable[[Job], float] | None = None,
        log_decisions: bool = True,
        interruptions: InterruptionModel | None = None,
        recovery: RecoveryConfig | None = None,
        job_failures: Mapping[str, Sequence[FailurePlan]] | None = None,
        hang_watchdog_s: float = 600.0,
        infra_repair_s: float = 0.85 * 86400,
        launch: LaunchModel | None = None,
        cancellations: Sequence[tuple[str, float]] = (),
    ) -> None:
        self.topology = topology
        self.policy = policy
        self.round_interval = round_interval
        speed = speed or TraceDurationSpeed()
        prepare = getattr(speed, "prepare", None)
        if prepare is not None:
            specs = prepare(specs, topology)
        ordered = sorted(specs, key=attrgetter("submit_time"))
        self.events = EventQueue()
        self.interruptions = None
        if interruptions is not None:
            from loom.sim.interruptions import Interruptions

            self.interruptions = Interruptions(interruptions)
        self.backend = SimBackend(topology, speed, self.events, self.interruptions, launch, hang_watchdog_s,
                                  infra_repair_s)
        self.core = Scheduler(self.backend, policy, placer, recovery=recovery, log_decisions=log_decisions,
                              runtime_estimate=runtime_estimate or self.backend.remaining)
        self.ctx = self.core.ctx
        self.jobs = self.core.add_all(ordered)
        self.backend.track(self.jobs)
        self.by_id = self.core.jobs
        bind = getattr(speed, "bind", None)
        if bind is not None:  # optional hook: models that read the live context (interference)
            bind(self.ctx)
        for job_id, plans in (job_failures or {}).items():
            job = self.by_id.get(job_id)
            if job is None:
                raise LoomInputError(f"failure plan for unknown job '{job_id}'", field="job_failures")
            self.backend.failure_plans[job.key] = sorted(plans, key=lambda p: p.at_progress_s)
        for job in self.jobs:
            if job.spec.announce_time is not None:
                self.events.push(job.spec.announce_time, EventKind.ANNOUNCE, Announce(job.key))
        for job_id, at in cancellations:
            if job_id not in self.by_id:
                raise LoomInputError(f"cancellation of unknown job '{job_id}'", field="cancellations")
            self.events.push(at, EventKind.CANCEL, Cancellation(job_id))
        for failure in failures:
            node = topology.node_index.get(failure.node)
            if node is None:
                raise LoomInputError(f"unknown node '{failure.node}' in failure list", field="failures.node")
            self.events.push(failure.at, EventKind.NODE_FAILURE, NodeFails(node, failure.repair_after))

    def release(self) -> None:
        """Let go of the per-job working state only a running simulation needs (the backend's work
        ledger, the id index): ~20 MB for a 100k-job trace. The result of `run` stays complete;
        the simulation cannot go on. For a caller that is done with the simulation and keeps the
        result (`loom.run` before writing the outputs)."""
        self.backend.track(())
        self.core.jobs.clear()

    @property
    def recovery(self) -> Recovery | None:
        return self.core.recovery

    @property
    def health(self) -> NodeHealth:
        return self.backend.health

    # ------------------------------------------------------------------ loop
    def run(self, progress: ProgressCallback | None = None) -> SimulationResult:
        # The loop allocates millions of short-lived events and decisions and few cycles: collect
        # young objects less often (restored afterwards; the run creates no reference cycles of its own).
        thresholds = gc.get_threshold()
        gc.set_threshold(max(thresholds[0], 200_000), *thresholds[1:])
        try:
            return self._run(progress)
        finally:
            gc.set_threshold(*thresholds)

    def _run(self, progress: ProgressCallback | None) -> SimulationResult:
        wall = time.perf_counter()
        jobs, ctx, backend, core = self.jobs, self.ctx, self.backend, self.core
        heap = self.events.heap  # read directly: this loop is the simulator's hot path
        inf = float("inf")
        cursor = 0
        arrivals = [job.spec.submit_time for job in jobs]  # read once: the loop looks at the next one per instant
        arrivals.append(inf)  # the end of the trace, never reached by `now`
        handled = rounds = 0
        round_pending = False
        followup_at, followups = -inf, 0
        next_progress = PROGRESS_EVERY
        now = jobs[0].spec.submit_time if jobs else 0.0
        start_time = now
        finish_due, observe, submit, issue = backend.finish_due, core.observe, core.submit, core.issue
        compact = core.record.transitions.compact
        schedule, clock, round_seconds, round_queue = self.policy.schedule, time.perf_counter, \
            core.round_seconds, core.round_queue
        while True:
            next_arrival = arrivals[cursor]
            now = heap[0][0] if heap and heap[0][0] < next_arrival else next_arrival
            if now == inf:
                break
            ctx.now = now
            dirty = False
            while heap and heap[0][0] == now:
                _, kind, _, payload = heappop(heap)
                if kind == FINISH:
                    if not finish_due(payload, now):
                        continue  # stale: the job was preempted, migrated or resized since
                elif kind == TIMER:
                    observe(payload)
                elif kind == ROUND:
                    round_pending = round_pending and payload.reason != "periodic"
                elif not self._world(kind, payload, now):
                    continue
                dirty = True
                handled += 1
            while arrivals[cursor] == now:
                job = jobs[cursor]
                if job.spec.duration is None:
                    self._no_duration(job, now)
                else:
                    submit(job, now)
                cursor += 1
                handled += 1
                dirty = True
            if dirty:
                # core.round(now), inlined: it runs at every instant something happened
                tick = clock()
                decisions = schedule(ctx)
                round_seconds.append(clock() - tick)
                round_queue.append(len(ctx.pending))
                if decisions:
                    issue(decisions, now)
                    if followup_at != now:
                        followup_at, followups = now, 0
                    if followups < MAX_FOLLOWUPS and _frees_capacity(decisions):
                        # capacity freed in this round: give the policy another look now
                        # (bounded, so a policy that keeps preempting cannot stall time)
                        self.events.push(now, EventKind.ROUND, RoundDue("follow-up"))
                        followups += 1
                rounds += 1
                if self.round_interval and (ctx.pending or ctx.reservations) and not round_pending:
                    self.events.push(now + self.round_interval, EventKind.ROUND, RoundDue("periodic"))
                    round_pending = True
            if handled >= next_progress:
                if progress is not None:
                    progress(now)
                compact()  # the transition log, sealed into arrays as it grows
                next_progress = handled + PROGRESS_EVERY
        # the last moment a job held GPUs: a finish, or the stop of a job left unfinished
        end_time = max((j.end_time if j.end_time is not None else j.held_since
                        for j in jobs if j.first_start is not None), default=start_time)
        if progress is not None:
            progress(end_time)
        core.close()
        return SimulationResult(
            topology=self.topology, jobs=jobs, record=core.record, events=handled, rounds=rounds,
            sim_wall_s=time.perf_counter() - wall, busy_gpu_seconds=core.busy_gpu_seconds,
            failed_gpu_seconds=backend.health.failed_gpu_seconds(start_time, end_time),
            round_seconds=core.round_seconds, round_queue=core.round_queue,
            interruptions=self.interruptions.totals if self.interruptions is not None else None,
            recoveries=core.recovery.records if core.recovery is not None else [],
            start_time=start_time, end_time=end_time,
            rejected=core.rejected,
        )

    # -------------------------------------------------------------- handlers
    def _no_duration(self, job: Job, now: float) -> None:
        """Nothing to simulate: the trace states work, not time."""
        spec = job.spec
        self.core.reject(job, f"no duration: the trace gives work (model '{spec.model}', {spec.iterations} "
                              "iterations); use a speed model that derives time from work, "
                              "e.g. --speed-model estimator", now)

    def _world(self, kind: int, payload: object, now: float) -> bool:
        """Carry out a world event; False if it turned out stale (nothing happened)."""
        backend = self.backend
        if kind == EventKind.ANNOUNCE:
            self.core.announce(self.jobs[payload.key])  # type: ignore[attr-defined]
        elif kind == EventKind.NODE_FAILURE:
            backend.node_fails(payload.node, payload.repair_after, now)  # type: ignore[attr-defined]
        elif kind == EventKind.NODE_REPAIR:
            backend.node_repaired(payload.node, now)  # type: ignore[attr-defined]
        elif kind == EventKind.JOB_FAILURE:
            backend.failure_due(payload, now)  # type: ignore[arg-type]
        elif kind == LAUNCH:
            return backend.launch_due(payload, now)  # type: ignore[arg-type]
        elif kind == EventKind.CANCEL:
            return self.core.cancel(payload.job_id, "cancelled by its owner", now)  # type: ignore[attr-defined]
        return True
