"""Event kinds and the heap. At equal times lower kinds go first: finishes and
repairs free capacity before arrivals ask for it."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class EventKind(IntEnum):
    FINISH = 0
    NODE_REPAIR = 1
    NODE_FAILURE = 2
    ANNOUNCE = 3
    ARRIVAL = 4
    TIMER = 5
    ROUND = 6
    JOB_FAILURE = 7  # a job-level failure plan fires (after a finish at the same instant)


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """A node goes down at `at` for `repair_after` seconds (inf = never back)."""

    node: str
    at: float
    repair_after: float = float("inf")


class EventQueue:
    """Min-heap of (time, kind, seq, payload); seq keeps order deterministic."""

    __slots__ = ("_seq", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    def push(self, time: float, kind: EventKind, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (time, int(kind), self._seq, payload))

    def peek_time(self) -> float:
        return self.heap[0][0] if self.heap else float("inf")

    def pop(self) -> tuple[float, int, int, Any]:
        return heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)
