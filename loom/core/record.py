"""The run record: what the core did and saw, in order, for reports and replay.

Reports, `summary.json` and `decisions.jsonl` read this record — never a
policy object or a backend's internals. It holds

* every decision with its time, ticket and reason (when decision logging is on),
* every lifecycle transition (time, job, from, to, the event that caused it),
* every node event (down, up, drained) and every failed decision answer.

Transitions are kept column-wise in typed arrays (a million of them cost a
few megabytes and no work for the garbage collector); readers get
`Transition` objects built on demand.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

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
    """Every lifecycle transition of a run, in order, in two typed arrays: times, and a code
    packing job key, event, old and new state (two appends per transition in the hot loop)."""

    __slots__ = ("_event_ids", "_events", "at", "code", "ids")

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids  # job ids by job key (the core appends as it learns of jobs)
        self.at = array("d")
        self.code = array("q")  # key << 32 | event << 8 | old << 4 | new
        self._events: list[str] = []
        self._event_ids: dict[str, int] = {}

    def event_id(self, event: str) -> int:
        eid = self._event_ids.get(event)
        if eid is None:
            eid = self._event_ids[event] = len(self._events)
            self._events.append(event)
        return eid

    def add(self, at: float, key: int, old: JobState, new: JobState, event: str) -> None:
        self.at.append(at)
        self.code.append(key << 32 | self.event_id(event) << 8 | old << 4 | new)

    def coder(self, old: JobState, new: JobState, event: str) -> tuple[object, object, int]:
        """For the hot loop: (append time, append code, the code without its key) of one fixed transition,
        so recording it is two appends: `at(t); code(key << 32 | rest)`."""
        return self.at.append, self.code.append, self.event_id(event) << 8 | old << 4 | new

    def __len__(self) -> int:
        return len(self.at)

    def __getitem__(self, i: int) -> Transition:
        code = self.code[i]
        return Transition(self.at[i], self.ids[code >> 32], JobState((code >> 4) & 15), JobState(code & 15),
                          self._events[(code >> 8) & 0xFFFFFF])

    def __iter__(self) -> Iterator[Transition]:
        return (self[i] for i in range(len(self.at)))

    def of_job(self, key: int) -> list[Transition]:
        return [self[i] for i, code in enumerate(self.code) if code >> 32 == key]


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
