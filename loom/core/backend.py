"""The backend contract: what the core asks of a world that runs jobs.

A backend (the simulator, local processes, Slurm, Kubernetes) does three things:

1. **Carries out job decisions** (`apply`): Start, Resume, Preempt, Migrate,
   Resize, Cancel, each with a ticket. It answers every ticket asynchronously
   through the sink: `DecisionAccepted`, then `DecisionDone` or
   `DecisionFailed(reason)`; a Start/Resume is done when the job runs (also
   reported as `JobStarted`), a Preempt/Cancel when the job stopped with a
   durable checkpoint (`JobStopped`). Decisions arrive in the order the core
   issued them, and a backend carries out those that touch the same GPUs in
   that order: a Start on GPUs freed by a Preempt in the same round runs only
   after that job stopped.
2. **Reports observations** as typed events (`loom.core.events`): job started,
   progress/throughput, stopped, finished, failed (with a cause, fatal or
   not, and the nodes it blames), restarted in place; node down, up, drained.
   Reporting at-least-once is fine: the core drops stale duplicates.
3. **Owns the inventory**: the nodes it can run on, as a `Topology` with a
   generation number. When nodes join or leave it reports a new generation
   (`InventoryChanged`); the core rebuilds its static tree once per
   generation and resolves whatever named a vanished node.

It also keeps time for the core (`set_timer`). The core never asks a backend
how far a job has got; what it knows is what was reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from loom.core.decisions import Decision
from loom.core.events import Event
from loom.hardware.topology import Topology

EventSink = Callable[[Event], None]


def handler_for(sink: EventSink, event_type: type) -> EventSink:
    """What to call for events of one type: the sink's own handler when it offers a table of them
    (the core's sink does; calling it directly saves a dispatch per event in a hot loop), else the
    sink itself. Same effect either way; a harness that wraps the sink gets every event."""
    handlers = getattr(sink, "handlers", None)
    return handlers.get(event_type, sink) if isinstance(handlers, dict) else sink


@dataclass(frozen=True, slots=True)
class Inventory:
    """The nodes a backend can run jobs on, at one generation."""

    topology: Topology
    generation: int = 0


@dataclass(frozen=True, slots=True)
class InventoryChanged:
    """Nodes joined or left: a new generation of the inventory (an event like the others)."""

    inventory: Inventory
    at: float


@runtime_checkable
class Backend(Protocol):
    name: str

    def bind(self, sink: EventSink) -> None:
        """Where to report events (the core's `observe`); called once before anything else."""
        ...

    def inventory(self) -> Inventory: ...

    def apply(self, decision: Decision, ticket: int, at: float) -> None:
        """Carry out a job decision; answer `ticket` through the sink (now or later)."""
        ...

    def set_timer(self, at: float, token: tuple) -> None:
        """Report `TimerFired(at, token)` at time `at`."""
        ...
