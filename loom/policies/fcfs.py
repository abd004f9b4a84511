"""First-come first-served: start jobs in queue order; stop at the first that
does not fit (no job overtakes an earlier one)."""

from __future__ import annotations

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan

_REASONS: list[str] = []  # "fcfs: queue position {i}" by i, made once each (a run asks for them ~100k times)


def _reason(position: int) -> str:
    while len(_REASONS) <= position:
        _REASONS.append(f"fcfs: queue position {len(_REASONS)}")
    return _REASONS[position]


@POLICIES.register("fcfs")
class FCFS:
    name = "fcfs"

    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if not ctx.pending:
            return []
        plan = RoundPlan(ctx)
        for position, job in enumerate(ctx.pending.values()):
            if plan.try_start(job, _REASONS[position] if position < len(_REASONS) else _reason(position)) is None:
                break
        return plan.decisions
