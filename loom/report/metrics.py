"""Per-job records and the run summary, computed once from a finished run."""

from __future__ import annotations

import numpy as np
import polars as pl

from loom.core.decisions import Resume, Start
from loom.core.jobs import JobState
from loom.sim.engine import SimulationResult


def job_records(result: SimulationResult) -> pl.DataFrame:
    """One row per job: times, sizes, where it ran and how often it was interrupted."""
    topo = result.topology
    tiers = [t.name for t in topo.tiers]
    rows: dict[str, list] = {k: [] for k in (
        "job_id", "state", "submit", "start", "end", "queue_s", "jct_s", "run_s", "gpus", "gpu_type", "nodes",
        "preemptions", "migrations", "resizes", "failures", "gpu_seconds", "setup_s", "job_class", "vc", "reason")}
    spans: list[tuple[int, ...]] = []
    for job in result.jobs:
        spec = job.spec
        alloc = job.allocation
        start, end = job.first_start, job.end_time
        rows["job_id"].append(spec.job_id)
        rows["state"].append(job.state.name.lower())
        rows["submit"].append(spec.submit_time)
        rows["start"].append(start)
        rows["end"].append(end)
        rows["queue_s"].append(None if start is None else start - spec.submit_time)
        rows["jct_s"].append(None if end is None else end - spec.submit_time)
        rows["run_s"].append(spec.duration)
        rows["gpus"].append(spec.gpus)
        rows["gpu_type"].append(None if alloc is None else topo.gpu_types[topo.node_type[alloc.nodes[0]]])
        rows["nodes"].append(0 if alloc is None else len(alloc.nodes))
        rows["preemptions"].append(job.preemptions)
        rows["migrations"].append(job.migrations)
        rows["resizes"].append(job.resizes)
        rows["failures"].append(job.failures)
        rows["gpu_seconds"].append(job.gpu_seconds)
        rows["setup_s"].append(job.setup_s)
        rows["job_class"].append(spec.job_class.value)
        rows["vc"].append(spec.vc)
        rows["reason"].append(job.reason or None)
        spans.append((0,) * len(tiers) if alloc is None else topo.switches_spanned(alloc.nodes))
    frame = pl.DataFrame(rows, schema_overrides={"start": pl.Float64, "end": pl.Float64, "queue_s": pl.Float64,
                                                 "jct_s": pl.Float64, "run_s": pl.Float64})
    span_cols = {f"{name}_spanned": [s[i] for s in spans] for i, name in enumerate(tiers)}
    return frame.with_columns(**{k: pl.Series(v, dtype=pl.Int32) for k, v in span_cols.items()})


from loom.report.energy import energy
from loom.report.reliability import reliability


def summary(result: SimulationResult) -> dict[str, float | int]:
    finished = [j for j in result.jobs if j.state is JobState.FINISHED]
    jct = np.array([j.end_time - j.spec.submit_time for j in finished], dtype=float)
    queue = np.array([j.first_start - j.spec.submit_time for j in result.jobs if j.first_start is not None],
                     dtype=float)
    makespan = result.end_time - result.start_time
    available = result.topology.total_gpus * makespan - result.failed_gpu_seconds
    return {
        "jobs": len(result.jobs),
        "finished": len(finished),
        "rejected": len(result.rejected),
        "failed": sum(1 for j in result.jobs if j.state is JobState.FAILED),
        "unfinished": sum(1 for j in result.jobs if j.state not in (JobState.FINISHED, JobState.FAILED,
                                                                        JobState.REJECTED, JobState.CANCELLED)),
        "avg_jct_s": _stat(jct, np.mean),
        "p50_jct_s": _stat(jct, np.median),
        "p99_jct_s": _stat(jct, lambda a: np.percentile(a, 99)),
        "avg_queue_s": _stat(queue, np.mean),
        "p50_queue_s": _stat(queue, np.median),
        "p99_queue_s": _stat(queue, lambda a: np.percentile(a, 99)),
        "makespan_s": makespan,
        "gpu_utilization": result.busy_gpu_seconds / available if available > 0 else 0.0,
        "busy_gpu_seconds": result.busy_gpu_seconds,
        "preemptions": sum(j.preemptions for j in result.jobs),
        "failure_evictions": sum(j.failures for j in result.jobs),
        **launches(result),
        "decisions": len(result.decisions),
        "events": result.events,
        "rounds": result.rounds,
        "sim_wall_s": result.sim_wall_s,
        "events_per_s": result.events / result.sim_wall_s if result.sim_wall_s > 0 else 0.0,
        **decision_latency(result),
        **energy(result),
        **reliability(result),
    }


def launches(result: SimulationResult) -> dict[str, float | int]:
    """Set-up time (STARTING: model and data loading) and launches that did not come up; zero
    with instant launches. `avg_setup_s` is over the jobs that started; `launch_failures` counts
    the Start/Resume decisions the backend answered with a failure (a modelled launch failure,
    a node failing during the launch, a launch called off by a preemption or a cancel)."""
    setup = np.array([j.setup_s for j in result.jobs if j.first_start is not None], dtype=float)
    failed = sum(1 for _, decision, _ in result.record.failed_decisions if isinstance(decision, (Start, Resume)))
    return {"avg_setup_s": _stat(setup, np.mean), "launch_failures": failed}


def decision_latency(result: SimulationResult) -> dict[str, float]:
    """Wall time of the policy's scheduling rounds (one per event batch), in ms."""
    ms = np.asarray(result.round_seconds, dtype=float) * 1e3
    return {"decision_ms_median": _stat(ms, np.median), "decision_ms_p99": _stat(ms, lambda a: np.percentile(a, 99)),
            "decision_ms_max": _stat(ms, np.max)}


def latency_by_queue(result: SimulationResult, edges: tuple[int, ...] = (0, 1, 10, 50, 100, 200, 500)) -> list[dict]:
    """Decision latency grouped by the pending-queue length the round saw (how it grows with the queue)."""
    ms = np.asarray(result.round_seconds, dtype=float) * 1e3
    queue = np.asarray(result.round_queue, dtype=int)
    rows = []
    for lo, hi in zip(edges, (*edges[1:], None)):
        mask = (queue >= lo) if hi is None else ((queue >= lo) & (queue < hi))
        if mask.any():
            rows.append({"queue": f"{lo}+" if hi is None else f"{lo}-{hi - 1}", "rounds": int(mask.sum()),
                         "median_ms": float(np.median(ms[mask])), "p99_ms": float(np.percentile(ms[mask], 99))})
    return rows


def _stat(values: np.ndarray, fn) -> float:  # type: ignore[no-untyped-def]
    return float(fn(values)) if values.size else 0.0
