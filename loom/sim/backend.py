"""The simulated backend: one implementation of the core's backend protocol.

It is the simulated world. It carries out the core's job decisions on its own
exact work ledger (per job: work left, speed, the time it was last brought up
to date, the allocation it runs on; piecewise-constant rates), prices them
with the interruption model, models launches (latency per job class, launch
failures) and the world's failures (nodes going down and coming back,
job-level errors and hangs), and reports everything to the core as typed
events (`loom.core.events`). The core never reads the ledger; the one window
onto it is `remaining`, the oracle runtime estimate a simulation may hand to
its policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heappush
from typing import TYPE_CHECKING

from loom.core.backend import EventSink, Inventory, handler_for
from loom.core.decisions import (
    Cancel,
    Decision,
    Diagnose,
    Localize,
    Migrate,
    Preempt,
    Resize,
    Resume,
    Start,
)
from loom.core.events import (
    DecisionAccepted,
    DecisionFailed,
    FaultsLocalized,
    JobDiagnosed,
    JobFailed,
    JobFinished,
    JobProgress,
    JobRestarted,
    JobStarted,
    JobStopped,
    NodeDown,
    NodeUp,
    TimerFired,
)
from loom.core.jobs import Job
from loom.core.protocols import SpeedModel
from loom.core.scheduler import DecisionError
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology
from loom.sim.events import (
    EventKind,
    EventQueue,
    FailureDue,
    FinishDue,
    LaunchDue,
    NodeRepaired,
)
from loom.sim.health import NodeHealth

if TYPE_CHECKING:  # loaded when a run uses these features
    from loom.sim.interruptions import Interruptions
    from loom.sim.launch import LaunchModel
    from loom.workload.job_failures import FailurePlan

FINISH = int(EventKind.FINISH)
__all__ = ["DecisionError", "SimBackend"]


def _ignore_event(_: object) -> None:
    return None


class SimBackend:
    name = "sim"

    def __init__(self, topology: Topology, speed: SpeedModel, events: EventQueue,
                 interruptions: Interruptions | None = None, launch: LaunchModel | None = None,
                 hang_watchdog_s: float = 600.0, infra_repair_s: float = 0.85 * 86400) -> None:
        self.topology = topology
        self.speed = speed
        self.events = events
        self.interruptions = interruptions  # None: pauses are the policies' own (`pause_s`)
        self.launch = launch if launch is not None and not launch.instant else None
        self.hang_watchdog_s = hang_watchdog_s
        self.infra_repair_s = infra_repair_s
        self.health = NodeHealth(topology.node_gpus.tolist())
        self.failure_plans: dict[int, list[FailurePlan]] = {}  # job key → job-level failures ahead
        self.track(())
        self.running: dict[int, Job] = {}  # in the order they started (the core's `running` order)
        self.launching: dict[int, tuple[int, str]] = {}  # job key → (ticket, start | resume) of its launch
        self.sink: EventSink = _ignore_event
        self._started = self._finished = _ignore_event  # the sink's handlers of the two events every job sends
        self._apply = {Start: self._start, Resume: self._start, Preempt: self._stop, Cancel: self._stop,
                       Migrate: self._move, Resize: self._move, Diagnose: self._diagnose,
                       Localize: self._localize}

    def track(self, jobs: Sequence[Job]) -> None:
        """The jobs of the trace (the core's records, in key order): the ledger starts from their specs."""
        self.jobs = list(jobs)  # read for specs, plans and failure counts
        self._by_id = {j.job_id: j for j in self.jobs}
        self.remaining_work = [float(j.spec.duration or 0.0) for j in self.jobs]
        self.rate = [0.0] * len(self.jobs)
        self.since = [0.0] * len(self.jobs)
        self.version = [0] * len(self.jobs)
        self.alloc: list[Allocation | None] = [None] * len(self.jobs)

    # ------------------------------------------------------------ protocol
    def bind(self, sink: EventSink) -> None:
        self.sink = sink
        self._started, self._finished = handler_for(sink, JobStarted), handler_for(sink, JobFinished)

    def inventory(self) -> Inventory:
        return Inventory(self.topology, 0)

    def apply(self, decision: Decision, ticket: int, at: float) -> None:
        if self.launch is None and type(decision) is Start:  # the hot path: an instant start
            job = self._by_id[decision.job_id]
            key = job.key
            self.running[key] = job
            self._run_on(job, decision.allocation, at, 0.0, "start")  # positional: keyword calls are slower
            self._started(tuple.__new__(JobStarted, (job.job_id, at, self.rate[key],  # JobStarted(...), fast
                                                 float(job.spec.duration or 0.0) - self.remaining_work[key], ticket)))
            return
        self._apply[type(decision)](decision, ticket, at)  # type: ignore[operator]

    def set_timer(self, at: float, token: tuple) -> None:
        self.events.push(at, EventKind.TIMER, TimerFired(at, token))

    def remaining(self, job: Job) -> float:
        """The oracle: work left at the last settle (reference seconds), as the trace knows it."""
        return self.remaining_work[job.key]

    # ------------------------------------------------------------ decisions
    def _start(self, d: Start | Resume, ticket: int, now: float) -> None:
        job = self._by_id[d.job_id]
        primitive = "start" if isinstance(d, Start) else "resume"
        if self.launch is not None:
            key = job.key
            self.sink(DecisionAccepted(ticket, now))
            self.version[key] += 1
            self.launching[key] = (ticket, primitive)
            self.alloc[key] = d.allocation
            self.events.push(now + self.launch.latency(job.spec), EventKind.LAUNCH,
                             LaunchDue(key, self.version[key], ticket))
            return
        self._launched(job, d.allocation, ticket, now, primitive)

    def _diagnose(self, d: Diagnose, ticket: int, now: float) -> None:
        """The simulator knows why: a node of the job is down (infrastructure), or nothing is known."""
        alloc = self.alloc[self._by_id[d.job_id].key]
        down = [self.topology.node_names[n] for n in (alloc.nodes if alloc else ()) if self.health.is_down(n)]
        summary = f"node {', '.join(down)} down" if down else "no cause known to the simulator"
        self.sink(JobDiagnosed(d.job_id, now, "infrastructure", "NodeFailure" if down else "Unknown", True,
                               summary, ticket=ticket))

    def _localize(self, d: Localize, ticket: int, now: float) -> None:
        faulty = tuple(n for n in d.nodes if self.health.is_down(n))
        self.sink(FaultsLocalized(d.job_id, now, faulty, "the nodes that are down", ticket=ticket))

    def launch_due(self, due: LaunchDue, now: float) -> bool:
        """A launch completes (or fails); False if it was called off meanwhile."""
        launch = self.launching.get(due.key)
        if self.version[due.key] != due.version or launch is None or launch[0] != due.ticket:
            return False
        del self.launching[due.key]
        job = self.jobs[due.key]
        if self.launch is not None and self.launch.fails():
            self.sink(DecisionFailed(due.ticket, now, f"launch of {job.job_id} failed (modelled launch failure)"))
            return True
        self._launched(job, self.alloc[due.key], due.ticket, now, launch[1])  # type: ignore[arg-type]
        return True

    def _launched(self, job: Job, alloc: Allocation, ticket: int, now: float, primitive: str) -> None:
        self.running[job.key] = job
        self._run_on(job, alloc, now, primitive=primitive)
        self.sink(JobStarted(job.job_id, now, self.rate[job.key], self._progress(job), ticket))

    def _refuse(self, d: Decision, ticket: int, now: float) -> bool:
        """Answer a decision for a job this world is not running (it finished or died first)."""
        job = self._by_id.get(d.job_id)  # type: ignore[union-attr]
        if job is not None and (job.key in self.running or job.key in self.launching):
            return False
        self.sink(DecisionFailed(ticket, now, f"{type(d).__name__} of {d.job_id}: "  # type: ignore[union-attr]
                                              "the job is not running here (it ended first)"))
        return True

    def _stop(self, d: Preempt | Cancel, ticket: int, now: float) -> None:
        if self._refuse(d, ticket, now):
            return
        job = self._by_id[d.job_id]
        key = job.key
        if key in self.launching:  # stopped before it came up: the launch is called off
            launch = self.launching.pop(key)[0]
            self.version[key] += 1
            self.sink(DecisionFailed(launch, now, f"launch of {job.job_id} called off: {type(d).__name__.lower()}"))
        else:
            self._end_segment(job, now, "preempt" if isinstance(d, Preempt) else "terminate")
            self._take_off(job, now)
        self.sink(JobStopped(job.job_id, now, self._progress(job), ticket))

    def _move(self, d: Migrate | Resize, ticket: int, now: float) -> None:
        if self._refuse(d, ticket, now):
            return
        job = self._by_id[d.job_id]
        self._settle(job, now)
        self._end_segment(job, now, "move")
        before = self.alloc[job.key]
        self._run_on(job, d.allocation, now, d.pause_s, "resize" if isinstance(d, Resize) else "migrate", before)
        self.sink(JobProgress(job.job_id, now, self.rate[job.key], self._progress(job), ticket))

    # ------------------------------------------------------------ the world
    def finish_due(self, due: FinishDue, now: float) -> bool:
        """The job's work is done, unless its segment changed since (False: a stale finish)."""
        key, version = due
        if self.version[key] != version or key not in self.running:
            return False
        job = self.jobs[key]
        if self.interruptions is not None:
            self._end_segment(job, now, "finish")
        self.since[key] = now  # settled: all its work is done
        self.remaining_work[key] = 0.0
        del self.running[key]
        self.rate[key] = 0.0
        self._finished(tuple.__new__(JobFinished, (job.job_id, now, float(job.spec.duration or 0.0))))  # fast
        return True

    def failure_due(self, due: FailureDue, now: float) -> bool:
        """Fire a job's next failure plan: script/framework errors end it, a hang restarts it in
        place after the watchdog notices, an infrastructure fault takes one of its nodes down."""
        key = due.key
        if self.version[key] != due.version or key not in self.running:
            return False  # stale: the job moved or stopped since the failure was planned
        job = self.jobs[key]
        plan = self.failure_plans[key].pop(0)
        alloc = self.alloc[key]
        assert alloc is not None
        if plan.kind == "hang":
            self._end_segment(job, now, "failure")
            self._settle(job, now)
            watchdog = self.hang_watchdog_s
            self._run_on(job, alloc, now, watchdog, "resume", hold_s=watchdog)
            self.sink(JobRestarted(job.job_id, now, f"hang caught by the {watchdog:.0f}s watchdog",
                                   self.rate[key], self._progress(job)))
        elif plan.kind == "infrastructure":
            self.node_fails(alloc.nodes[(job.key + job.failures) % len(alloc.nodes)], self.infra_repair_s, now)
        else:
            self._end_segment(job, now, "terminate")
            self._take_off(job, now)
            self.sink(JobFailed(job.job_id, now, f"{plan.kind} error after {plan.at_progress_s:.0f}s of progress",
                                fatal=True, progress=self._progress(job)))
        return True

    def node_fails(self, node: int, repair_after: float, now: float) -> None:
        """A node goes down: its jobs die (losing the work since their last durable checkpoint),
        launches on it fail; the core hears of each, then of the node."""
        if not self.health.is_down(node):
            name = self.topology.node_names[node]
            for job in [j for j in self.running.values() if node in self.alloc[j.key].nodes]:  # type: ignore[union-attr]
                self._end_segment(job, now, "failure")
                self._take_off(job, now)
                self.sink(JobFailed(job.job_id, now, f"node {name} failed", nodes=(node,),
                                    progress=self._progress(job)))
            for key, (ticket, _) in [(k, t) for k, t in self.launching.items()
                                     if node in self.alloc[k].nodes]:  # type: ignore[union-attr]
                del self.launching[key]
                self.version[key] += 1
                self.sink(DecisionFailed(ticket, now, f"node {name} failed during the launch"))
            self.sink(NodeDown(node, now))
        repair_at = self.health.fail(node, now, repair_after)
        if repair_at is not None:
            self.events.push(repair_at, EventKind.NODE_REPAIR, NodeRepaired(node))

    def node_repaired(self, node: int, now: float) -> None:
        if self.health.repair(node, now):
            self.sink(NodeUp(node, now))

    # ------------------------------------------------------------ the ledger
    def _progress(self, job: Job) -> float:
        return float(job.spec.duration or 0.0) - self.remaining_work[job.key]

    def _run_on(self, job: Job, alloc: Allocation, now: float, pause_s: float = 0.0, primitive: str | None = None,
                before: Allocation | None = None, hold_s: float = 0.0) -> None:
        """Run `job` on `alloc` from `now`. With an interruption model the `primitive` that put it
        there (start, resume, migrate, resize) is priced by it and `pause_s` is ignored."""
        key = job.key
        rate = self.speed.rate(job, alloc, self.topology)
        if not rate > 0:
            raise DecisionError(f"speed model gave rate {rate} for job '{job.job_id}'")
        if self.interruptions is not None and primitive is not None:
            pause_s, divisor = self.interruptions.on_run(job, alloc, now, primitive, rate, before, hold_s,
                                                         self.remaining_work[key])
            rate /= divisor  # time-slicing overhead
        if key in self.failure_plans:
            self._plan_failure(job, now, rate, pause_s)
        remaining = self.remaining_work[key] = self.remaining_work[key] + rate * pause_s  # a pause costs work
        self.alloc[key] = alloc
        self.rate[key] = rate
        self.since[key] = now
        version = self.version[key] = self.version[key] + 1
        events = self.events  # EventQueue.push inlined: once per run segment of every job
        events._seq += 1
        heappush(events.heap, (now + remaining / rate, FINISH, events._seq, tuple.__new__(FinishDue, (key, version))))

    def _plan_failure(self, job: Job, now: float, rate: float, extra_s: float) -> None:
        """Schedule the job's next job-level failure: when its progress reaches the plan's
        threshold on this run segment (pause and checkpoint stalls on the way count as time)."""
        plans = self.failure_plans[job.key]
        if not plans:
            return
        done = (job.spec.duration or 0.0) - self.remaining_work[job.key]  # no charges yet
        wall = max(0.0, plans[0].at_progress_s - done) / rate
        at = now + extra_s + wall
        if self.interruptions is not None:
            seg = self.interruptions.segments.get(job.key)
            if seg is not None:  # stalls are spread over the segment, the pause comes first
                passed = min(seg.checkpoints, int(wall // self.interruptions.interval))
                at = seg.progress_from + wall + passed * seg.stall_s
        self.events.push(at, EventKind.JOB_FAILURE, FailureDue(job.key, self.version[job.key] + 1))

    def _settle(self, job: Job, now: float) -> None:
        """Bring the work left up to `now` before the rate or allocation changes."""
        key = job.key
        self.remaining_work[key] = max(0.0, self.remaining_work[key] - self.rate[key] * (now - self.since[key]))
        self.since[key] = now

    def _take_off(self, job: Job, now: float) -> None:
        """Off its GPUs (preemption, failure, error), keeping its progress."""
        self._settle(job, now)
        del self.running[job.key]
        self.rate[job.key] = 0.0
        self.version[job.key] += 1

    def _end_segment(self, job: Job, now: float, cause: str) -> None:
        """Settle the job's checkpoint timeline: refund pause and stalls not reached, add back
        the progress a failure lost (interruption model only)."""
        if self.interruptions is None:
            return
        self._settle(job, now)
        key = job.key
        unspent = self.interruptions.end_segment(job, now, cause, self.alloc[key])
        self.remaining_work[key] = max(0.0, self.remaining_work[key] - self.rate[key] * unspent)
