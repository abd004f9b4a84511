"""Failures of a run, from its files: when nodes were down, which jobs a failure stopped, which
recoveries restarted them, which jobs failed for good, and where busy GPU time went.

A failure stops a job without a decision, so the decision log alone would show the job holding
its GPUs until its next decision. The stops are found two ways: a node failure the config
injected (`loom.report.inputs.node_failures`) hits every job holding that node at that moment,
and each restart by the recovery pipeline says in its reason how long after the failure it came
("recovered after 300s: …", whole seconds). `cut_at_evictions` ends a job's allocation span at
the first such stop inside it, so busy GPUs over time match `busy_gpu_seconds` of the summary.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from loom.report import inputs
from loom.report.data import RunData, run_end, run_start, step_function

RECOVERED = r"^recovered after ([0-9.]+)s"
HOUR = 3600.0


def applies(run: RunData) -> bool:
    """The run injected failures, or something in it failed."""
    s = run.summary
    return inputs.has_injected_failures(run) or bool(s.get("failed") or s.get("failure_evictions")
                                                     or s.get("recoveries"))


def recoveries(run: RunData) -> pl.DataFrame:
    """Restarts by the recovery pipeline: job, failed_at, restarted_at (from the resume reasons)."""
    empty = pl.DataFrame(schema={"job": pl.Utf8, "failed_at": pl.Float64, "restarted_at": pl.Float64})
    dec = run.decisions
    if dec is None or dec.is_empty():
        return empty
    hits = dec.filter((pl.col("decision") == "resume") & pl.col("reason").str.contains(RECOVERED))
    return hits.select("job", (pl.col("time") - pl.col("reason").str.extract(RECOVERED, 1).cast(pl.Float64))
                       .alias("failed_at"), pl.col("time").alias("restarted_at"))


def evictions(run: RunData, spans: pl.DataFrame) -> pl.DataFrame:
    """(job, at): every moment a failure stopped a job, from the injected node failures that hit a
    node the job held and from the recovery restarts' reasons."""
    found = [recoveries(run).select("job", pl.col("failed_at").alias("at"))]
    failures = inputs.node_failures(run) or []
    if failures and spans["nodes"].null_count() < len(spans):
        down = pl.DataFrame({"name": [f[0] for f in failures], "at": [f[1] for f in failures]},
                            schema={"name": pl.Utf8, "at": pl.Float64})
        held = spans.select("job", "t0", "t1", "nodes").explode("nodes").drop_nulls("nodes").with_columns(
            pl.col("nodes").str.replace(r":\d+$", "").alias("name"))
        hit = held.join(down, on="name").filter((pl.col("at") >= pl.col("t0")) & (pl.col("at") < pl.col("t1")))
        found.append(hit.select("job", "at"))
    return pl.concat(found).unique().sort("at")


def stops(run: RunData) -> pl.DataFrame:
    """(job, at) of the failure stops found while building the run's allocation spans."""
    from loom.report.data import allocation_intervals

    allocation_intervals(run)
    return run.cache.get("evictions", pl.DataFrame(schema={"job": pl.Utf8, "at": pl.Float64}))


def cut_at_evictions(run: RunData, spans: pl.DataFrame) -> pl.DataFrame:
    """End each allocation span at the first failure that stopped its job inside it (the stops are
    kept in the run's cache: once cut, a span no longer contains its stop)."""
    if not applies(run) or spans.is_empty():
        return spans
    stops = run.cache["evictions"] = evictions(run, spans)
    if stops.is_empty():
        return spans
    spans = spans.with_row_index("_span")
    first = spans.select("_span", "job", "t0", "t1").join(stops, on="job").filter(
        (pl.col("at") >= pl.col("t0")) & (pl.col("at") < pl.col("t1"))).group_by("_span").agg(pl.col("at").min())
    return spans.join(first, on="_span", how="left").with_columns(
        pl.min_horizontal("t1", pl.col("at").fill_null(pl.col("t1"))).alias("t1")).drop("_span", "at")


def nodes_down(run: RunData) -> tuple[np.ndarray, np.ndarray] | None:
    """Step function of nodes down over the run (None: the failures could not be rebuilt)."""
    failures = inputs.node_failures(run)
    if failures is None:
        return None
    end = max(run_end(run), run_start(run) + 1.0)
    at = np.array([f[1] for f in failures], dtype=float)
    back = np.minimum(at + np.array([f[2] for f in failures], dtype=float), end)
    keep = at < end
    return step_function(at[keep], back[keep], np.ones(int(keep.sum())))


def failed_jobs(run: RunData) -> pl.DataFrame:
    """Jobs that ended in failure: job, at (their end), kind (the reason's words before ' after')."""
    jobs = run.jobs.filter(pl.col("state") == "failed")
    reason = pl.col("reason").cast(pl.Utf8).fill_null("failed") if "reason" in jobs.columns else pl.lit("failed")
    return jobs.select(pl.col("job_id").alias("job"), pl.col("end").alias("at"),
                       reason.str.replace(r" after .*$", "").alias("kind"))


def timeline(run: RunData) -> dict[str, Any]:
    """Everything the failure timeline draws: nodes down, and the times of each kind of job event."""
    events: dict[str, np.ndarray] = {}
    failures = inputs.node_failures(run)
    if failures:
        events["node failed"] = np.array([f[1] for f in failures], dtype=float)
    events["job stopped by a failure"] = stops(run)["at"].to_numpy().astype(float)
    events["job restarted by recovery"] = recoveries(run)["restarted_at"].to_numpy()
    failed = failed_jobs(run)
    for kind in failed["kind"].unique().sort().to_list():
        events[f"job failed for good: {kind}"] = failed.filter(pl.col("kind") == kind)["at"].to_numpy()
    return {"nodes_down": nodes_down(run), "events": {k: v for k, v in events.items() if v.size},
            "rebuilt": failures is not None}


def goodput_breakdown(summary: dict[str, Any]) -> list[tuple[str, float, str]] | None:
    """Where busy GPU time went, in GPU-hours, when the run priced interruptions: (what, hours, why)."""
    if "goodput_gpu_hours" not in summary:
        return None
    return [
        ("useful work", float(summary["goodput_gpu_hours"]), "progress kept (goodput)"),
        ("lost work, re-done", float(summary.get("gpu_hours_lost_to_failures", 0.0)),
         "progress since the last checkpoint when a failure struck"),
        ("restart and resize pauses", float(summary.get("gpu_hours_paused", 0.0)),
         "reloading the model and data after a restart, pausing to resize or migrate"),
        ("checkpointing", float(summary.get("gpu_hours_checkpointing", 0.0)), "stalls writing checkpoints"),
    ]


def outside_busy(summary: dict[str, Any]) -> list[tuple[str, float, str]]:
    """GPU time around failures that the busy total does not hold, or holds under useful work."""
    rows = []
    if summary.get("gpu_hours_held_recovering"):
        rows.append(("held idle while recovering", float(summary["gpu_hours_held_recovering"]),
                     "a failed job's surviving GPUs, kept for it during recovery (not in busy time)"))
    if summary.get("gpu_hours_in_failed_jobs"):
        rows.append(("in jobs that failed for good", float(summary["gpu_hours_in_failed_jobs"]),
                     "busy time of jobs that ended in failure (counted in the busy time above)"))
    return rows
