"""The local backend: jobs as local process groups on emulated nodes (`loom.core.backend`).

N emulated nodes of G "GPUs" (an inventory file, `loom.service.backends.inventory`).
A Start or Resume runs the job's command through `loom run` (or, for a job with only
a duration, the built-in sleep job, `sleepjob.py`) as a process group of its own,
with environment variables naming the emulated nodes and GPUs it got; a Preempt or
Cancel asks it to checkpoint and stop through the runtime's control channel, and
after `grace_s` without an answer sends SIGTERM, then SIGKILL, to the group; a
Migrate or Resize goes through the control channel too (`loom run` restarts the
job itself, at the new process count under the same logical world; the sleep job
is restarted here). An exit with status 0 is `JobFinished`; any other exit is
`JobFailed` with the last lines of the job's log (fatal for a job's own error
status, not for a signal); no progress for `hang_s` is a hang: the job is killed
and failed. Every ticket is answered.

Decisions that touch the same GPUs are carried out in the order they came: a
launch waits until the processes of the jobs that held its GPUs have exited.
`fail_node(name)` emulates a node failure (its jobs' processes are killed, the
core hears `JobFailed` and `NodeDown`); `repair_node`, `drain_node` likewise;
`make_faulty(name, kind)` a node that breaks without going down (its processes hang
or crash; a failure then comes with `diagnose=True`), for the core's recovery
pipeline, whose `Diagnose` and `Localize` steps run here (`faults.py`).

One monitor thread spawns, watches and signals processes; `apply` only records
what to do (and answers at once what needs no process). The backend never holds
its lock while it reports, so the engine may apply decisions while it reports.
`busy()` tells a virtual clock that something is under way at the current instant.
"""

from __future__ import annotations

import itertools
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loom.core.backend import EventSink, Inventory
from loom.core.decisions import (
    Cancel,
    Decision,
    Diagnose,
    Localize,
    Migrate,
    Preempt,
    Resize,
    Resume,
    Start,
)
from loom.core.events import (
    DecisionAccepted,
    DecisionFailed,
    Event,
    JobFailed,
    JobStopped,
    NodeDown,
    NodeDrained,
    NodeUp,
    TimerFired,
)
from loom.core.jobs import Job
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology
from loom.runtime.control import ControlClient
from loom.service.backends import runs as R
from loom.service.backends.faults import Faults
from loom.service.backends.inventory import (
    LocalInventory,
    LocalSettings,
    load_inventory,
)
from loom.service.backends.procs import EndedProc, Proc, read_json
from loom.service.backends.watch import Watching
from loom.service.clock import Clock, WallClock
from loom.workload.job import JobSpec

log = logging.getLogger("loom.service.local")


class LocalBackend(Watching, Faults):
    name = "local"

    def __init__(self, inventory: LocalInventory | Topology, *, root: str | Path | None = None,
                 clock: Clock | None = None, launch_delay: float | Callable[[JobSpec], float] | None = None,
                 grace_s: float | None = None, hang_s: float | None = None, poll_s: float | None = None,
                 env: dict[str, str] | None = None, python: str = sys.executable) -> None:
        if isinstance(inventory, LocalInventory):
            self.topology, settings = inventory.topology, inventory.settings
        else:
            self.topology, settings = inventory, LocalSettings()
        where = root if root is not None else settings.root
        if where is None:
            raise ValueError("the local backend needs a root directory for its jobs' files")
        self.layout = R.Layout(Path(where).resolve())
        for sub in ("runtime", "work", "logs", "runs"):
            (self.layout.root / sub).mkdir(parents=True, exist_ok=True)
        self.clock: Clock = clock if clock is not None else WallClock()
        delay = settings.launch_delay_s if launch_delay is None else launch_delay
        self.launch_delay: Callable[[JobSpec], float] = delay if callable(delay) else (lambda _s, d=delay: d)
        self.grace_s = settings.grace_s if grace_s is None else grace_s
        self.hang_s = settings.hang_s if hang_s is None else hang_s
        self.poll_s = settings.poll_s if poll_s is None else poll_s
        self.env = dict(env or {})
        self.python = python
        self.generation = 0
        self.sink: EventSink = lambda _e: None
        self._jobs: dict[str, tuple[JobSpec, Any]] = {}
        self._runs: dict[str, R.Run] = {}
        self._queue: list[tuple[R.Run, str]] = []  # launches and moves waiting for GPUs, in order
        self._free = [set(range(int(g))) for g in self.topology.node_gpus.tolist()]
        self._down: set[int] = set()
        self._order = itertools.count()
        self._lock = threading.RLock()
        self._outbox: list[Event] = []
        self._emit_lock = threading.Lock()
        self._wakeup = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.errors = 0
        self._init_faults()
        self.clock.watch(self.busy)

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> LocalBackend:
        return cls(load_inventory(path), **kwargs)

    # ------------------------------------------------------------------ protocol
    def bind(self, sink: EventSink) -> None:
        self.sink = sink
        if self._thread is None:
            self._thread = threading.Thread(target=self._monitor, name="loom-local", daemon=True)
            self._thread.start()

    def inventory(self) -> Inventory:
        return Inventory(self.topology, self.generation)

    def describe(self, job: Job | JobSpec, launch: Any = None) -> None:
        """What to run for a job (the engine calls this when it learns of one)."""
        spec = job.spec if isinstance(job, Job) else job
        self._jobs[spec.job_id] = (spec, launch)

    def set_timer(self, at: float, token: tuple) -> None:
        self.clock.call_at(at, lambda: self.sink(TimerFired(at, token)))

    def apply(self, decision: Decision, ticket: int, at: float) -> None:
        with self._lock:
            kind = type(decision)
            if kind in (Start, Resume):
                self._start(decision, ticket, at)  # type: ignore[arg-type]
            elif kind in (Preempt, Cancel):
                self._stop(decision, ticket, at)  # type: ignore[arg-type]
            elif kind in (Migrate, Resize):
                self._move(decision, ticket, at)  # type: ignore[arg-type]
            elif kind in (Diagnose, Localize):
                self._step(decision, ticket, at)  # type: ignore[arg-type]
            else:
                self._emit(DecisionFailed(ticket, at, f"the local backend does not carry out {kind.__name__}"))
        self._flush()
        self._wakeup.set()

    # ------------------------------------------------------------------ decisions
    def _refuse(self, ticket: int, at: float, what: str, job_id: str) -> None:
        self._emit(DecisionFailed(ticket, at, f"{what} of {job_id}: the job is not running here (it ended first)"))

    def _start(self, d: Start | Resume, ticket: int, at: float) -> None:
        known = self._jobs.get(d.job_id)
        if known is None:
            self._emit(DecisionFailed(ticket, at, f"unknown job {d.job_id}: nothing says what to run"))
            return
        if d.job_id in self._runs:
            self._emit(DecisionFailed(ticket, at, f"job {d.job_id} is already running here"))
            return
        down = [self.topology.node_names[n] for n in d.allocation.nodes if n in self._down]
        if down:
            self._emit(DecisionFailed(ticket, at, f"launch of {d.job_id}: node {down[0]} is down"))
            return
        spec, launch = known
        delay = float(self.launch_delay(spec))
        run = R.Run(d.job_id, spec, launch, d.allocation, ticket, "delay" if delay > 0 else "queued",
                    next(self._order), ready_at=at + delay)
        self._runs[d.job_id] = run
        self._emit(DecisionAccepted(ticket, at))
        if delay > 0:
            self.clock.call_at(at + delay, lambda: self._delay_over(run))
        else:
            self._queue.append((run, "launch"))

    def _delay_over(self, run: R.Run) -> None:
        with self._lock:
            if self._runs.get(run.job_id) is run and run.phase == "delay":
                run.phase = "queued"
                self._queue.append((run, "launch"))
        self._wakeup.set()

    def _stop(self, d: Preempt | Cancel, ticket: int, at: float) -> None:
        run = self._runs.get(d.job_id)
        kind = "preempt" if isinstance(d, Preempt) else "cancel"
        if run is None or run.phase == "dying" or run.stop is not None:
            self._refuse(ticket, at, type(d).__name__, d.job_id)
            return
        if run.phase in ("delay", "queued"):  # nothing runs yet: the launch is called off
            self._forget(run)
            self._emit(DecisionFailed(run.ticket, at, f"launch of {d.job_id} called off: {kind}"))  # type: ignore[arg-type]
            self._emit(JobStopped(d.job_id, at, R.work_done(run, self.layout), ticket))
        elif run.phase == "spawned" and run.answer == "start":  # launching: kill it, it never came up
            run.phase = "dying"
            run.after_exit = [DecisionFailed(run.ticket, at, f"launch of {d.job_id} called off: {kind}"),  # type: ignore[arg-type]
                              JobStopped(d.job_id, at, None, ticket)]
            run.proc.kill()  # type: ignore[union-attr]
        else:
            run.stop = (ticket, kind)
            if run.phase == "up":
                self._ask(run, "stop")

    def _move(self, d: Migrate | Resize, ticket: int, at: float) -> None:
        run = self._runs.get(d.job_id)
        what = "resize" if isinstance(d, Resize) else "migrate"
        if run is None or run.phase in ("dying", "delay", "queued") or run.stop is not None \
                or (run.phase == "spawned" and run.answer == "start"):
            self._refuse(ticket, at, type(d).__name__, d.job_id)
            return
        down = [self.topology.node_names[n] for n in d.allocation.nodes if n in self._down]
        if down:
            self._emit(DecisionFailed(ticket, at, f"{what} of {d.job_id}: node {down[0]} is down"))
            return
        run.moves.append((ticket, d.allocation, what))
        if run.phase == "up":  # else after the move under way
            self._next_move(run)

    def _next_move(self, run: R.Run) -> None:
        run.move = run.moves.pop(0)
        run.phase = "moving"
        self._queue.append((run, "move"))

    def _ask(self, run: R.Run, action: str, **args: Any) -> None:
        """A control request to the job (stop, migrate, resize); its answer is watched for."""
        try:
            run.seq = ControlClient(self.layout.runtime(), run.job_id).request(action, **args)
        except Exception as exc:  # noqa: BLE001 - no channel: stop it the hard way
            log.warning("job %s: control request %s failed (%s); signalling it", run.job_id, action, exc)
            run.seq = None
            run.proc.signal(signal.SIGTERM)  # type: ignore[union-attr]
            run.escalated = 1
        run.sent = time.monotonic()
        run.phase = "stopping" if action == "stop" else "moving"

    # ------------------------------------------------------------------ nodes
    def fail_node(self, name: str, cause: str = "emulated node failure") -> None:
        """The node goes down: its jobs' processes are killed; the core hears of each, then of the node."""
        with self._lock:
            node = self._node(name)
            if node in self._down:
                return
            self._down.add(node)
            at = self.clock.now()
            why = f"node {name} failed"
            for run in sorted(self._runs.values(), key=lambda r: r.order):
                nodes = set(run.allocation.nodes) | set(run.binding or ()) | set(run.next_binding or ())
                for _, alloc, _ in [*([run.move] if run.move else []), *run.moves]:
                    nodes |= set(alloc.nodes)
                if node not in nodes or run.phase == "dying":
                    continue
                self._kill_on_node(run, node, at, why)
            self._emit(NodeDown(node, at, cause))
        self._flush()
        self._wakeup.set()

    def _kill_on_node(self, run: R.Run, node: int, at: float, why: str) -> None:
        if run.phase in ("delay", "queued"):
            self._forget(run)
            self._emit(DecisionFailed(run.ticket, at, f"{why} during the launch"))  # type: ignore[arg-type]
            return
        progress = R.work_done(run, self.layout)
        if run.phase == "spawned" and run.answer == "start":
            self._emit(DecisionFailed(run.ticket, at, f"{why} during the launch"))  # type: ignore[arg-type]
        else:
            self._emit(JobFailed(run.job_id, at, why, nodes=(node,), progress=progress))
            for event in self._moves_failed(run, at, why):
                self._emit(event)
        if run.stop is not None:
            self._emit(JobStopped(run.job_id, at, progress, run.stop[0]))
        run.phase, run.after_exit = "dying", []
        self._dequeue(run)
        if run.proc is not None:
            run.proc.kill()

    def repair_node(self, name: str) -> None:
        with self._lock:
            node = self._node(name)
            self._clear_fault(node)
            if node not in self._down:
                return
            self._down.discard(node)
            self._emit(NodeUp(node, self.clock.now()))
        self._flush()
        self._wakeup.set()

    def drain_node(self, name: str, cause: str = "") -> None:
        with self._lock:
            self._emit(NodeDrained(self._node(name), self.clock.now(), cause))
        self._flush()

    def undrain_node(self, name: str) -> None:
        """An operator puts a drained node back in service (a node that is down stays down)."""
        with self._lock:
            node = self._node(name)
            if node in self._down:
                return
            self._emit(NodeUp(node, self.clock.now()))
        self._flush()
        self._wakeup.set()

    def _node(self, name: str) -> int:
        try:
            return self.topology.node_index[name]
        except KeyError:
            raise ValueError(f"unknown node '{name}' (nodes: {', '.join(self.topology.node_names[:8])}"
                             f"{', …' if self.topology.num_nodes > 8 else ''})") from None

    # ------------------------------------------------------------------ bookkeeping
    def _forget(self, run: R.Run, ended: int | None = None) -> None:
        """The run holds nothing any more: its GPUs go back, it leaves the queue. A run that `ended`
        on its own (its exit status) keeps its record, marked ended, until `forget_ended`."""
        for binding in (run.binding, run.next_binding):
            for node, gpus in (binding or {}).items():
                self._free[node] |= set(gpus)
        run.binding = run.next_binding = None
        self._dequeue(run)
        if self._runs.get(run.job_id) is run:
            del self._runs[run.job_id]
            if ended is None:
                self.layout.record(run.job_id).unlink(missing_ok=True)
            else:
                R.mark_ended(self.layout, run.job_id, ended)

    def ended_runs(self) -> dict[str, float | None]:
        """Run records kept after their runs ended (job id → when that run was started): a restarted
        service drops those whose end it has stored, and adopts the others to see them end again."""
        found: dict[str, float | None] = {}
        for path in sorted(self.layout.record("x").parent.glob("*.json")):
            data = read_json(path)
            if data and data.get("ended") is not None and self._revivable(data):
                started = data.get("started_at")
                found[str(data["job_id"])] = float(started) if isinstance(started, (int, float)) else None
        return found

    def forget_ended(self, job_ids: list[str]) -> list[str]:
        """The service has stored these jobs' ends: drop the records kept for them (only records
        marked ended: a later incarnation's record stays). Returns the jobs whose record went."""
        dropped = []
        with self._lock:
            for job_id in job_ids:
                path = self.layout.record(job_id)
                data = read_json(path)
                if data and data.get("ended") is not None and job_id not in self._runs:
                    path.unlink(missing_ok=True)
                    dropped.append(job_id)
        return dropped

    def _dequeue(self, run: R.Run) -> None:
        self._queue = [(r, w) for r, w in self._queue if r is not run]

    def _emit(self, event: Event) -> None:
        self._outbox.append(event)

    def _flush(self) -> None:
        """Report what was collected, in order, without holding the backend's lock."""
        with self._emit_lock:
            with self._lock:
                events, self._outbox = self._outbox, []
            for event in events:
                self.sink(event)

    # ------------------------------------------------------------------ after a restart
    def survivors(self) -> dict[str, dict[str, int]]:
        """Jobs a previous service left running here (their run records): job id → {node: GPUs}.
        A restarted service adopts these (`LiveEngine.adopt`) rather than launching them again;
        one that ended meanwhile is then reported as it ended (its exit status from its files)."""
        found: dict[str, dict[str, int]] = {}
        for path in sorted(self.layout.record("x").parent.glob("*.json")):
            data = read_json(path)
            if not data or not self._revivable(data) or not isinstance(data.get("gpus"), dict):
                continue
            if data["job_id"] not in self._runs:
                found[str(data["job_id"])] = {str(n): len(g) for n, g in data["gpus"].items()}
        return found

    def reattach(self, job: Job | JobSpec, launch: Any = None) -> None:
        """Watch a survivor's processes again (the engine adopted it): it holds its GPUs here."""
        spec = job.spec if isinstance(job, Job) else job
        data = read_json(self.layout.record(spec.job_id)) or {}
        if not self._revivable(data):
            where = self.layout.record(spec.job_id).parent
            raise LookupError(f"job {spec.job_id} left no run record in {where}")  # noqa: TRY004
        with self._lock:
            self._jobs.setdefault(spec.job_id, (spec, launch))
            binding = {self._node(n): tuple(int(g) for g in gpus) for n, gpus in data["gpus"].items()}
            nodes = tuple(sorted(binding))
            run = R.Run(spec.job_id, spec, self._jobs[spec.job_id][1],
                        Allocation(nodes, tuple(len(binding[n]) for n in nodes)), None, "up", next(self._order),
                        binding=binding, proc=_ended(data) or self._revive(data, spec.job_id))
            run.spawned_at = data.get("started_at")
            for node, gpus in binding.items():
                self._free[node] -= set(gpus)
            status = R.status(self.layout, spec.job_id)
            if run.sleep and isinstance(status.get("end"), (int, float)):
                run.end = float(status["end"])
                self.clock.call_at(run.end, self._wakeup.set)
            run.beat, run.reported = time.monotonic(), self.clock.now()
            self._runs[spec.job_id] = run
        self._wakeup.set()

    def _revivable(self, data: dict[str, Any]) -> bool:
        """A run record that names a live incarnation this backend can watch again."""
        return isinstance(data.get("pid"), int)

    def _revive(self, data: dict[str, Any], job_id: str) -> Proc:
        return Proc(int(data["pid"]), None, self.layout.job_dir(job_id))

    # ------------------------------------------------------------------ for clocks, tests, shutdown
    def busy(self) -> bool:
        """Something is under way at this instant: a process starting, stopping, moving, dying or
        due to finish; a launch whose delay is over waiting for GPUs; events not yet reported."""
        with self._lock:
            if self._outbox:
                return True
            now = self.clock.now()
            for run in self._runs.values():
                if run.phase in ("spawned", "stopping", "moving", "dying", "queued"):
                    return True
                if run.phase == "up" and run.end is not None and run.end <= now:
                    return True
            return False

    def running(self) -> dict[str, str]:
        """Job id → phase of every job holding or waiting for GPUs here."""
        with self._lock:
            return {job_id: run.phase for job_id, run in self._runs.items()}

    def close(self, *, kill: bool = True) -> None:
        """Stop watching; with `kill`, end every job's processes (a test's or a service's shutdown)."""
        self._closed = True
        self._wakeup.set()
        self._close_steps()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if kill:
            with self._lock:
                procs = [r.proc for r in self._runs.values() if r.proc is not None]
            for proc in procs:
                proc.kill()
            for proc in procs:
                deadline = time.monotonic() + 5
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)


def _ended(data: dict[str, Any]) -> EndedProc | None:
    """A record kept after its run ended: the end is reported again (the store may not have it)."""
    ended = data.get("ended")
    if isinstance(ended, dict) and isinstance(ended.get("exit_code"), int):
        return EndedProc(int(ended["exit_code"]))
    return None
