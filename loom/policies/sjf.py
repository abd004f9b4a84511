"""Shortest job first with oracle run times: an upper bound on what runtime
knowledge buys, not a deployable policy. Non-blocking: any job that fits
starts, shortest first."""

from __future__ import annotations

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.policies.scan import start_fitting


@POLICIES.register("sjf")
class SJF:
    name = "sjf"

    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if not ctx.pending or ctx.state.free_total == 0:
            return []
        plan = RoundPlan(ctx)
        estimate = ctx.runtime_estimate
        order = sorted(ctx.pending.values(), key=lambda j: (estimate(j), j.key))
        start_fitting(plan, order, lambda job: f"sjf: oracle run time {estimate(job):.0f}s")
        return plan.decisions
