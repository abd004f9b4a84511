"""Decisions are data: what a policy wants done, each with a readable reason.

The core checks each against the job lifecycle, records it in the run record
and hands the ones that act on jobs (all but Reserve, Release, Timer) to the backend, which
answers asynchronously; reservations and timers are the core's own. A run
can so be explained and replayed decision by decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.core.plan import ParallelPlan
from loom.hardware.state import Allocation


@dataclass(frozen=True, slots=True, init=False)
class Start:
    job_id: str
    allocation: Allocation
    reason: str
    plan: ParallelPlan | None = None

    def __init__(self, job_id: str, allocation: Allocation, reason: str, plan: ParallelPlan | None = None) -> None:
        # through the slots' own setters: the generated frozen `__init__` goes through
        # `object.__setattr__`, which costs twice as much per field (every start builds one)
        _start_job_id(self, job_id)
        _start_allocation(self, allocation)
        _start_reason(self, reason)
        _start_plan(self, plan)


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop a running job, keep its progress, put it back in the queue."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True, init=False)
class Resume:
    """Restart a preempted job (possibly elsewhere) from its saved progress."""

    job_id: str
    allocation: Allocation
    reason: str
    plan: ParallelPlan | None = None

    def __init__(self, job_id: str, allocation: Allocation, reason: str, plan: ParallelPlan | None = None) -> None:
        _resume_job_id(self, job_id)  # as Start's
        _resume_allocation(self, allocation)
        _resume_reason(self, reason)
        _resume_plan(self, plan)


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move a running job to other GPUs of the same count; it makes no progress
    for `pause_s` (checkpoint, transfer, restart) while holding the new GPUs.
    `plan` is how it runs there (None: the backend's/speed model's choice); a
    job's plan never outlives the allocation it was chosen for, so a Migrate
    without one drops the old plan (tuned for other GPUs)."""

    job_id: str
    allocation: Allocation
    reason: str
    pause_s: float = 0.0
    plan: ParallelPlan | None = None


@dataclass(frozen=True, slots=True)
class Resize:
    """Give a running job a different number of GPUs, keeping its logical world
    size; `pause_s` as for Migrate (the checkpoint-restart cost of rescaling).
    `plan` as for Migrate: without one the job's old plan is dropped."""

    job_id: str
    allocation: Allocation
    reason: str
    plan: ParallelPlan | None = None
    pause_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Reserve:
    """Hold nodes until `until` for a (usually announced, not yet arrived) job."""

    reservation_id: int
    nodes: tuple[int, ...]
    until: float
    for_job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Release:
    reservation_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Timer:
    """Ask for a scheduling round at time `at` (e.g. a reservation's deadline)."""

    at: float
    reason: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop a job for good (its owner withdrew it). Issued by the core, not by policies."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Diagnose:
    """Find out why a failed job failed (its logs: rules, then retrieval over past failures).
    Issued by the core's recovery pipeline; the backend answers with `JobDiagnosed`."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Localize:
    """Test `nodes` (the failed job's) for faulty ones — Acme's two rounds of pairwise
    all-gathers. Issued by the recovery pipeline; the backend answers with `FaultsLocalized`."""

    job_id: str
    nodes: tuple[int, ...]
    reason: str


Decision = Start | Preempt | Resume | Migrate | Resize | Reserve | Release | Timer | Cancel | Diagnose | Localize
_START_FIELDS = ("job_id", "allocation", "reason", "plan")
_start_job_id, _start_allocation, _start_reason, _start_plan = (Start.__dict__[f].__set__ for f in _START_FIELDS)
_resume_job_id, _resume_allocation, _resume_reason, _resume_plan = (Resume.__dict__[f].__set__ for f in _START_FIELDS)
