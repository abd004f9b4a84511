"""Store rows as API views."""

from __future__ import annotations

from typing import Any

from loom.service.schemas import Allocation, JobView


def job_view(row: Any) -> JobView:
    alloc = row.allocation
    return JobView(job_id=row.job_id, tenant=row.tenant, state=row.state, spec=row.spec,
                   submitted_at=row.submitted_at, updated_at=row.updated_at,
                   cancel_requested=bool(row.cancel_requested),
                   allocation=Allocation(nodes=list(alloc["nodes"]), gpus=list(alloc["gpus"])) if alloc else None,
                   plan=row.plan)


def every_job(store: Any, states: list[str], tenant: str | None = None) -> list[Any]:
    """All jobs in `states` (the store hands them out a page at a time)."""
    out: list[Any] = []
    after = None
    while True:
        page = store.jobs(tenant=tenant, states=states, limit=10_000, after=after)
        out.extend(page)
        if len(page) < 10_000:
            return out
        after = page[-1].job_id
