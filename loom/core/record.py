"""The run record: what the core did and saw, in order, for reports and replay.

Reports, `summary.json` and `decisions.jsonl` read this record — never a
policy object or a backend's internals. It holds

* every decision with its time, ticket and reason (when decision logging is on),
* every lifecycle transition (time, job, from, to, the event that caused it),
* every node event (down, up, drained) and every failed decision answer.

Transitions are kept column-wise (sealed into NumPy chunks as they accumulate:
a million of them cost 16 MB and no work for the garbage collector); readers
get `Transition` objects built on demand.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from loom.core.decisions import Decision
from loom.core.lifecycle import JobState


@dataclass(frozen=True, slots=True)
class Transition:
    at: float
    job_id: str
    old: JobState
    new: JobState
    event: str  # what caused it, readable: "start decision", "JobFinished", "node n12 failed" …


class TransitionLog:
    """Every lifecycle transition of a run, in order, column-wise: times, and a code packing job
    key, event, old and new state. The hot loop appends to two plain lists (two C calls per
    transition); `compact()` seals them into NumPy chunks every `CHUNK` transitions, so a long run
    holds 16 bytes per transition and nothing for the garbage collector to walk."""

    __slots__ = ("_at", "_chunks", "_code", "_event_ids", "_events", "ids")
    CHUNK = 1 << 16

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids  # job ids by job key (the core appends as it learns of jobs)
        self._at: list[float] = []
        self._code: list[int] = []  # key << 32 | event << 8 | old << 4 | new
        self._chunks: list[tuple[np.ndarray, np.ndarray]] = []  # sealed (at, code) columns
        self._events: list[str] = []
        self._event_ids: dict[str, int] = {}

    def event_id(self, event: str) -> int:
        eid = self._event_ids.get(event)
        if eid is None:
            eid = self._event_ids[event] = len(self._events)
            self._events.append(event)
        return eid

    def add(self, at: float, key: int, old: JobState, new: JobState, event: str) -> None:
        self._at.append(at)
        self._code.append(key << 32 | self.event_id(event) << 8 | old << 4 | new)

    def coder(self, old: JobState, new: JobState, event: str) -> tuple[object, object, int]:
        """For the hot loop: (append time, append code, the code without its key) of one fixed transition,
        so recording it is two appends: `at(t); code(key << 32 | rest)`."""
        return self._at.append, self._code.append, self.event_id(event) << 8 | old << 4 | new

    def compact(self) -> None:
        """Seal the appended transitions into a NumPy chunk once there are `CHUNK` of them (cheap to call often)."""
        if len(self._at) >= self.CHUNK:
            self._chunks.append((np.array(self._at, dtype=np.float64), np.array(self._code, dtype=np.int64)))
            self._at.clear()  # cleared in place: the appenders handed out by `coder` stay valid
            self._code.clear()

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """(times, codes) of every transition so far, in order."""
        ats = [c[0] for c in self._chunks] + [np.array(self._at, dtype=np.float64)]
        codes = [c[1] for c in self._chunks] + [np.array(self._code, dtype=np.int64)]
        return np.concatenate(ats), np.concatenate(codes)

    def __len__(self) -> int:
        return sum(len(c[0]) for c in self._chunks) + len(self._at)

    def _decode(self, at: float, code: int) -> Transition:
        return Transition(at, self.ids[code >> 32], JobState((code >> 4) & 15), JobState(code & 15),
                          self._events[(code >> 8) & 0xFFFFFF])

    def __getitem__(self, i: int) -> Transition:
        ats, codes = self.columns()
        return self._decode(float(ats[i]), int(codes[i]))

    def __iter__(self) -> Iterator[Transition]:
        ats, codes = self.columns()
        return (self._decode(a, c) for a, c in zip(ats.tolist(), codes.tolist()))

    def since(self, start: int) -> list[Transition]:
        """The transitions from number `start` on, in order: what a live world has not yet passed
        on (to its store) since it last looked. Decodes only those, not the whole log."""
        out: list[Transition] = []
        offset = 0
        for ats, codes in self._chunks:
            end = offset + len(ats)
            if end > start:
                first = max(0, start - offset)
                out.extend(self._decode(a, c) for a, c in zip(ats[first:].tolist(), codes[first:].tolist()))
            offset = end
        first = max(0, start - offset)
        out.extend(self._decode(a, c) for a, c in zip(self._at[first:], self._code[first:]))
        return out

    def of_job(self, key: int) -> list[Transition]:
        ats, codes = self.columns()
        rows = np.flatnonzero((codes >> 32) == key)
        return [self._decode(a, c) for a, c in zip(ats[rows].tolist(), codes[rows].tolist())]


@dataclass(frozen=True, slots=True)
class NodeEventRecord:
    at: float
    node: str
    kind: str  # down | up | drained
    cause: str = ""


@dataclass
class RunRecord:
    log_decisions: bool = True
    ids: list[str] = field(default_factory=list)  # job ids by job key
    decisions: list[tuple[float, Decision]] = field(default_factory=list)
    transitions: TransitionLog = field(init=False)
    node_events: list[NodeEventRecord] = field(default_factory=list)
    failed_decisions: list[tuple[float, Decision, str]] = field(default_factory=list)  # (at, decision, reason)
    stale_events: int = 0  # observations about jobs in a state that no longer expects them
    policy_name: str = ""
    policy_stats: dict[str, object] = field(default_factory=dict)  # the policy's own counters, at the end

    def __post_init__(self) -> None:
        self.transitions = TransitionLog(self.ids)

    def transitions_of(self, job_id: str) -> list[Transition]:
        return self.transitions.of_job(self.ids.index(job_id))
