"""After a restart: make the engine's picture match the store and the backend.

The store says what was acknowledged and decided; the backend says what still runs. A job the
backend still runs is adopted where it runs (never launched twice); a job that should be running
but is not goes back to the queue (its next start resumes from its newest checkpoint); waiting
jobs are queued again; decisions written but never answered are answered: done if their effect
is there (the job runs), failed otherwise, so nothing stays half-made. A run the backend kept
after it ended (its end may not have been stored) is adopted like a running one and ends again at
once. Processes a previous service started for jobs the store has ended are reported, not touched."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loom.service.specs import job_spec, launch_spec
from loom.service.views import every_job

log = logging.getLogger("loom.service")
WAITING = ("PENDING", "SUSPENDED", "RECOVERING", "ANNOUNCED")
HOLDING = ("STARTING", "RUNNING", "STOPPING")
STARTS = ("start", "resume")


@dataclass
class Reconciled:
    adopted: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # should have been running, were not: requeued
    decisions_done: list[int] = field(default_factory=list)
    decisions_failed: list[int] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"restart: {len(self.adopted)} running job(s) adopted, {len(self.requeued)} queued again "
                f"({len(self.lost)} had stopped while the service was down), {len(self.decisions_done)} "
                f"unanswered decision(s) found carried out, {len(self.decisions_failed)} rolled back")


def reconcile(store: Any, engine: Any, backend: Any, now: float) -> Reconciled:
    out = Reconciled()
    survivors: dict[str, dict[str, int]] = backend.survivors() if hasattr(backend, "survivors") else {}
    rows = every_job(store, [*WAITING, *HOLDING])
    known = {row.job_id for row in rows}
    forget = getattr(backend, "forget_ended", None)
    if forget is not None:  # a kept record of an ended run whose end the store has (the job waits again) goes
        kept = backend.ended_runs()
        stored = [row.job_id for row in rows
                  if row.job_id in kept and row.state not in HOLDING and _end_stored(store, row.job_id, kept[row.job_id])]
        for job_id in forget(stored):
            survivors.pop(job_id, None)
    for row in rows:
        spec, launch = job_spec(row), launch_spec(row)
        if row.job_id in survivors:
            engine.adopt(spec, survivors[row.job_id], launch=launch).result(timeout=60)
            out.adopted.append(row.job_id)
            continue
        if row.state in HOLDING:
            store.record_transition(row.job_id, row.state, "PENDING", now,
                                    "service restarted: the job was not running any more")
            out.lost.append(row.job_id)
        elif row.state != "PENDING":
            store.record_transition(row.job_id, row.state, "PENDING", now, "service restarted: queued again")
        engine.submit(spec, launch=launch).result(timeout=60)
        out.requeued.append(row.job_id)
    _answer_open(store, engine, survivors, now, out)
    orphans = set(survivors) - known
    # runs that ended and whose end the store has: what the backend kept for a restart can go
    out.orphans = sorted(orphans - set(forget(sorted(orphans)) if forget is not None else ()))
    for job_id in out.orphans:
        log.warning("job %s is still running on the backend but the store has it ended; not adopted", job_id)
    return out


def _end_stored(store: Any, job_id: str, started_at: float | None) -> bool:
    """Does the store have the job leaving STARTING/RUNNING/STOPPING since the run started at
    `started_at`? If not (the service died before it stored even the start), the run is adopted."""
    if started_at is None:
        return True
    return any(t.old in HOLDING and t.new not in HOLDING and t.at >= started_at for t in store.transitions_of(job_id))


def _answer_open(store: Any, engine: Any, survivors: Iterable[str], now: float, out: Reconciled) -> None:
    running = set(survivors)
    for d in store.open_decisions():
        if d.kind in STARTS and d.job_id in running:
            store.answer_decision(d.ticket, "done", "found running after a service restart", now)
            out.decisions_done.append(d.ticket)
        else:
            store.answer_decision(d.ticket, "failed", "the service restarted before it was carried out", now)
            out.decisions_failed.append(d.ticket)
