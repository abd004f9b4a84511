"""What the engine writes about jobs: lifecycle transitions, allocations, decisions.

Decisions are write-ahead: `record_decision` commits a decision (status "issued")
before the backend is asked to carry it out, and the backend's answers move it to
"accepted" and then "done" or "failed". After a crash, `open_decisions` is exactly
what the restart must complete or roll back. The store records; the core owns the
lifecycle and has checked every transition before it gets here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from loom.errors import LoomInputError
from loom.service.store import validate as check
from loom.service.store.base import StoreError
from loom.service.store.jobs import JobsMixin
from loom.service.store.rows import (
    DECISION_STATUSES,
    OPEN_DECISION_STATUSES,
    DecisionRow,
    TransitionRow,
)
from loom.service.store.schema import decisions, events, jobs, transitions

# which answers may follow which: a repeated answer is a no-op, a contradiction a bug
_NEXT = {"issued": {"accepted", "done", "failed"}, "accepted": {"done", "failed"}, "done": set(), "failed": set()}


def to_decision(r: Any) -> DecisionRow:
    return DecisionRow(r.ticket, r.kind, r.job_id, r.payload, r.reason, r.status, r.issued_at, r.answered_at,
                       r.answer_reason)


class LedgerMixin(JobsMixin):
    def record_transition(self, job_id: str, old: str, new: str, at: float, event: str) -> None:
        """Append a lifecycle transition and set the job's state to `new`."""
        old, new = check.job_state(old, "old"), check.job_state(new, "new")
        at = check.time_s(at)
        with self._write() as c:
            tenant = self._tenant_of(c, job_id)
            if tenant is None:
                raise StoreError(f"transition {old} → {new} of job '{job_id}', which the store does not have")
            c.execute(transitions.insert().values(job_id=job_id, old=old, new=new, at=at, event=str(event)))
            c.execute(jobs.update().where(jobs.c.job_id == job_id).values(state=new, updated_at=at))
            self._emit(c, at, "transition", job_id, tenant, {"old": old, "new": new, "event": str(event)})

    def record_transitions(self, rows: Sequence[tuple[str, str, str, float, str]]) -> None:
        """Many transitions (job_id, old, new, at, event) in order, as `record_transition` each, in a
        few statements (the feeder and the engine's group commit write them by the hundred)."""
        if not rows:
            return
        checked = [(job_id, check.job_state(old, "old"), check.job_state(new, "new"), check.time_s(at), str(event))
                   for job_id, old, new, at, event in rows]
        with self._write() as c:
            tenants = {job_id: self._tenant_of(c, job_id) for job_id, *_ in checked}
            missing = [job_id for job_id, tenant in tenants.items() if tenant is None]
            if missing:
                raise StoreError(f"transitions of jobs the store does not have: {', '.join(missing[:5])}")
            c.execute(transitions.insert(), [{"job_id": j, "old": o, "new": n, "at": a, "event": e}
                                             for j, o, n, a, e in checked])
            final = {j: (n, a) for j, _, n, a, _ in checked}  # the last transition of each job sets its state
            c.execute(jobs.update().where(jobs.c.job_id == sa.bindparam("jid")).values(
                state=sa.bindparam("st"), updated_at=sa.bindparam("up")),
                [{"jid": j, "st": n, "up": a} for j, (n, a) in final.items()])
            c.execute(events.insert(), [{"at": a, "kind": "transition", "job_id": j, "tenant": tenants[j],
                                         "data": {"old": o, "new": n, "event": e}} for j, o, n, a, e in checked])

    def set_allocation(self, job_id: str, allocation: dict[str, Any] | None, plan: dict[str, Any] | None) -> None:
        """Where a job runs ({"nodes": [names], "gpus": [counts]}) and its parallel plan; None
        when it holds nothing (a restart rebinds GPUs from this)."""
        allocation = check.allocation(allocation)
        plan = None if plan is None else check.json_object(plan, "plan")
        with self._write() as c:
            done = c.execute(jobs.update().where(jobs.c.job_id == job_id)
                             .values(allocation=allocation, plan=plan, updated_at=time.time())).rowcount
            if not done:
                raise StoreError(f"allocation of job '{job_id}', which the store does not have")

    def record_decision(self, ticket: int, kind: str, job_id: str | None, payload: dict[str, Any], reason: str,
                        at: float) -> None:
        """Write a decision down (status "issued") — before the backend is asked to carry it out."""
        ticket = check.integer(ticket, "ticket")
        if not isinstance(kind, str) or not 0 < len(kind) <= 32:
            raise LoomInputError(f"decision kind must be a short name (got {kind!r})", field="kind")
        payload = check.json_object(payload, "payload")
        at = check.time_s(at)
        with self._write() as c:
            try:  # the ticket is the primary key: a repeat fails here (no lookup before every insert; the
                # failed insert aborts the transaction, which is rolled back: a repeated ticket is a bug)
                c.execute(decisions.insert().values(ticket=ticket, kind=kind, job_id=job_id, payload=payload,
                                                    reason=str(reason), status="issued", issued_at=at))
            except sa.exc.IntegrityError:
                raise StoreError(f"decision ticket {ticket} is already recorded (tickets must be unique)") from None
            self._emit(c, at, "decision", job_id, self._tenant_of(c, job_id),
                       {"ticket": ticket, "kind": kind, "reason": str(reason), "payload": payload})

    def answer_decision(self, ticket: int, status: str, reason: str | None, at: float) -> None:
        """The backend's answer to a decision: accepted, then done or failed (with why)."""
        status = check.choice(status, DECISION_STATUSES[1:], "status")
        at = check.time_s(at)
        with self._write() as c:
            row = c.execute(sa.select(decisions).where(decisions.c.ticket == ticket)).first()
            if row is None:
                raise StoreError(f"answer '{status}' to decision ticket {ticket}, which was never recorded")
            if row.status == status:
                return
            if status not in _NEXT[row.status]:
                raise StoreError(f"decision ticket {ticket} is already {row.status}; it cannot become {status}")
            c.execute(decisions.update().where(decisions.c.ticket == ticket)
                      .values(status=status, answered_at=at, answer_reason=reason))
            self._emit(c, at, "answer", row.job_id, self._tenant_of(c, row.job_id),
                       {"ticket": ticket, "kind": row.kind, "status": status, "reason": reason})

    def open_decisions(self) -> list[DecisionRow]:
        """Decisions issued or accepted but not yet done or failed, oldest first."""
        q = sa.select(decisions).where(decisions.c.status.in_(OPEN_DECISION_STATUSES)).order_by(decisions.c.ticket)
        with self._read() as c:
            return [to_decision(r) for r in c.execute(q).all()]

    def decision(self, ticket: int) -> DecisionRow | None:
        if isinstance(ticket, bool) or not isinstance(ticket, int):
            return None
        with self._read() as c:
            r = c.execute(sa.select(decisions).where(decisions.c.ticket == ticket)).first()
        return None if r is None else to_decision(r)

    def decisions_of(self, job_id: str) -> list[DecisionRow]:
        if not check.is_identifier(job_id):
            return []
        q = sa.select(decisions).where(decisions.c.job_id == job_id).order_by(decisions.c.ticket)
        with self._read() as c:
            return [to_decision(r) for r in c.execute(q).all()]

    def recent_decisions(self, limit: int = 100) -> list[DecisionRow]:
        """The newest decisions, newest first (the dashboard's list)."""
        q = sa.select(decisions).order_by(decisions.c.ticket.desc()).limit(check.limit(limit))
        with self._read() as c:
            return [to_decision(r) for r in c.execute(q).all()]

    def max_ticket(self) -> int:
        """The highest recorded ticket (0 when none): a restart's ticket counter can start above it."""
        with self._read() as c:
            return c.execute(sa.select(sa.func.max(decisions.c.ticket))).scalar() or 0

    def transitions_of(self, job_id: str) -> list[TransitionRow]:
        if not check.is_identifier(job_id):
            return []
        q = sa.select(transitions).where(transitions.c.job_id == job_id).order_by(transitions.c.id)
        with self._read() as c:
            return [TransitionRow(r.id, r.job_id, r.old, r.new, r.at, r.event) for r in c.execute(q).all()]
