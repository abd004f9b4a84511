"""Queue scans shared by non-blocking policies."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from loom.core.jobs import Job
from loom.core.round import RoundPlan


def start_fitting(plan: RoundPlan, jobs: Iterable[Job], reason: Callable[[Job], str],
                  admit: Callable[[Job], bool] | None = None) -> None:
    """Start every job that fits, in the given order.

    Gang placement is monotone in size: if g GPUs of a type cannot be placed,
    no larger request of that type can be this round, so those are skipped
    without calling the placer.
    """
    smallest_failure: dict[str | None, int] = {}
    for job in jobs:
        state = plan.view
        if state.free_total == 0:
            break
        kind = job.spec.gpu_type
        if job.gpus >= smallest_failure.get(kind, 1 << 30) or job.gpus > state.free_total:
            continue
        if admit is not None and not admit(job):
            continue
        alloc = plan.place(job)
        if alloc is None:
            smallest_failure[kind] = min(job.gpus, smallest_failure.get(kind, 1 << 30))
            continue
        plan.start(job, alloc, reason(job))
