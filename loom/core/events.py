"""What a backend tells the core: typed observations, and answers to decisions.

A backend reports what it saw — a job started, made progress, stopped,
finished or failed; a node went down, came back or was drained; a decision was
accepted, carried out or could not be — and the core turns each into lifecycle
transitions and state changes. Every event carries the time it happened (`at`,
the backend's clock: simulated seconds or wall-clock epoch seconds).

Observations about a job the core no longer expects (a finish after the job
was preempted, a duplicate start) are *stale*: the core records and drops
them, so backends may report at-least-once.

A job event may carry the `ticket` of the decision it completes (a start, a
stop, a move): it then also answers that decision, so a backend that sees the
outcome at once sends one event instead of two. Events are named tuples:
immutable and typed, and cheap enough for the simulator's hot loop.
"""

from __future__ import annotations

from typing import NamedTuple


class JobStarted(NamedTuple):
    """The job runs (the answer to a Start/Resume once its processes are up).

    `rate`: throughput in reference seconds of work per second (1.0 = as fast as
    recorded in its trace), if the backend knows it; `progress`: work already
    done (reference seconds) when it started."""

    job_id: str
    at: float
    rate: float | None = None
    progress: float | None = None
    ticket: int | None = None  # the Start/Resume it answers


class JobProgress(NamedTuple):
    """A progress or throughput sample (also sent when a migrate or resize changes the speed)."""

    job_id: str
    at: float
    rate: float | None = None
    progress: float | None = None
    ticket: int | None = None  # the Migrate/Resize it answers


class JobStopped(NamedTuple):
    """A stop asked by the core (preempt, cancel) is complete: its checkpoint is durable, GPUs free."""

    job_id: str
    at: float
    progress: float | None = None
    ticket: int | None = None  # the Preempt/Cancel it answers


class JobFinished(NamedTuple):
    job_id: str
    at: float
    progress: float | None = None  # work done (reference seconds), if the backend knows it


class JobFailed(NamedTuple):
    """The job's processes died.

    `fatal`: a job-level error (script, framework) that a restart would repeat:
    the job ends FAILED. Otherwise an infrastructure failure: the job goes to
    recovery (or back to the queue) with the progress of its last durable
    checkpoint; `nodes` are the nodes the backend blames, if it knows."""

    job_id: str
    at: float
    cause: str
    fatal: bool = False
    nodes: tuple[int, ...] = ()
    progress: float | None = None
    diagnose: bool = False  # the backend does not know why: the recovery pipeline asks (`Diagnose`)


class JobDiagnosed(NamedTuple):
    """Why a failed job failed (the answer to a `Diagnose`): Acme's taxonomy — `category`
    infrastructure | framework | script | LossSpike | unknown, the `error_type` (NCCLTimeout,
    KeyError, ...), whether a restart can help, the root cause and a mitigation, for people."""

    job_id: str
    at: float
    category: str
    error_type: str
    recoverable: bool
    summary: str = ""
    mitigation: str = ""
    ticket: int | None = None  # the Diagnose it answers


class FaultsLocalized(NamedTuple):
    """The nodes a `Localize` found faulty (none: the nodes passed; the failure was transient)."""

    job_id: str
    at: float
    faulty: tuple[int, ...]
    summary: str = ""
    ticket: int | None = None  # the Localize it answers


class JobRestarted(NamedTuple):
    """The backend restarted a stuck job in place from its last checkpoint (a hang caught
    by its watchdog): it keeps its GPUs; `rate` and `progress` as for JobStarted."""

    job_id: str
    at: float
    cause: str
    rate: float | None = None
    progress: float | None = None


class NodeDown(NamedTuple):
    """A node stopped working (hardware, network, the cluster manager says NotReady)."""

    node: int
    at: float
    cause: str = ""


class NodeUp(NamedTuple):
    node: int
    at: float


class NodeDrained(NamedTuple):
    """An operator drained a node: running jobs may finish, nothing new is placed there."""

    node: int
    at: float
    cause: str = ""


class DecisionAccepted(NamedTuple):
    ticket: int
    at: float


class DecisionDone(NamedTuple):
    ticket: int
    at: float


class DecisionFailed(NamedTuple):
    """The backend could not carry out a decision; `reason` is for a person to read.

    For a Start/Resume it means the launch failed: the job goes back to the queue
    (the core's lifecycle), its GPUs are freed."""

    ticket: int
    at: float
    reason: str


class TimerFired(NamedTuple):
    """A wake-up the core asked for (reservation expiry, recovery step, a policy's Timer)."""

    at: float
    token: tuple


JobEvent = (JobStarted | JobProgress | JobStopped | JobFinished | JobFailed | JobRestarted | JobDiagnosed
            | FaultsLocalized)
NodeEvent = NodeDown | NodeUp | NodeDrained
AckEvent = DecisionAccepted | DecisionDone | DecisionFailed
Event = JobEvent | NodeEvent | AckEvent | TimerFired
