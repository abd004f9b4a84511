"""What the API serves from: the store, the scheduling engine (if one runs in this process), the
metrics, and a few facts for `/healthz`."""

from __future__ import annotations

from typing import Any

from loom.service.metrics import ServiceMetrics


class Service:
    def __init__(self, store: Any, *, engine: Any = None, info: dict[str, Any] | None = None) -> None:
        self.store = store
        self.engine = engine
        self.metrics = ServiceMetrics(store)
        self.info = dict(info or {})

    def wake(self) -> None:
        """Something was written for the engine (a submission, a cancel): let it look now, not at
        its next periodic turn."""
        feeder = getattr(self, "feeder", None)
        if feeder is not None:
            feeder.wake()  # it reads the store and hands the engine what is new
        elif self.engine is not None:
            self.engine.wake()
