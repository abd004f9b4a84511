"""Time for the live engine and its backends: the wall clock, or a virtual one for tests.

The engine and a backend share one clock. They read it (`now`), ask it to call
something at a time (`call_at`: a launch delay ends, a test's job arrives), and
the engine sleeps on it (`wait`) until its next deadline or until something is
posted to it. `settle` is the engine's "let this instant finish" before a policy
round: a no-op on the wall clock.

`VirtualClock` runs real processes on simulated time, so a scenario gives the
same times, to the bit, as the simulator: its time moves only when the world is
quiet — no process starting, stopping or due to exit, nothing posted to the
engine — and then jumps to the next deadline. Processes that need the time
(the built-in sleep job) read it from a file the clock rewrites at each jump.
Time spent launching or stopping processes is so invisible to the scenario:
the conformance suite's exact timings hold while jobs really run.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

Busy = Callable[[], bool]


class Clock(Protocol):
    def now(self) -> float: ...

    def call_at(self, at: float, fn: Callable[[], None]) -> None:
        """Call `fn` (from a clock thread, or the engine's) once time reaches `at`."""
        ...

    def wait(self, wake: threading.Event, until: float | None) -> None:
        """Block until `wake` is set or time reaches `until` (None: no deadline); may return early."""
        ...

    def settle(self, wake: threading.Event) -> None:
        """Block until what happens at the current instant has happened (virtual clocks)."""
        ...

    def watch(self, busy: Busy) -> None:
        """Register a predicate that is true while its owner has work in flight at this instant."""
        ...

    def close(self) -> None: ...


class WallClock:
    """Epoch seconds (`time.time`); `call_at` runs on one timer thread, in time order."""

    def __init__(self, source: Callable[[], float] = time.time) -> None:
        self._source = source
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def now(self) -> float:
        return self._source()

    def call_at(self, at: float, fn: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._heap, (at, next(self._seq), fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="loom-clock", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._heap or self._heap[0][0] > self.now()):
                    delay = self._heap[0][0] - self.now() if self._heap else None
                    self._cv.wait(timeout=None if delay is None else max(0.0, min(delay, 1.0)))
                if self._closed:
                    return
                _, _, fn = heapq.heappop(self._heap)
            fn()

    def wait(self, wake: threading.Event, until: float | None) -> None:
        timeout = None if until is None else max(0.0, until - self.now())
        wake.wait(timeout=min(timeout, 1.0) if timeout is not None else 1.0)

    def settle(self, wake: threading.Event) -> None:
        return None

    def watch(self, busy: Busy) -> None:
        return None

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


class VirtualClock:
    """Simulated seconds that advance only when every watcher is idle and nothing is posted.

    `file`: where the current time is written (atomically, as `repr(float)`) for processes
    that must follow it; `poll_s`: how often a busy world is looked at again (real seconds);
    `stall_s`: real seconds the world may stay busy at one instant before `settle` gives up
    with an error naming the clock's time (a process that never comes up or never exits)."""

    def __init__(self, start: float = 0.0, *, file: str | os.PathLike[str] | None = None,
                 poll_s: float = 0.001, stall_s: float = 60.0) -> None:
        self._t = float(start)
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._watchers: list[Busy] = []
        self.file = Path(file) if file is not None else None
        self.poll_s = poll_s
        self.stall_s = stall_s
        self._publish()

    def now(self) -> float:
        return self._t

    def call_at(self, at: float, fn: Callable[[], None]) -> None:
        with self._lock:
            heapq.heappush(self._heap, (max(at, self._t), next(self._seq), fn))

    def watch(self, busy: Busy) -> None:
        self._watchers.append(busy)

    def busy(self) -> bool:
        return any(w() for w in self._watchers)

    def settle(self, wake: threading.Event) -> None:
        deadline = time.monotonic() + self.stall_s
        while self.busy():
            if time.monotonic() > deadline:
                raise TimeoutError(f"virtual clock stuck at t={self._t:g}: the world stayed busy for "
                                   f"{self.stall_s:g} s of real time")
            time.sleep(self.poll_s)

    def wait(self, wake: threading.Event, until: float | None) -> None:
        """Return at once if something was posted; else, once the world is quiet, jump to the next
        deadline (the engine's `until` or a `call_at`) and run what falls due there."""
        if wake.is_set():
            return
        if self.busy():
            wake.wait(self.poll_s)
            return
        if wake.is_set():  # posted while we looked (a watcher posts before it turns idle)
            return
        with self._lock:
            nxt = self._heap[0][0] if self._heap else None
        target = min(t for t in (nxt, until) if t is not None) if (nxt is not None or until is not None) else None
        if target is None:
            wake.wait(self.poll_s)  # nothing will ever happen unless someone posts
            return
        if target > self._t:
            self._t = target
            self._publish()
        self._fire()

    def _fire(self) -> None:
        while True:
            with self._lock:
                if not self._heap or self._heap[0][0] > self._t:
                    return
                _, _, fn = heapq.heappop(self._heap)
            fn()

    @property
    def scheduled(self) -> int:
        """Callbacks still waiting for their time."""
        return len(self._heap)

    def _publish(self) -> None:
        if self.file is None:
            return
        tmp = self.file.with_name(f".{self.file.name}.tmp")
        tmp.write_text(repr(self._t))
        os.replace(tmp, self.file)

    def close(self) -> None:
        return None
