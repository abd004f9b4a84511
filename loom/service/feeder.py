"""Store → engine: submissions and cancel requests the API committed, handed to the engine.

The API only writes the store; this thread (woken by `Service.wake`, else once a second) reads
what is new and gives it to the engine, so an acknowledged submission reaches the scheduler even
if the process that took it died a moment later (a restart feeds it then)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from loom.service.specs import job_spec, launch_spec

log = logging.getLogger("loom.service")


class StoreFeeder:
    def __init__(self, store: Any, engine: Any, *, interval: float = 1.0, clock: Any = time.time) -> None:
        self.store, self.engine, self.interval, self.clock = store, engine, interval, clock
        self.seq = 0  # the last submission looked at (jobs not SUBMITTED any more are skipped)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def wake(self) -> None:
        self._wake.set()

    def step(self) -> int:
        """Feed what is new; the number of submissions and cancels handed over."""
        fetched = self.store.submissions_after(self.seq, limit=5000)
        rows = [row for row in fetched if row.state == "SUBMITTED"]
        if rows:
            # recorded first, in one commit: after a crash before the engine has them, the restart
            # finds them PENDING and queues them
            now = self.clock()
            self.store.record_transitions([(row.job_id, "SUBMITTED", "PENDING", now, "taken up by the scheduler")
                                           for row in rows])
            for row in rows:
                self.engine.submit(job_spec(row), launch=launch_spec(row))
        if fetched:
            self.seq = fetched[-1].seq
        handed = len(rows)
        cancels = self.store.cancel_requests()
        for job_id in cancels:
            self.engine.cancel(job_id, "cancelled by its owner").result(timeout=60)
        if cancels:
            self.store.mark_cancel_handled(cancels)
            handed += len(cancels)
        if handed:
            self.engine.wake()
        return handed

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                self._wake.wait(self.interval)
                self._wake.clear()
                try:
                    while self.step() and not self._stop.is_set():
                        pass
                except Exception as exc:
                    self.error = exc
                    log.exception("feeding the engine failed")
                    self._stop.wait(self.interval)

        self._thread = threading.Thread(target=loop, name="loom-feeder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
