"""The engine's hooks, writing to the store: every job decision before it is carried out
(write-ahead), every answer, every lifecycle transition with the job's allocation, reservations;
and the service's metrics as they happen.

Group commit: answers and transitions are kept in memory and written, in order, in one
transaction with the next job decision (which must be durable before the backend acts) or at the
end of the engine's turn (`after_step`), whichever comes first. A crash can lose the last turn's
answers and transitions, never a decision or a submission; the restart's reconciliation rebuilds
them from what the backend runs (`loom.service.reconcile`).

Tickets: the core numbers its decisions from 0 in each process; the store keeps every ticket a
service ever issued, so this process's tickets are offset past the largest one stored."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from loom.core.decisions import Decision, Release, Reserve, Timer
from loom.core.events import (
    DecisionFailed,
    FaultsLocalized,
    JobFailed,
    NodeDown,
    NodeDrained,
    NodeUp,
)
from loom.core.lifecycle import JobState
from loom.core.record import Transition

HOLDS_GPUS = frozenset({JobState.STARTING, JobState.RUNNING, JobState.STOPPING})


class StoreRecorder:
    def __init__(self, store: Any, metrics: Any, node_names: list[str]) -> None:
        self.store, self.metrics, self.names = store, metrics, node_names
        self.offset = store.max_ticket() + 1
        self.engine: Any = None  # set once the engine exists (the hooks read its core's jobs)
        self._pending: list[tuple[Any, ...]] = []  # (method, args) to write at the next commit
        self._written: dict[str, tuple[Any, Any]] = {}  # job → the allocation and plan last written
        self._ended: list[str] = []  # jobs whose run ended, in the transitions being written
        # told, after each commit, which jobs' run ends are now stored (the backend drops what it
        # kept to report them again after a crash: `LocalBackend.forget_ended`)
        self.on_stored_ends: Any = None

    def ticket(self, core_ticket: int) -> int:
        return self.offset + core_ticket

    def allocation(self, alloc: Any) -> dict[str, Any] | None:
        if alloc is None:
            return None
        return {"nodes": [self.names[n] for n in alloc.nodes], "gpus": [int(g) for g in alloc.gpus]}

    # ------------------------------------------------------------------ hooks (engine thread)
    def on_decision(self, decision: Decision, ticket: int | None, at: float) -> None:
        kind = type(decision).__name__.lower()
        self.metrics.decision(kind)
        if ticket is None:
            self._bookkeeping(decision, at)
            return
        payload: dict[str, Any] = {}
        alloc = getattr(decision, "allocation", None)
        if alloc is not None:
            payload["allocation"] = self.allocation(alloc)
        plan = getattr(decision, "plan", None)
        if plan is not None:
            payload["plan"] = _plan(plan)
        nodes = getattr(decision, "nodes", None)
        if nodes is not None:
            payload["nodes"] = [self.names[n] for n in nodes]
        with self.store.transaction():
            self._write_pending()
            self.store.record_decision(self.ticket(ticket), kind, getattr(decision, "job_id", None), payload,
                                       decision.reason, at)
        self._stored()

    def _bookkeeping(self, decision: Decision, at: float) -> None:
        if isinstance(decision, Reserve):
            self.store.record_reservation(decision.reservation_id, [self.names[n] for n in decision.nodes],
                                          decision.until, decision.for_job, decision.reason, at)
        elif isinstance(decision, Release):
            self.store.release_reservation(decision.reservation_id, at, decision.reason)
        elif not isinstance(decision, Timer):
            raise TypeError(f"unexpected decision without a ticket: {decision!r}")

    def on_answer(self, ticket: int, status: str, at: float, reason: str | None) -> None:
        self.metrics.answer(status)
        if status != "accepted":  # "accepted" is transient: a restart treats issued and accepted alike
            self._pending.append((self.store.answer_decision, self.ticket(ticket), status, reason, at))

    def on_transition(self, t: Transition) -> None:
        self.metrics.transition(t.old.name, t.new.name)
        job = self.engine.core.jobs.get(t.job_id) if self.engine is not None else None
        self._pending.append((self.store.record_transition, t.job_id, t.old.name, t.new.name, t.at, t.event))
        if t.new in HOLDS_GPUS and job is not None:  # the allocation as it is now, read at once
            self._allocation(t.job_id, self.allocation(job.allocation), _plan(job.plan))
        elif t.old in HOLDS_GPUS and t.new not in HOLDS_GPUS:
            self._allocation(t.job_id, None, None)
            self._pending.append((self._ended.append, t.job_id))

    def _allocation(self, job_id: str, allocation: dict[str, Any] | None, plan: dict[str, Any] | None) -> None:
        """Write a job's allocation when it changed (STARTING → RUNNING keeps it)."""
        if self._written.get(job_id) == (allocation, plan):
            return
        if allocation is None:
            self._written.pop(job_id, None)
        else:
            self._written[job_id] = (allocation, plan)
        self._pending.append((self.store.set_allocation, job_id, allocation, plan))

    def after_step(self) -> None:
        if self._pending:
            with self.store.transaction():
                self._write_pending()
            self._stored()

    def _stored(self) -> None:
        """The transaction committed: the run ends it held are durable."""
        ended, self._ended = self._ended, []
        if ended and self.on_stored_ends is not None:
            self.on_stored_ends(ended)

    def _write_pending(self) -> None:
        """Everything kept back, in order; runs of transitions as one batch."""
        pending, self._pending = self._pending, []
        batch: list[tuple[Any, ...]] = []
        for write, *args in pending:
            if write == self.store.record_transition:
                batch.append(tuple(args))
                continue
            if batch:
                self.store.record_transitions(batch)
                batch = []
            write(*args)
        if batch:
            self.store.record_transitions(batch)

    def on_event(self, event: Any) -> None:
        """Node state changes go to the store; failures the backend reports count as backend errors."""
        if isinstance(event, (NodeDown, NodeUp, NodeDrained)):
            state = {NodeDown: "down", NodeUp: "up", NodeDrained: "drained"}[type(event)]
            self._pending.append((self.store.set_node_state, self.names[event.node], state, event.at))
        elif isinstance(event, FaultsLocalized):  # the core cordons what recovery found faulty
            for node in event.faulty:
                self._pending.append((self.store.set_node_state, self.names[node], "drained", event.at))
        elif isinstance(event, DecisionFailed):
            self.metrics.backend_error("decision_failed")
        elif isinstance(event, JobFailed):
            self.metrics.backend_error("job_failed_fatal" if event.fatal else "job_failed")

    def on_round(self, at: float, decisions: list[Decision], seconds: float, queue: int) -> None:
        self.metrics.round_seconds(seconds)

    def hooks(self) -> dict[str, Any]:
        return {"on_decision": self.on_decision, "on_answer": self.on_answer,
                "on_transition": self.on_transition, "on_round": self.on_round, "after_step": self.after_step,
                "on_event": self.on_event}


def _plan(plan: Any) -> dict[str, Any] | None:
    if plan is None:
        return None
    try:
        return {k: v for k, v in asdict(plan).items() if isinstance(v, (int, float, str, bool)) or v is None}
    except TypeError:
        return {"dp": getattr(plan, "dp", None), "tp": getattr(plan, "tp", None), "pp": getattr(plan, "pp", None)}
