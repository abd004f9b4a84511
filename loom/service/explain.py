"""`explain`: why a job is where it is, or why it waits — from what the store holds (its decisions
with their reasons, its lifecycle transitions) and the inventory; and the node view."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from loom.service.schemas import (
    DecisionView,
    Explanation,
    NodeList,
    NodeView,
    TransitionView,
)
from loom.service.views import every_job, job_view

RUNNING_STATES = ("STARTING", "RUNNING", "STOPPING")


def explain_job(store: Any, row: Any) -> Explanation:
    decisions = [DecisionView(ticket=d.ticket, kind=d.kind, at=d.issued_at, reason=d.reason, status=d.status,
                              answer=d.answer_reason, payload=d.payload or {})
                 for d in store.decisions_of(row.job_id)]
    transitions = [TransitionView(old=t.old, new=t.new, at=t.at, event=t.event) for t in store.transitions_of(row.job_id)]
    return Explanation(job=job_view(row), summary=_summary(store, row, decisions, transitions),
                       decisions=decisions, transitions=transitions)


def _summary(store: Any, row: Any, decisions: list[DecisionView], transitions: list[TransitionView]) -> str:
    state = row.state
    last = decisions[-1] if decisions else None
    if state in RUNNING_STATES and row.allocation:
        where = ", ".join(f"{n}:{g}" for n, g in zip(row.allocation["nodes"], row.allocation["gpus"]))
        why = f" because: {last.reason}" if last is not None else ""
        return f"{state.lower()} on {where}{why}"
    if state in ("SUBMITTED", "PENDING", "SUSPENDED", "RECOVERING", "ANNOUNCED"):
        return _waiting(store, row, last)
    if transitions:
        end = transitions[-1]
        return f"{state.lower()} at {_when(end.at)} ({end.event})"
    return state.lower()


def _waiting(store: Any, row: Any, last: DecisionView | None) -> str:
    if row.state == "SUBMITTED":
        return "submitted; the scheduler has not taken it up yet"
    ahead = [j for j in every_job(store, ["PENDING", "SUSPENDED"]) if j.seq < row.seq]
    gpus = int(row.spec.get("gpus", 0))
    free = _free_by_type(store)
    allowed = row.spec.get("gpu_types") or ([row.spec["gpu_type"]] if row.spec.get("gpu_type") else None)
    usable = sum(n for t, n in free.items() if allowed is None or t in allowed)
    parts = [f"{row.state.lower()}: needs {gpus} GPU(s)"
             + (f" of type {' or '.join(allowed)}" if allowed else "") + f", {usable} free"]
    if ahead:
        parts.append(f"{len(ahead)} job(s) submitted earlier are waiting too")
    if last is not None and last.kind in ("preempt", "migrate", "resize"):
        parts.append(f"last decision: {last.kind} ({last.reason})")
    return "; ".join(parts)


def _free_by_type(store: Any) -> dict[str, int]:
    nodes = node_views(store).nodes
    free: dict[str, int] = defaultdict(int)
    for node in nodes:
        if node.state == "up":
            free[node.gpu_type] += node.free
    return dict(free)


def node_views(store: Any) -> NodeList:
    inventory = store.inventory()
    if inventory is None:
        return NodeList(generation=0, nodes=[])
    generation, nodes = inventory
    used: dict[str, int] = defaultdict(int)
    jobs: dict[str, list[str]] = defaultdict(list)
    for job in every_job(store, list(RUNNING_STATES)):
        for name, count in zip((job.allocation or {}).get("nodes", ()), (job.allocation or {}).get("gpus", ())):
            used[name] += int(count)
            jobs[name].append(job.job_id)
    views = [NodeView(name=n["name"], gpus=int(n["gpus"]), gpu_type=n["gpu_type"], state=n.get("state", "up"),
                      free=max(0, int(n["gpus"]) - used[n["name"]]) if n.get("state", "up") == "up" else 0,
                      switches=list(n.get("path") or ()), jobs=jobs[n["name"]])
             for n in nodes]
    return NodeList(generation=generation, nodes=views)


def _when(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
