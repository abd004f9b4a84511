"""Priority preemption: higher-priority jobs go first and, when they do not
fit, preempt running lower-priority jobs (lowest priority, most recently
started first) until they do. Preempted jobs keep their progress and resume
when GPUs free up. Exercises the preempt/resume contract end to end."""

from __future__ import annotations

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan


@POLICIES.register("priority")
class PriorityPreemption:
    name = "priority"

    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if not ctx.pending:
            return []
        plan = RoundPlan(ctx)
        preempted: set[str] = set()
        for job in sorted(ctx.pending.values(), key=lambda j: (-j.spec.priority, j.key)):
            if plan.try_start(job, f"priority {job.spec.priority}: highest waiting") is None:
                self._preempt_for(ctx, plan, job, preempted)
        return plan.decisions

    def _preempt_for(self, ctx: SchedulingContext, plan: RoundPlan, job: Job, preempted: set[str]) -> None:
        victims = sorted(
            (r for r in ctx.running.values() if r.spec.priority < job.spec.priority and r.job_id not in preempted),
            key=lambda r: (r.spec.priority, -(r.last_start or 0.0), -r.key),
        )
        if sum(v.allocation.total for v in victims) + plan.state.free_total < job.gpus:  # type: ignore[union-attr]
            return
        trial = plan.fork()
        chosen: list[Job] = []
        for victim in victims:
            trial.state.release(victim.allocation)  # type: ignore[arg-type]
            chosen.append(victim)
            alloc = trial.place(job)
            if alloc is None:
                continue
            for v in chosen:
                plan.preempt(v, f"preempted by job {job.job_id} (priority {job.spec.priority} > {v.spec.priority})")
                preempted.add(v.job_id)
            plan.start(job, alloc, f"priority {job.spec.priority}: preempted {len(chosen)} lower-priority job(s)")
            return
