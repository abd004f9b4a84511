"""The simulated world's future: a heap of typed events.

At equal times lower kinds go first: finishes and repairs free capacity
before arrivals ask for it. Payloads are typed: what the simulated world will
do (a job's finish or failure falls due, a launch completes, a node fails or
is repaired) and the core's wake-ups (`loom.core.events.TimerFired`).
"""

from __future__ import annotations

import heapq
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from loom.workload.faults import NodeFailure

__all__ = [
    "Announce",
    "EventKind",
    "EventQueue",
    "FailureDue",
    "FinishDue",
    "LaunchDue",
    "NodeFails",
    "NodeFailure",
    "NodeRepaired",
    "RoundDue",
]


class EventKind(IntEnum):
    FINISH = 0
    NODE_REPAIR = 1
    NODE_FAILURE = 2
    ANNOUNCE = 3
    ARRIVAL = 4
    TIMER = 5
    ROUND = 6
    JOB_FAILURE = 7  # a job-level failure plan fires (after a finish at the same instant)
    LAUNCH = 8  # a launch (container start, model load) completes or fails
    CANCEL = 9  # a user withdraws a job


class FinishDue(NamedTuple):
    """Job `key` finishes, unless its run segment changed since (`version`)."""

    key: int
    version: int


class FailureDue(NamedTuple):
    """Job `key`'s next planned failure fires, unless its run segment changed since."""

    key: int
    version: int


class LaunchDue(NamedTuple):
    """Job `key`'s launch for decision `ticket` completes (or fails), unless it was cancelled."""

    key: int
    version: int
    ticket: int


class NodeFails(NamedTuple):
    node: int
    repair_after: float


class NodeRepaired(NamedTuple):
    node: int


class Announce(NamedTuple):
    key: int


class Cancellation(NamedTuple):
    """A user cancels `job_id` (the sim's stand-in for `loom cancel`)."""

    job_id: str


class RoundDue(NamedTuple):
    reason: str  # "periodic" | "follow-up"


class EventQueue:
    """Min-heap of (time, kind, seq, payload); seq keeps order deterministic."""

    __slots__ = ("_seq", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    def push(self, time: float, kind: EventKind, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (time, int(kind), self._seq, payload))

    def pop(self) -> tuple[float, int, int, Any]:
        return heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)


def __getattr__(name: str) -> Any:
    """`NodeFailure`, re-exported from `loom.workload.faults` when asked for (a replay without
    failures need not load the fault models)."""
    if name == "NodeFailure":
        from loom.workload.faults import NodeFailure

        return NodeFailure
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

