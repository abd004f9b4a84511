"""Reliability figures of a run: where GPU time went besides useful work, and how
recoveries went (restarts, time to recover, topology spread before/after)."""

from __future__ import annotations

import numpy as np

from loom.core.jobs import JobState
from loom.report.columns import JobTable
from loom.sim.engine import SimulationResult

HOUR = 3600.0


def reliability(result: SimulationResult, table: JobTable | None = None) -> dict[str, float | int | None]:
    """Goodput and lost GPU-hours (when interruptions are priced) and recovery figures."""
    out: dict[str, float | int | None] = {}
    totals = result.interruptions
    if totals is not None:
        overhead = totals.paused_gpu_s + totals.checkpoint_gpu_s + totals.lost_gpu_s
        goodput = max(0.0, result.busy_gpu_seconds - overhead)
        out.update({
            "goodput_gpu_hours": goodput / HOUR,
            "goodput_fraction": goodput / result.busy_gpu_seconds if result.busy_gpu_seconds > 0 else None,
            "gpu_hours_paused": totals.paused_gpu_s / HOUR,
            "gpu_hours_checkpointing": totals.checkpoint_gpu_s / HOUR,
            "gpu_hours_lost_to_failures": totals.lost_gpu_s / HOUR,
        })
    states = table.state if table is not None else [j.state for j in result.jobs]
    failed = [j for j, state in zip(result.jobs, states) if state is JobState.FAILED] if JobState.FAILED in states else []
    if failed:
        out["gpu_hours_in_failed_jobs"] = sum(j.gpu_seconds for j in failed) / HOUR
    records = result.recoveries
    if records:
        restarted = [r for r in records if r.restarted_at is not None]
        took = np.array([r.restarted_at - r.failed_at for r in restarted], dtype=float)
        after = np.array([r.minipods_after for r in restarted], dtype=float)
        before = np.array([r.minipods_before for r in restarted], dtype=float)
        hit = [j for j in result.jobs if j.failures]
        out.update({
            "recoveries": len(records),
            "recoveries_handed_to_policy": len(records) - len(restarted),
            "recovery_s_median": float(np.median(took)) if took.size else None,
            "recovery_s_max": float(took.max()) if took.size else None,
            "gpu_hours_held_recovering": sum(r.held_gpu_s for r in records) / HOUR,
            "restarts_per_failed_job": sum(j.failures for j in hit) / len(hit) if hit else 0.0,
            "spares_used": sum(r.used_spares for r in records),
            "minipods_before_mean": float(before.mean()) if before.size else None,
            "minipods_after_mean": float(after.mean()) if after.size else None,
            "recoveries_spread_grew_pct": float(100 * (after > before).mean()) if after.size else None,
            "recoveries_spread_grew": int((after > before).sum()),
        })
    return out
