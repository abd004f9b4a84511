"""A scheduling round's scratch pad: a private copy of the state plus the
decisions made so far, so a policy can place several jobs consistently."""

from __future__ import annotations

from sys import intern

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Preempt, Resume, Start
from loom.core.jobs import Job
from loom.core.plan import ParallelPlan
from loom.core.protocols import Placer
from loom.hardware.state import Allocation, ClusterState

_SHAPES: dict[type, bool] = {}  # placer class → whether it has `plan_for`
_REASONS: dict[tuple[str, str, int], str] = {}  # (policy's reason, placer, node count) → the decision's reason
_MAX_REASONS = 1 << 16


def _full_reason(reason: str, placer: str, nodes: int) -> str:
    """A start's reason with its placement. Most starts of a run give one of a few reasons, and the
    log keeps every one: each text is made (and interned) once, until the cache fills up (policies
    whose reasons name the job, e.g. its size, give many: those are made each time)."""
    key = (reason, placer, nodes)
    full = _REASONS.get(key)
    if full is None:
        full = intern(f"{reason}; {placer} on {nodes} node(s)")
        if len(_REASONS) < _MAX_REASONS:
            _REASONS[key] = full
    return full


class RoundPlan:
    __slots__ = ("_deferred", "_state", "ctx", "decisions", "placer", "started")

    def __init__(self, ctx: SchedulingContext, placer: Placer | None = None) -> None:
        self.ctx = ctx
        self.placer = placer or ctx.placer
        self.decisions: list[Decision] = []
        self.started: list[tuple[Job, Allocation]] = []  # this round's starts, not yet in ctx.running
        self._state: ClusterState | None = None
        # The first start of a round on the untouched state, not yet taken off a copy: a round whose
        # last change it is (an arrival that fits at once, the common round) needs no copy at all.
        # The core takes the same GPUs off the live state when it carries the decision out.
        self._deferred: Allocation | None = None

    @property
    def state(self) -> ClusterState:
        """Copy-on-first-use: rounds that change nothing copy nothing."""
        if self._state is None:
            self._materialise()
        return self._state  # type: ignore[return-value]

    @property
    def view(self) -> ClusterState:
        """The state as this round has changed it so far, for reading (no copy unless a start is pending)."""
        if self._state is not None:
            return self._state
        if self._deferred is not None:
            return self._materialise()
        return self.ctx.state

    def _materialise(self) -> ClusterState:
        state = self._state = self.ctx.state.copy()
        if self._deferred is not None:
            state.allocate(self._deferred)
            self._deferred = None
        return state

    def fork(self) -> RoundPlan:
        """A what-if copy: try a sequence of changes, keep them only if they work out."""
        trial = RoundPlan(self.ctx, self.placer)
        trial._state = self.view.copy()
        return trial

    def place(self, job: Job, gpus: int | None = None) -> Allocation | None:
        gpus = gpus or job.gpus
        state = self._state  # placers only read, so a failed attempt copies nothing
        if state is None:
            state = self.ctx.state
            if self._deferred is not None:
                if gpus > state.free_total - self._deferred.total:
                    return None  # cannot fit: no need to take the pending start off a copy to know
                state = self._materialise()
        if gpus > state.free_total:
            return None
        spec = job.spec
        if state.reserved_nodes or spec.gpu_type is not None or spec.gpu_types:
            allowed = state.usable_mask(self.ctx.reservation_for(job.job_id) if self.ctx.reservations else None,
                                        spec.gpu_type, spec.gpu_types)
        else:
            allowed = None  # every node qualifies (usable_mask's answer, without the call)
        return self.placer.place(spec, gpus, state, allowed)

    def try_start(self, job: Job, reason: str, plan: ParallelPlan | None = None) -> Allocation | None:
        """Place and record Start (or Resume for a preempted job); None if it does not fit."""
        alloc = self.place(job)
        if alloc is not None:
            if plan is None:  # a placer that shaped the job (Arnold) says how
                placer = self.placer
                shapes = _SHAPES.get(type(placer))
                if shapes is None:  # looked up once per placer class: a missing attribute is slow to find
                    shapes = _SHAPES[type(placer)] = callable(getattr(placer, "plan_for", None))
                plan = placer.plan_for(job.spec, alloc) if shapes else None
            self.start(job, alloc, reason, plan)
        return alloc

    def start(self, job: Job, alloc: Allocation, reason: str, plan: ParallelPlan | None = None) -> None:
        if self._state is None and self._deferred is None:
            self._deferred = alloc  # taken off a copy only if the round reads the state again
        else:
            self.state.allocate(alloc)
        self.started.append((job, alloc))
        kind = Resume if job.first_start is not None else Start
        key = (reason, self.placer.name, len(alloc.nodes))
        self.decisions.append(kind(job.job_id, alloc, _REASONS.get(key) or _full_reason(*key), plan))

    def preempt(self, job: Job, reason: str) -> None:
        assert job.allocation is not None
        self.state.release(job.allocation)
        self.decisions.append(Preempt(job.job_id, reason))
