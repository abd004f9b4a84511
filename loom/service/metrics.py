"""The service's Prometheus metrics (the official prometheus-client), one registry per service.

Counters and the decision-latency histogram are fed by the engine as things happen; the queue
length per class and the GPUs allocated per type are read from the store when scraped, so they
are right after a restart too.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from loom.service.views import every_job

WAITING = ("SUBMITTED", "PENDING", "SUSPENDED", "RECOVERING")
HOLDING = ("STARTING", "RUNNING", "STOPPING")


class ServiceMetrics:
    def __init__(self, store: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._submitted = Counter("loom_jobs_submitted", "Jobs submitted through the API", ["job_class"], registry=r)
        self._decisions = Counter("loom_decisions", "Decisions the core issued", ["kind"], registry=r)
        self._answers = Counter("loom_decision_answers", "Backend answers to decisions", ["status"], registry=r)
        self._transitions = Counter("loom_job_transitions", "Job lifecycle transitions", ["old", "new"], registry=r)
        self._backend_errors = Counter("loom_backend_errors", "Errors reported by or raised in the backend",
                                       ["kind"], registry=r)
        self._latency = Histogram("loom_decision_latency_seconds", "Wall time of one policy round",
                                  buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
                                  registry=r)
        r.register(_StoreGauges(store))

    # ---------------------------------------------------------------- fed by the API and engine
    def submitted(self, job_class: str) -> None:
        self._submitted.labels(job_class).inc()

    def decision(self, kind: str) -> None:
        self._decisions.labels(kind).inc()

    def answer(self, status: str) -> None:
        self._answers.labels(status).inc()

    def transition(self, old: str, new: str) -> None:
        self._transitions.labels(old, new).inc()

    def backend_error(self, kind: str) -> None:
        self._backend_errors.labels(kind).inc()

    def round_seconds(self, seconds: float) -> None:
        self._latency.observe(seconds)

    def exposition(self, store: Any = None) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _StoreGauges(Collector):
    """Queue length per job class and GPUs allocated per GPU type, read from the store at scrape time."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("loom_queue_length", "Jobs waiting, by job class", labels=["job_class"])
        yield GaugeMetricFamily("loom_gpus_allocated", "GPUs held by jobs, by GPU type", labels=["gpu_type"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queue = GaugeMetricFamily("loom_queue_length", "Jobs waiting, by job class", labels=["job_class"])
        for job_class, n in sorted(Tally(j.spec.get("job_class", "unknown")
                                         for j in every_job(self.store, list(WAITING))).items()):
            queue.add_metric([job_class], n)
        yield queue
        allocated = GaugeMetricFamily("loom_gpus_allocated", "GPUs held by jobs, by GPU type", labels=["gpu_type"])
        inventory = self.store.inventory()
        types = {n["name"]: n["gpu_type"] for n in inventory[1]} if inventory else {}
        held: Tally[str] = Tally()
        for job in every_job(self.store, list(HOLDING)):
            alloc = job.allocation or {}
            for node, gpus in zip(alloc.get("nodes", ()), alloc.get("gpus", ())):
                held[types.get(node, "unknown")] += int(gpus)
        for gpu_type in sorted(set(types.values()) | set(held)):
            allocated.add_metric([gpu_type], held[gpu_type])
        yield allocated
