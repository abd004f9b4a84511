"""What the store hands out: frozen rows, decoupled from SQLAlchemy's result objects.

Callers (API threads, the engine thread) keep rows after the connection that read them
is back in the pool, so rows are plain values. Times are float epoch seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loom.core.lifecycle import JobState

SUBMITTED = "SUBMITTED"  # in the store, not yet taken in by the engine (not a core state)
JOB_STATES = frozenset({SUBMITTED, *(s.name for s in JobState)})
TERMINAL_STATES = frozenset({"FINISHED", "FAILED", "REJECTED", "CANCELLED"})
NODE_STATES = ("up", "down", "drained")
DECISION_STATUSES = ("issued", "accepted", "done", "failed")
OPEN_DECISION_STATUSES = ("issued", "accepted")


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    admin: bool
    created_at: float


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: str
    tenant: str
    spec: dict[str, Any]  # as submitted, with its job_id filled in
    state: str  # SUBMITTED or a JobState name
    seq: int  # submission number: increasing in commit order
    submitted_at: float
    cancel_requested: bool
    allocation: dict[str, Any] | None  # {"nodes": [names], "gpus": [counts]}
    plan: dict[str, Any] | None
    updated_at: float
    idempotency_key: str | None = None
    cancel_handled: bool = False


@dataclass(frozen=True, slots=True)
class TransitionRow:
    id: int
    job_id: str
    old: str
    new: str
    at: float
    event: str


@dataclass(frozen=True, slots=True)
class DecisionRow:
    ticket: int
    kind: str
    job_id: str | None
    payload: dict[str, Any]
    reason: str
    status: str  # issued | accepted | done | failed
    issued_at: float
    answered_at: float | None
    answer_reason: str | None


@dataclass(frozen=True, slots=True)
class ReservationRow:
    reservation_id: int
    nodes: tuple[str, ...]
    until: float
    for_job: str
    reason: str
    created_at: float
    released_at: float | None
    release_reason: str | None


@dataclass(frozen=True, slots=True)
class EventRow:
    seq: int  # global, increasing in commit order: a stream's resume point
    at: float
    kind: str  # submitted | cancel_requested | transition | decision | answer | node | inventory | reservation | release
    job_id: str | None
    tenant: str | None  # the job's tenant; None for cluster events (admins only)
    data: dict[str, Any]
