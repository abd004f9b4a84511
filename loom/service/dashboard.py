"""The read-only dashboard: one page (`/dashboard`) that polls `/v1/dashboard` every two seconds.

It shows the queue, running jobs with their plans and placements on the switch tree (the report's
`placement_svg`), GPUs in use over time (the report's SVG chart kit), recent decisions with their
reasons and per-tenant usage. A tenant's token shows that tenant's jobs; an admin's, everyone's.
GPUs in use are sampled from the store by a background thread (`UtilisationSampler`), so the
timeline starts when the service does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from importlib.resources import files
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from loom.service.auth import Caller, Who
from loom.service.views import every_job, job_view

log = logging.getLogger("loom.service")
WAITING = ["SUBMITTED", "PENDING", "SUSPENDED", "RECOVERING"]
HOLDING = ["STARTING", "RUNNING", "STOPPING"]
PLACEMENTS_SHOWN = 4


class UtilisationSampler:
    """(time, GPUs held) every `interval` seconds, the last `keep` samples; a daemon thread."""

    def __init__(self, store: Any, interval: float = 5.0, keep: int = 17_280) -> None:
        self.store, self.interval = store, interval
        self.samples: deque[tuple[float, int]] = deque(maxlen=keep)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        held = sum(sum((j.allocation or {}).get("gpus", ())) for j in every_job(self.store, HOLDING))
        self.samples.append((time.time(), int(held)))

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.sample()
                except Exception:  # a failed sample (the store busy or closing) must not end the thread
                    log.debug("utilisation sample failed", exc_info=True)
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=loop, name="loom-utilisation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def install(app: FastAPI, service: Any) -> None:
    """Add the page and its data route to `app`."""

    @app.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        from loom.report.svgchart import CHART_CSS

        text = (files("loom.service") / "dashboard.html").read_text(encoding="utf-8")
        return HTMLResponse(text.replace("/*CHART_CSS*/", CHART_CSS))

    @app.get("/v1/dashboard", tags=["dashboard"])
    def data(caller: Who) -> dict[str, Any]:
        return dashboard_data(service, caller)


def dashboard_data(service: Any, caller: Caller) -> dict[str, Any]:
    store, scope = service.store, caller.scope
    waiting = every_job(store, WAITING, scope)
    running = every_job(store, HOLDING, scope)
    mine = None if scope is None else {j.job_id for j in store.jobs(tenant=scope, limit=10_000)}
    decisions = [d for d in store.recent_decisions(200) if mine is None or d.job_id in mine][:50]
    inventory = store.inventory()
    capacity = sum(int(n["gpus"]) for n in inventory[1] if n.get("state", "up") == "up") if inventory else 0
    return {
        "tenant": caller.tenant, "admin": caller.admin, "now": time.time(),
        "queue": [job_view(j).model_dump() for j in waiting],
        "running": [job_view(j).model_dump() for j in running],
        "decisions": [{"ticket": d.ticket, "kind": d.kind, "job": d.job_id, "at": d.issued_at, "reason": d.reason,
                       "status": d.status, "answer": d.answer_reason} for d in decisions],
        "tenants": _usage(store, scope, running),
        "capacity": capacity,
        "utilisation_svg": _utilisation_svg(getattr(service, "sampler", None), capacity),
        "placements": _placements(getattr(service, "topology", None), running),
    }


def _usage(store: Any, scope: str | None, running: list[Any]) -> list[dict[str, Any]]:
    held: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    for job in running:
        held[job.tenant] += sum((job.allocation or {}).get("gpus", ()))
        jobs[job.tenant] += 1
    names = [scope] if scope is not None else [t.name for t in store.tenants()]
    out = []
    for name in names:
        counts = store.count_jobs(tenant=name)
        out.append({"tenant": name, "gpus_held": held[name], "running": jobs[name],
                    "waiting": sum(counts.get(s, 0) for s in WAITING), "finished": counts.get("FINISHED", 0),
                    "failed": counts.get("FAILED", 0), "cancelled": counts.get("CANCELLED", 0)})
    return out


def _utilisation_svg(sampler: UtilisationSampler | None, capacity: int) -> str:
    from loom.report.svgchart import Chart, Panel, Scale, colour

    samples = list(sampler.samples) if sampler is not None else []
    chart = Chart(900.0, 230.0)
    if len(samples) < 2:
        return ""
    t0 = samples[0][0]
    xs = np.array([(t - t0) / 60.0 for t, _ in samples])
    ys = np.array([float(g) for _, g in samples])
    top = max(float(capacity), float(ys.max()), 1.0) * 1.05
    panel = chart.panel(Panel(64.0, 24.0, 640.0, 160.0, Scale(0.0, max(float(xs[-1]), 1.0)), Scale(0.0, top),
                              "GPUs in use", "minutes since the service started sampling", "GPUs"))
    panel.step(xs, ys, colour(0), tip="GPUs in use")
    entries = [(colour(0), f"in use: {int(ys[-1]):,} GPUs")]
    if capacity:
        panel.hline(float(capacity), colour(3))
        entries.append((colour(3), f"up: {capacity:,} GPUs"))
    chart.legend(724.0, 24.0, entries)
    return chart.svg("GPUs in use over time")


def _placements(topology: Any, running: list[Any]) -> list[str]:
    if topology is None:
        return []
    from loom.report.svg import placement_svg

    largest = sorted((j for j in running if j.allocation), key=lambda j: -sum(j.allocation["gpus"]))
    out = []
    for job in largest[:PLACEMENTS_SHOWN]:
        nodes = dict(zip(job.allocation["nodes"], job.allocation["gpus"]))
        out.append(placement_svg(topology, {"job": job.job_id, "gpus": sum(nodes.values()), "nodes": nodes,
                                            "decision": job.state.lower(), "time": job.updated_at - job.submitted_at}))
    return out
