"""The job lifecycle: every state a job can be in and the only legal moves.

The core applies transitions from what a backend reports (or what a policy or
user decides); backends never set a state. An illegal move is a bug in a
backend or in the core and fails loudly, naming the job, both states and the
event that asked for it.

```
ANNOUNCED ─► PENDING ─► STARTING ─► RUNNING ─► FINISHED
                │  ▲        │ ▲        │  │
                │  └────────┘ │        │  └─► FAILED
                │   launch    │        ▼
                │   failed    │     STOPPING ─► SUSPENDED ─► STARTING …
                ▼             │        │
            REJECTED      RECOVERING ◄─┘ (node lost: detect → diagnose → localise → replace)
                                          RECOVERING ─► STARTING (restart) | SUSPENDED (handed back)
any non-terminal ─► CANCELLED (through STOPPING when it holds GPUs)
```
"""

from __future__ import annotations

from enum import IntEnum


class JobState(IntEnum):
    ANNOUNCED = 0  # known ahead of submission (a planned pretraining job), not yet queued
    PENDING = 1  # queued, never ran
    RUNNING = 2
    FINISHED = 3
    REJECTED = 4  # can never run here (e.g. larger than the cluster)
    FAILED = 5  # ended by a job-level error (script, framework) or a launch that cannot succeed
    RECOVERING = 6  # hit by a failure, out of the queue while recovery runs (ctx.held: its survivors)
    STARTING = 7  # GPUs committed, the backend is launching it (image pull, model load)
    STOPPING = 8  # asked to stop (preempt / cancel); GPUs given back once the backend says it stopped
    SUSPENDED = 9  # queued again after running: resumes from its checkpoint
    CANCELLED = 10  # withdrawn by its owner


TERMINAL = frozenset({JobState.FINISHED, JobState.FAILED, JobState.REJECTED, JobState.CANCELLED})

_S = JobState
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.ANNOUNCED: frozenset({_S.PENDING, _S.REJECTED, _S.CANCELLED}),
    _S.PENDING: frozenset({_S.STARTING, _S.REJECTED, _S.CANCELLED}),
    # a launch can fail (back to the queue, or for good), be cancelled or lose a node
    _S.STARTING: frozenset({_S.RUNNING, _S.PENDING, _S.SUSPENDED, _S.STOPPING, _S.FAILED}),
    _S.RUNNING: frozenset({_S.STOPPING, _S.FINISHED, _S.FAILED, _S.RECOVERING, _S.SUSPENDED}),
    # back to PENDING when it was stopped before its first launch came up
    _S.STOPPING: frozenset({_S.SUSPENDED, _S.PENDING, _S.CANCELLED, _S.FINISHED, _S.FAILED}),
    _S.SUSPENDED: frozenset({_S.STARTING, _S.CANCELLED}),
    _S.RECOVERING: frozenset({_S.STARTING, _S.SUSPENDED, _S.CANCELLED, _S.FAILED}),
    _S.FINISHED: frozenset(),
    _S.FAILED: frozenset(),
    _S.REJECTED: frozenset(),
    _S.CANCELLED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the lifecycle does not allow: a bug in a backend or the core, never a user's mistake."""

    def __init__(self, job_id: str, old: JobState, new: JobState, event: str) -> None:
        allowed = ", ".join(s.name for s in sorted(TRANSITIONS[old])) or "none (terminal)"
        super().__init__(f"job '{job_id}': illegal transition {old.name} → {new.name} on {event} "
                         f"(from {old.name} the lifecycle allows: {allowed})")
        self.job_id, self.old, self.new, self.event = job_id, old, new, event


def check_transition(job_id: str, old: JobState, new: JobState, event: str) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(job_id, old, new, event)
