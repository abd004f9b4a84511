"""The live engine: the scheduling core on a real-time clock, fed from other threads.

The simulator drives the core (`loom.core.scheduler.Scheduler`) from a heap of
future events; the live engine drives the same core, unchanged, from what
actually happens. One engine thread owns the core. Everything else reaches it
through a thread-safe inbox:

* the API's threads call `submit`, `cancel`, `adopt` and `call` (run a function
  on the engine thread, e.g. to read the core consistently);
* the backend reports from its own threads through `post` (it is bound to it).

The engine thread takes the whole inbox at once, applies the backend's events
first and then the commands (as the simulator applies an instant's world
events before its arrivals), and runs a policy round when something changed —
a submission, a cancel, a job ending or failing, a node event, a timer, a
launch that took time to come up — and on a periodic timer while jobs wait. A
round that frees capacity (a preemption, a release, a resize) is followed by
another, as in the simulator. An answer that comes back at the very instant
its decision was issued does not call for a round of its own: in the simulator
such answers are part of carrying the decision out. The core's timers
(`set_timer`) are the engine's; a timer fires as `TimerFired` at its time.

Hooks, all plain callables run on the engine thread, let a store persist what
happens (it is the source of truth; the engine keeps no state of its own that
survives it):

* `on_decision(decision, ticket, at)` — **before** a job decision is handed to
  the backend (write-ahead); if it raises, the decision is not carried out and
  is answered `DecisionFailed` (the core puts the job back). Decisions the core
  keeps to itself (Reserve, Release, Timer) are passed with `ticket=None` after
  they took effect.
* `on_answer(ticket, status, at, reason)` — the backend answered a ticket:
  status "accepted", "done" or "failed" (`reason` for "failed").
* `on_transition(transition)` — a lifecycle transition (`loom.core.record.Transition`).
* `on_event(event)` — every backend event, before the core applies it.
* `on_round(at, decisions, seconds, queue)` — a policy round ran (decision latency).
* `after_step()` — a turn of the loop ended (a store may commit what it grouped).
* `intake(engine)` — at the start of a turn after `wake()` (and at least every `round_interval`):
  take new submissions and cancels from the store and pass them to `submit`/`cancel`.

Errors in the engine thread (a policy bug, a hook that raised) stop the engine;
`run_until` and `stop` raise them in the caller's thread.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from loom.core.backend import Backend, EventSink, Inventory, InventoryChanged
from loom.core.decisions import (
    Cancel,
    Decision,
    Diagnose,
    Localize,
    Migrate,
    Preempt,
    Release,
    Resize,
    Resume,
    Start,
)
from loom.core.events import (
    DecisionAccepted,
    DecisionDone,
    DecisionFailed,
    Event,
    FaultsLocalized,
    JobDiagnosed,
    JobFailed,
    JobFinished,
    JobProgress,
    JobRestarted,
    JobStarted,
    JobStopped,
    NodeDown,
    NodeDrained,
    NodeUp,
    TimerFired,
)
from loom.core.jobs import Job
from loom.core.lifecycle import TERMINAL
from loom.core.protocols import PLACERS, POLICIES, Placer, Policy
from loom.core.record import Transition
from loom.core.scheduler import Scheduler
from loom.hardware.state import Allocation
from loom.service.clock import Clock, WallClock
from loom.workload.job import JobSpec

JOB_DECISIONS = (Start, Resume, Preempt, Migrate, Resize, Cancel, Diagnose, Localize)
FREES_CAPACITY = (Preempt, Release, Resize)
MAX_FOLLOWUPS = 64  # follow-up rounds at one instant, as in the simulator
# answers: the core learns from them that a decision was carried out
_ANSWER_WITH_TICKET = (JobStarted, JobStopped, JobProgress, JobDiagnosed, FaultsLocalized)


class LiveEngine:
    """The core on a clock. `policy` and `placer` are registry names or objects (the simulator's
    own, `loom.core.protocols.POLICIES/PLACERS`); `recovery` a `RecoveryConfig` or None;
    `round_interval`: seconds between periodic rounds while jobs wait (None: only on changes)."""

    def __init__(self, backend: Backend, policy: Policy | str, placer: Placer | str = "first-fit", *,
                 clock: Clock | None = None, recovery: Any = None,
                 runtime_estimate: Callable[[Job], float] | None = None,
                 round_interval: float | None = 30.0,
                 on_decision: Callable[[Decision, int | None, float], None] | None = None,
                 on_answer: Callable[[int, str, float, str | None], None] | None = None,
                 on_transition: Callable[[Transition], None] | None = None,
                 on_event: Callable[[Event], None] | None = None,
                 on_round: Callable[[float, list[Decision], float, int], None] | None = None,
                 intake: Callable[[LiveEngine], None] | None = None,
                 after_step: Callable[[], None] | None = None) -> None:
        self.clock: Clock = clock if clock is not None else WallClock()
        self.backend = backend
        self.policy = POLICIES.get(policy)() if isinstance(policy, str) else policy
        self.placer = PLACERS.get(placer)() if isinstance(placer, str) else placer
        self.round_interval = round_interval
        self.paused = False  # an operator's hold: no policy rounds (running jobs go on; events are applied)
        self.on_decision, self.on_answer, self.on_transition = on_decision, on_answer, on_transition
        self.on_event, self.on_round = on_event, on_round
        self.intake = intake
        self.after_step = after_step
        self._intake_due = True
        self._last_intake = float("-inf")
        self.lock = threading.RLock()  # held while the core is touched; readers may take it too
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._wake = threading.Event()
        self._timers: list[tuple[float, int, tuple]] = []
        self._seq = itertools.count()
        self._issued_at: dict[int, float] = {}  # ticket → when its decision was handed over
        self._seen_transitions = 0
        self._seen_decisions = 0
        self._dirty = False
        self._last_round = float("-inf")
        self._thread: threading.Thread | None = None
        self._active = False  # a loop (thread or run_until) is running
        self._inline = False  # the inbox is being applied outside the loop (no loop runs)
        self._submitted: set[str] = set()
        self._stopping = False
        self.error: BaseException | None = None  # what stopped the engine (it takes nothing more)
        self._error_raised = False
        self.rounds = 0
        seam = _Seam(self, backend)
        self.core = Scheduler(seam, self.policy, self.placer, recovery=recovery,
                              runtime_estimate=runtime_estimate)
        backend.bind(self.post)  # the backend reports to the inbox, never to the core directly

    # ------------------------------------------------------------------ thread-safe entry points
    def post(self, event: Event) -> None:
        """A backend event (any thread). Applied on the engine thread; inline when no loop runs."""
        self._put(("event", event))

    def submit(self, spec: JobSpec, launch: Any = None) -> Future[bool]:
        """Queue a job (any thread): added to the core if new (with `launch`, what the backend runs:
        see `loom.service.specs.LaunchSpec`), then submitted. The future says whether the core
        accepted it (False: rejected, e.g. larger than any pool)."""
        return self._put(("submit", spec, launch))

    def add(self, spec: JobSpec, launch: Any = None) -> Future[Job]:
        """Make a job known without queueing it (a later `submit(spec)` queues it)."""
        return self._put(("add", spec, launch))

    def cancel(self, job_id: str, reason: str = "cancelled by its owner") -> Future[bool]:
        """Withdraw a job (any thread); False if it is unknown or already ended."""
        return self._put(("cancel", job_id, reason))

    def adopt(self, spec: JobSpec, allocation: Allocation | Mapping[str, int], *, launch: Any = None,
              progress: float | None = None, first_start: float | None = None) -> Future[Job]:
        """Take over a job the backend found running after a restart (see `Scheduler.adopt`):
        `allocation` as an `Allocation` or {node name: GPUs}."""
        return self._put(("adopt", spec, allocation, launch, progress, first_start))

    def call(self, fn: Callable[[Scheduler], Any]) -> Future[Any]:
        """Run `fn(core)` on the engine thread (a consistent read, a reconciliation step)."""
        return self._put(("call", fn))

    def wake(self) -> None:
        """Something was written for the engine (any thread): run `intake` and look at the inbox now,
        not at the next periodic turn."""
        self._intake_due = True
        self._wake.set()

    def _put(self, item: tuple[Any, ...]) -> Future[Any]:
        future: Future[Any] = Future()
        if self.error is not None:
            future.set_exception(RuntimeError(f"the engine stopped: {self.error}"))
            return future
        self._inbox.append((*item, future))
        self._wake.set()
        if not self._active:  # nobody runs the loop: apply it now, in this thread
            with self.lock:
                if not self._active and not self._inline:  # not re-entrant: an outer drain takes it
                    self._inline = True
                    try:
                        while self._inbox:
                            self._drain(self.clock.now())
                            self._publish()
                    finally:
                        self._inline = False
        return future

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        """Run the loop on a thread of its own (the service)."""
        if self._thread is not None:
            return
        self._stopping = False
        self._active = True
        self._thread = threading.Thread(target=self._loop_guarded, args=(None, None), name="loom-engine",
                                        daemon=True)
        self._thread.start()

    def stop(self, *, raise_error: bool = True) -> None:
        """Stop the loop (its thread, or a `run_until` in progress) and wait for it."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        self._active = False
        if raise_error:
            self._raise_error()

    def run_until(self, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
        """Run until `predicate()` (evaluated on the engine thread, between steps) holds; raise
        `TimeoutError` after `timeout` real seconds, or the engine's error if it stopped on one.
        Runs the loop in this thread unless `start` gave it one."""
        deadline = time.monotonic() + timeout
        if self._thread is not None:
            while True:
                if self.error is not None:
                    self.stop()  # raises it
                try:
                    met = self.call(lambda _core: bool(predicate())).result(
                        timeout=max(0.001, deadline - time.monotonic()))
                except FutureTimeout:
                    met = False
                except RuntimeError:
                    if self.error is not None:
                        self.stop()
                    raise
                if met:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"condition not met within {timeout:g} s")
                time.sleep(0.01)
        if self.error is not None:
            raise RuntimeError(f"the engine stopped: {self.error}") from self.error
        self._stopping = False
        self._active = True
        try:
            self._loop_guarded(predicate, deadline)
        finally:
            self._active = False
        self._raise_error()
        if not predicate():
            raise TimeoutError(f"condition not met within {timeout:g} s (engine time {self.clock.now():g})")

    def _raise_error(self) -> None:
        """Hand the error that stopped the engine to the caller, once."""
        if self.error is not None and not self._error_raised:
            self._error_raised = True
            raise self.error

    def _loop_guarded(self, predicate: Callable[[], bool] | None, deadline: float | None) -> None:
        try:
            self._loop(predicate, deadline)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of run_until/stop
            self.error = exc
            self._fail_futures(exc)
        finally:
            if self._thread is not None and self._thread is threading.current_thread():
                self._active = False

    def _loop(self, predicate: Callable[[], bool] | None, deadline: float | None) -> None:
        clock = self.clock
        while not self._stopping:
            clock.settle(self._wake)
            with self.lock:
                self.step()
                if predicate is not None and predicate():
                    return
            if deadline is not None and time.monotonic() > deadline:
                return
            clock.wait(self._wake, self._next_deadline())

    def step(self) -> None:
        """One turn of the loop (engine thread): timers due, the inbox, a round if called for."""
        now = self.clock.now()
        self._fire_timers(now)
        if self.intake is not None and (self._intake_due or now >= self._last_intake + (self.round_interval or 5.0)):
            self._intake_due, self._last_intake = False, now
            self.intake(self)  # its submits and cancels land in the inbox, applied just below
        self._drain(now)
        if self._periodic_due(now):
            self._dirty = True
        if self._dirty and not self.paused:
            self._rounds(now)
        self._publish()
        if self.after_step is not None:
            self.after_step()

    # ------------------------------------------------------------------ the inbox
    def _drain(self, now: float) -> None:
        self._wake.clear()
        items: list[tuple[Any, ...]] = []
        while self._inbox:
            items.append(self._inbox.popleft())
        if not items:
            return
        # the backend's observations first, then the commands (the simulator's order at an instant);
        # observations in time order, and at one instant in the simulator's order of kinds, answers
        # last and by ticket (what the simulator would have seen; backends report from several threads)
        events = _in_order([item for item in items if item[0] == "event"])
        for item in events:
            self._observe(item[1])
            item[-1].set_result(None)
        for item in items:
            if item[0] != "event":
                self._command(item, now)

    def _observe(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)
        self._note_answer(event)
        self.core.observe(event)

    def _note_answer(self, event: Event) -> None:
        """Answers go to `on_answer`; an event calls for a round unless it answers, at once, a
        decision issued at that same instant (the simulator's synchronous answers)."""
        ticket = getattr(event, "ticket", None)
        status = None
        if isinstance(event, DecisionAccepted):
            status = "accepted"
        elif isinstance(event, DecisionFailed):
            status = "failed"
        elif isinstance(event, DecisionDone) or (isinstance(event, _ANSWER_WITH_TICKET) and ticket is not None):
            status = "done"
        if status is None:
            if not (isinstance(event, JobProgress) and ticket is None):  # a progress sample changes nothing
                self._dirty = True
            return
        if self.on_answer is not None:
            self.on_answer(ticket, status, event.at, _answer_text(event, self.core.topology.node_names))  # type: ignore[arg-type]
        if status == "accepted":
            return
        issued = self._issued_at.pop(ticket, None)  # type: ignore[arg-type]
        if status == "failed" or issued is None or event.at > issued:
            self._dirty = True

    def _command(self, item: tuple[Any, ...], now: float) -> None:
        kind, future = item[0], item[-1]
        core = self.core
        try:
            if kind == "submit":
                _, spec, launch, _ = item
                if spec.job_id in self._submitted:
                    raise ValueError(f"job '{spec.job_id}' was already submitted")
                job = core.jobs.get(spec.job_id) or self._add(spec, launch)
                self._submitted.add(spec.job_id)
                result: Any = core.submit(job, now)
                self._dirty = True
            elif kind == "add":
                _, spec, launch, _ = item
                result = self._add(spec, launch)
            elif kind == "cancel":
                _, job_id, reason, _ = item
                result = core.cancel(job_id, reason, now)
                self._dirty = self._dirty or result
            elif kind == "adopt":
                _, spec, allocation, launch, progress, first_start, _ = item
                job = core.jobs.get(spec.job_id) or self._add(spec, launch)
                if not isinstance(allocation, Allocation):
                    index = core.topology.node_index
                    allocation = Allocation(tuple(index[n] for n in allocation),
                                            tuple(int(g) for g in allocation.values()))
                core.adopt(job, allocation, now, progress=progress, first_start=first_start)
                self._submitted.add(spec.job_id)
                reattach = getattr(self.backend, "reattach", None)
                if reattach is not None:  # the backend watches its processes again
                    reattach(job, launch)
                result = job
                self._dirty = True
            elif kind == "call":
                result = item[1](core)
            else:  # pragma: no cover - a bug in this module
                raise AssertionError(kind)
        except Exception as exc:  # noqa: BLE001 - the caller's mistake, handed back to the caller
            future.set_exception(exc)
            return
        future.set_result(result)

    def _add(self, spec: JobSpec, launch: Any) -> Job:
        job = self.core.add(spec)
        describe = getattr(self.backend, "describe", None)
        if describe is not None:  # what the backend needs to run it (command, processes)
            describe(job, launch)
        return job

    def _fail_futures(self, exc: BaseException) -> None:
        while self._inbox:
            item = self._inbox.popleft()
            if not item[-1].done():
                item[-1].set_exception(RuntimeError(f"the engine stopped: {exc}"))

    # ------------------------------------------------------------------ rounds and timers
    def _rounds(self, now: float) -> None:
        """A round, and follow-ups while rounds free capacity (each after the instant settled)."""
        self._dirty = False
        for followup in range(MAX_FOLLOWUPS + 1):
            if followup:
                self.clock.settle(self._wake)
                now = self.clock.now()
                self._fire_timers(now)
                self._drain(now)
            decisions = self._round(now)
            if not decisions or not any(isinstance(d, FREES_CAPACITY) for d in decisions):
                break
        self._dirty = False

    def _round(self, now: float) -> list[Decision]:
        tick = time.perf_counter()
        decisions = self.core.round(now)
        self.rounds += 1
        self._last_round = now
        if self.on_round is not None:
            self.on_round(now, decisions, time.perf_counter() - tick, len(self.core.ctx.pending))
        self._publish()
        return decisions

    def _periodic_due(self, now: float) -> bool:
        ctx = self.core.ctx
        return bool(self.round_interval and (ctx.pending or ctx.reservations)
                    and now >= self._last_round + self.round_interval)

    def _next_deadline(self) -> float | None:
        times = []
        if self._timers:
            times.append(self._timers[0][0])
        ctx = self.core.ctx
        if self.round_interval and (ctx.pending or ctx.reservations):
            times.append(self._last_round + self.round_interval)
        return min(times) if times else None

    def set_timer(self, at: float, token: tuple) -> None:
        """The core's wake-ups (through the seam): `TimerFired(at, token)` at `at`."""
        heapq.heappush(self._timers, (at, next(self._seq), token))
        self._wake.set()

    def _fire_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            at, _, token = heapq.heappop(self._timers)
            self._observe(TimerFired(at, token))

    # ------------------------------------------------------------------ hooks
    def _publish(self) -> None:
        """Hand new transitions and the core's own decisions to the hooks."""
        record = self.core.record
        self._publish_transitions()
        if len(record.decisions) > self._seen_decisions:
            fresh_decisions = record.decisions[self._seen_decisions:]
            self._seen_decisions = len(record.decisions)
            if self.on_decision is not None:
                for at, d in fresh_decisions:
                    if not isinstance(d, JOB_DECISIONS):
                        self.on_decision(d, None, at)

    def _publish_transitions(self) -> None:
        record = self.core.record
        if self.on_transition is not None and len(record.transitions) > self._seen_transitions:
            fresh = record.transitions.since(self._seen_transitions)
            self._seen_transitions += len(fresh)
            for t in fresh:
                self.on_transition(t)

    def _apply(self, decision: Decision, ticket: int, at: float) -> None:
        """The core hands a job decision to the backend: write it ahead, then carry it out. The
        transitions that led to it (the end that freed its GPUs) go first, in the same commit: a
        restart must never find the decision carried out and the GPUs' previous job still running."""
        self._issued_at[ticket] = at
        self._publish_transitions()
        if self.on_decision is not None:
            try:
                self.on_decision(decision, ticket, at)
            except Exception as exc:  # noqa: BLE001 - not recorded: not carried out
                self.post(DecisionFailed(ticket, at, f"the decision could not be recorded: {exc}"))
                return
        self.backend.apply(decision, ticket, at)

    # ------------------------------------------------------------------ views
    def unfinished(self) -> list[Job]:
        """Jobs that have not ended (engine thread, or under `lock`)."""
        return [j for j in self.core.jobs.values() if j.state not in TERMINAL]

    def idle(self) -> bool:
        """Every job ended and every decision answered (engine thread, or under `lock`)."""
        return not self.unfinished() and not self.core.unanswered


def _answer_text(event: Event, names: list[str]) -> str | None:
    """What an answer says, for the decision log: a failure's reason, a recovery step's finding."""
    if isinstance(event, JobDiagnosed):
        verdict = "recoverable" if event.recoverable else "not recoverable"
        return f"{event.category}/{event.error_type} ({verdict}): {event.summary}".rstrip(": ")
    if isinstance(event, FaultsLocalized):
        found = ", ".join(names[n] for n in event.faulty) or "none"
        return f"faulty: {found}" + (f" — {event.summary}" if event.summary else "")
    return getattr(event, "reason", None)


_RANK = {JobFinished: 0, NodeUp: 1, JobFailed: 2, NodeDown: 2, NodeDrained: 2, InventoryChanged: 2,
         TimerFired: 5, JobRestarted: 7}


def _event_order(item: tuple[Any, ...]) -> tuple[float, int, int]:
    event = item[1]
    ticket = getattr(event, "ticket", None)
    return (event.at, _RANK.get(type(event), 8), ticket if ticket is not None else 0)


def _in_order(items: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Events in the simulator's order at an instant (`_event_order`), except that what one job
    reported keeps the order it was reported in: a job that came up and died at once is seen to
    start, then to fail (sorted by kind alone, the failure would come first and the core would
    take it for a launch that never came up, and launch the job again)."""
    last: dict[str, tuple[float, int, int]] = {}
    keyed = []
    for arrival, item in enumerate(items):
        key = _event_order(item)
        job = getattr(item[1], "job_id", None)
        if job is not None:
            key = max(key, last.get(job, key))
            last[job] = key
        keyed.append((key, arrival, item))
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [item for _, _, item in keyed]


class _Seam:
    """The backend as the core sees it: decisions go through the engine's write-ahead hook, timers
    to the engine's own heap, events come back through the engine's inbox (not the core's sink)."""

    def __init__(self, engine: LiveEngine, backend: Backend) -> None:
        self.engine, self.backend = engine, backend
        self.name = backend.name

    def bind(self, sink: EventSink) -> None:
        return None  # the engine binds the real backend to its inbox

    def inventory(self) -> Inventory:
        return self.backend.inventory()

    def apply(self, decision: Decision, ticket: int, at: float) -> None:
        self.engine._apply(decision, ticket, at)

    def set_timer(self, at: float, token: tuple) -> None:
        self.engine.set_timer(at, token)


__all__ = ["InventoryChanged", "LiveEngine"]
