"""Gantt chart of a reservation: its nodes over time, with the jobs that held
them, so an operator sees whether the reserved region emptied before the
planned job arrived (and which jobs were violations)."""

from __future__ import annotations

from typing import Any

import polars as pl

MAX_NODES = 64


def reservation_rows(decisions: pl.DataFrame | None) -> dict[str, Any] | None:
    """The first reservation in the log: its nodes, when it was made, for which job."""
    if decisions is None or "decision" not in decisions.columns:
        return None
    reserves = decisions.filter(pl.col("decision") == "reserve")
    if reserves.is_empty():
        return None
    first = reserves.row(0, named=True)
    return {"time": first["time"], "job": first["job"], "nodes": list(first["nodes"] or [])}


def occupancy(decisions: pl.DataFrame, nodes: list[str], end: float) -> list[tuple[str, str, float, float]]:
    """(node, job, from, to) intervals on the given nodes, from the decision log."""
    wanted = set(nodes)
    holding: dict[str, tuple[list[str], float]] = {}
    out: list[tuple[str, str, float, float]] = []
    alloc = decisions.filter(pl.col("job").is_not_null())
    for row in alloc.iter_rows(named=True):
        job, kind, t = row["job"], row["decision"], row["time"]
        if job in holding and kind in ("preempt", "migrate", "resize", "resume", "start", "finish"):
            held, since = holding.pop(job)
            out.extend((n, job, since, t) for n in held)
        if kind in ("start", "resume", "migrate", "resize"):
            names = [item.rpartition(":")[0] or item for item in (row["nodes"] or [])]
            held = [n for n in names if n in wanted]
            if held:
                holding[job] = (held, t)
    out.extend((n, job, since, end) for job, (held, since) in holding.items() for n in held)
    return out


def gantt_figure(decisions: pl.DataFrame, jobs: pl.DataFrame) -> bytes | None:
    info = reservation_rows(decisions)
    if info is None:
        return None
    # Matplotlib only for runs with a reservation
    from loom.report.plots import plt, to_png

    nodes = info["nodes"][:MAX_NODES]
    ends = dict(zip(jobs["job_id"], jobs["end"], strict=False)) if "end" in jobs.columns else {}
    planned = jobs.filter(pl.col("job_id") == info["job"])
    arrival = float(planned["submit"][0]) if planned.height else None
    horizon = max([t for t in ends.values() if t is not None] + [info["time"]])
    intervals = occupancy(decisions, nodes, horizon)
    intervals = [(n, j, a, min(b, ends.get(j) or b)) for n, j, a, b in intervals]
    row = {n: i for i, n in enumerate(nodes)}
    t0 = info["time"] - 3600.0
    t1 = (arrival if arrival is not None else info["time"]) + 6 * 3600.0
    fig, ax = plt.subplots(figsize=(8.0, max(2.2, 0.12 * len(nodes) + 1.2)))
    for node, job, a, b in intervals:
        if b < t0 or a > t1:
            continue
        colour = "#d62728" if job == info["job"] else ("#ff7f0e" if arrival is not None and b > arrival else "#1f77b4")
        ax.barh(row[node], (min(b, t1) - max(a, t0)) / 3600, left=(max(a, t0) - info["time"]) / 3600,
                height=0.8, color=colour)
    ax.axvline(0, color="k", lw=0.8, ls=":")
    if arrival is not None:
        ax.axvline((arrival - info["time"]) / 3600, color="k", lw=1.0)
    ax.set_yticks([])
    ax.set_ylabel(f"{len(nodes)} reserved nodes")
    ax.set_xlabel(f"hours since the reservation for {info['job']} (dotted) — solid line: its arrival")
    ax.set_title("reserved nodes: blue = other jobs done before the arrival, orange = still running at it, "
                 "red = the planned job", fontsize=7)
    return to_png(fig)
