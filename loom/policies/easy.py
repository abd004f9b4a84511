"""EASY backfill (Lifka 1995): FCFS, but when the head job is blocked it gets
a reservation at its shadow time (when enough running jobs will have ended),
and later jobs may jump ahead only if they do not delay it: they finish
before the shadow time, or use only GPUs the head will not need.

Run-time knowledge comes from `ctx.runtime_estimate` (the trace's oracle in
simulation, a predictor later). The shadow time counts GPUs, not nodes, the
classic simplification; placement fragmentation can still delay the head.
"""

from __future__ import annotations

from heapq import merge

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.policies.scan import start_fitting


@POLICIES.register("easy")
class EasyBackfill:
    name = "easy"

    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if not ctx.pending:
            return []
        plan = RoundPlan(ctx)
        queue = iter(ctx.pending.values())
        head = None
        for position, job in enumerate(queue):
            if plan.try_start(job, f"easy: queue position {position}") is None:
                head = job
                break
        if head is None or plan.state.free_total == 0:
            return plan.decisions
        shadow, extra = self._shadow(ctx, plan, head)
        now = ctx.now
        estimate = ctx.runtime_estimate
        budget = [extra]

        def admit(job: Job) -> bool:
            if now + estimate(job) <= shadow:
                return True
            if job.gpus <= budget[0]:
                budget[0] -= job.gpus
                return True
            return False

        start_fitting(
            plan, queue,
            lambda job: f"easy: backfilled behind job {head.job_id} (shadow time {shadow - now:.0f}s from now)",
            admit,
        )
        return plan.decisions

    @staticmethod
    def _shadow(ctx: SchedulingContext, plan: RoundPlan, head: Job) -> tuple[float, int]:
        """Earliest time the head fits by GPU count, and the GPUs spare at that time.

        Jobs started earlier in this round are not in `ctx.releases` yet, so
        their expected ends are merged in.
        """
        available = plan.state.free_total
        just_started = sorted((ctx.now + ctx.runtime_estimate(j), a.total) for j, a in plan.started)
        running = ((end, gpus) for end, _key, gpus in ctx.releases)
        for end, gpus in merge(running, just_started):
            available += gpus
            if available >= head.gpus:
                return max(end, ctx.now), available - head.gpus
        return float("inf"), 0
