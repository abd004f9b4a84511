"""After a restart: make the engine's picture match the store and the backend.

The store says what was acknowledged and decided; the backend says what still runs. A job the
backend still runs is adopted where it runs (never launched twice); a job that should be running
but is not goes back to the queue (its next start resumes from its newest checkpoint); waiting
jobs are queued again; decisions written but never answered are answered: done if their effect
is there (the job runs), failed otherwise, so nothing stays half-made. Processes a previous
service started for jobs the store has ended are reported, not touched."""

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
    out.orphans = sorted(set(survivors) - known)
    for job_id in out.orphans:
        log.warning("job %s is still running on the backend but the store has it ended; not adopted", job_id)
    return out


def _answer_open(store: Any, engine: Any, survivors: Iterable[str], now: float, out: Reconciled) -> None:
    running = set(survivors)
    for d in store.open_decisions():
        if d.kind in STARTS and d.job_id in running:
            store.answer_decision(d.ticket, "done", "found running after a service restart", now)
            out.decisions_done.append(d.ticket)
        else:
            store.answer_decision(d.ticket, "failed", "the service restarted before it was carried out", now)
            out.decisions_failed.append(d.ticket)
