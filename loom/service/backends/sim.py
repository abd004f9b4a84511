"""The simulator's world as a backend of the live engine (`--backend sim`).

`SimBackend` carries out decisions on its exact work ledger and schedules what
happens next (finishes, launches, repairs, job failures) on a heap that the
simulator's own loop pops. Here the engine's clock pops it instead: every time
the heap's earliest entry falls due, `call_at` runs it. With the wall clock the
service schedules an emulated cluster in real time (jobs "run" for their trace
durations; nothing is started); with a virtual clock the live engine replays the
simulator's scenarios, which is how the engine itself is checked against the
simulator (same decisions, same times).
"""

from __future__ import annotations

import math
import threading
from typing import Any

from loom.core.backend import EventSink
from loom.core.decisions import Decision
from loom.core.jobs import Job
from loom.core.protocols import SpeedModel
from loom.hardware.topology import Topology
from loom.service.clock import Clock, WallClock
from loom.sim.backend import SimBackend
from loom.sim.events import EventKind, EventQueue
from loom.sim.launch import LaunchModel
from loom.sim.speed import TraceDurationSpeed
from loom.workload.job import JobSpec

FINISH, LAUNCH, TIMER = int(EventKind.FINISH), int(EventKind.LAUNCH), int(EventKind.TIMER)
REPAIR, JOB_FAILURE = int(EventKind.NODE_REPAIR), int(EventKind.JOB_FAILURE)


class SimLiveBackend(SimBackend):
    """The simulated world on the engine's clock; jobs join as the engine learns of them."""

    name = "sim"

    def __init__(self, topology: Topology, *, clock: Clock | None = None, speed: SpeedModel | None = None,
                 launch: LaunchModel | None = None, hang_watchdog_s: float = 600.0,
                 infra_repair_s: float = 0.85 * 86400) -> None:
        super().__init__(topology, speed or TraceDurationSpeed(), EventQueue(), None, launch, hang_watchdog_s,
                         infra_repair_s)
        self.clock: Clock = clock if clock is not None else WallClock()
        self._lock = threading.RLock()
        self._armed: set[float] = set()

    def describe(self, job: Job | JobSpec, launch: Any = None) -> None:
        """A job the engine added (in key order, as the core numbers them): its ledger starts."""
        if not isinstance(job, Job):
            raise TypeError("the sim backend needs the core's Job (its key numbers the ledger)")
        with self._lock:
            if job.key != len(self.jobs):
                raise ValueError(f"job {job.job_id} has key {job.key}, expected {len(self.jobs)}")
            self.jobs.append(job)
            self._by_id[job.job_id] = job
            self.remaining_work.append(float(job.spec.duration or 0.0))
            self.rate.append(0.0)
            self.since.append(0.0)
            self.version.append(0)
            self.alloc.append(None)

    def bind(self, sink: EventSink) -> None:
        super().bind(sink)

    def apply(self, decision: Decision, ticket: int, at: float) -> None:
        with self._lock:
            super().apply(decision, ticket, at)
            self._arm()

    def set_timer(self, at: float, token: tuple) -> None:
        with self._lock:
            super().set_timer(at, token)
            self._arm()

    def fail_node(self, name: str, repair_after: float = math.inf) -> None:
        with self._lock:
            self.node_fails(self.topology.node_index[name], repair_after, self.clock.now())
            self._arm()

    def repair_node(self, name: str) -> None:
        with self._lock:
            self.node_repaired(self.topology.node_index[name], self.clock.now())
            self._arm()

    def _arm(self) -> None:
        heap = self.events.heap
        if heap and heap[0][0] not in self._armed:
            at = heap[0][0]
            self._armed.add(at)
            self.clock.call_at(at, lambda: self._pump(at))

    def _pump(self, armed: float) -> None:
        """Carry out what fell due, at its own time (the simulator's order at equal times)."""
        import heapq

        with self._lock:
            self._armed.discard(armed)
            now, heap = self.clock.now(), self.events.heap
            while heap and heap[0][0] <= now:
                at, kind, _, payload = heapq.heappop(heap)
                if kind == FINISH:
                    self.finish_due(payload, at)
                elif kind == LAUNCH:
                    self.launch_due(payload, at)
                elif kind == TIMER:
                    self.sink(payload)
                elif kind == REPAIR:
                    self.node_repaired(payload.node, at)
                elif kind == JOB_FAILURE:
                    self.failure_due(payload, at)
            self._arm()

    def busy(self) -> bool:
        return False  # everything it does happens at the instants it scheduled
