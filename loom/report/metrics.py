"""Per-job records and the run summary, computed once from a finished run."""

from __future__ import annotations

import numpy as np
import polars as pl

from loom.core.decisions import Resume, Start
from loom.core.jobs import JobState
from loom.report.columns import JobTable, _floats
from loom.sim.engine import SimulationResult
from loom.workload.job import JobClass


def job_records(result: SimulationResult, table: JobTable | None = None) -> pl.DataFrame:
    """One row per job: times, sizes, where it ran and how often it was interrupted.

    Built column by column from a `JobTable` (a per-job row loop over 100k jobs costs more
    than the rest of the writing)."""
    t = table if table is not None else JobTable(result)
    topo = result.topology
    tiers = [tier.name for tier in topo.tiers]
    names = [""] * (max(JobState) + 1)  # by state value: list indexing is cheaper than hashing an enum
    for state in JobState:
        names[state] = state.name.lower()
    classes = {id(c): c.value for c in JobClass}
    type_names = [*topo.gpu_types, None]  # index -1: no allocation
    submits = t.submit_time
    nodes = [0 if alloc is None else len(alloc.nodes) for alloc in t.allocation]
    rows: dict[str, list | pl.Series] = {
        "job_id": t.job_id,
        "state": [names[s] for s in t.state],
        "submit": submits,
        # times that may be missing, from the table's float columns (NaN: none; NumPy to polars costs
        # less than a list holding None): the same floats as the per-job subtractions
        "start": _nullable(t.first),
        "end": _nullable(t.end),
        "queue_s": _nullable(t.first - t.submit),
        "jct_s": _nullable(t.end - t.submit),
        "run_s": _nullable(_floats(t.duration)),
        "gpus": t.gpus,
        "gpu_type": [type_names[i] for i in t.node_types.tolist()],
        "nodes": nodes,
        "preemptions": t.preemptions,
        "migrations": t.migrations,
        "resizes": t.resizes,
        "failures": t.failures,
        "gpu_seconds": t.gpu_seconds,
        "setup_s": t.setup_s,
        "job_class": [classes[id(c)] for c in t.job_class],
        "vc": t.vc,
        "reason": [r or None for r in t.reason],
    }
    frame = pl.DataFrame(rows, schema_overrides={"start": pl.Float64, "end": pl.Float64, "queue_s": pl.Float64,
                                                 "jct_s": pl.Float64, "run_s": pl.Float64})
    # switches spanned per tier (`Topology.switches_spanned`): one node spans one switch per tier, none none
    spans = [[1 if n else 0 for n in nodes] for _ in tiers]
    switch_of = topo.switch_of.tolist()
    for i, n in enumerate(nodes):
        if n > 1:
            held = t.allocation[i].nodes
            for tier, row in enumerate(switch_of):
                spans[tier][i] = len({row[node] for node in held})
    return frame.with_columns(**{f"{name}_spanned": pl.Series(spans[i], dtype=pl.Int32)
                                 for i, name in enumerate(tiers)})


def _nullable(values: np.ndarray) -> pl.Series:
    """A Float64 column with NaN as null."""
    return pl.Series(values, dtype=pl.Float64, nan_to_null=True)


from loom.report.energy import energy
from loom.report.reliability import reliability


def summary(result: SimulationResult, table: JobTable | None = None) -> dict[str, float | int]:
    t = table if table is not None else JobTable(result)
    finished = t.is_state(JobState.FINISHED)
    jct = (t.end - t.submit)[finished]
    queue = (t.first - t.submit)[t.started]
    makespan = result.end_time - result.start_time
    available = result.topology.total_gpus * makespan - result.failed_gpu_seconds
    ended = int(np.isin(t.state_codes, (JobState.FINISHED, JobState.FAILED, JobState.REJECTED,
                                         JobState.CANCELLED)).sum())
    return {
        "jobs": len(result.jobs),
        "finished": int(finished.sum()),
        "rejected": len(result.rejected),
        "failed": int(t.is_state(JobState.FAILED).sum()),
        "unfinished": len(t) - ended,
        "avg_jct_s": _stat(jct, np.mean),
        "p50_jct_s": _stat(jct, np.median),
        "p99_jct_s": _stat(jct, lambda a: np.percentile(a, 99)),
        "avg_queue_s": _stat(queue, np.mean),
        "p50_queue_s": _stat(queue, np.median),
        "p99_queue_s": _stat(queue, lambda a: np.percentile(a, 99)),
        "makespan_s": makespan,
        "gpu_utilization": result.busy_gpu_seconds / available if available > 0 else 0.0,
        "busy_gpu_seconds": result.busy_gpu_seconds,
        "preemptions": sum(t.preemptions),
        "failure_evictions": sum(t.failures),
        **launches(result, t),
        "decisions": len(result.decisions),
        "events": result.events,
        "rounds": result.rounds,
        "sim_wall_s": result.sim_wall_s,
        "events_per_s": result.events / result.sim_wall_s if result.sim_wall_s > 0 else 0.0,
        **decision_latency(result),
        **energy(result, t),
        **reliability(result, t),
    }


def launches(result: SimulationResult, table: JobTable | None = None) -> dict[str, float | int]:
    """Set-up time (STARTING: model and data loading) and launches that did not come up; zero
    with instant launches. `avg_setup_s` is over the jobs that started; `launch_failures` counts
    the Start/Resume decisions the backend answered with a failure (a modelled launch failure,
    a node failing during the launch, a launch called off by a preemption or a cancel)."""
    t = table if table is not None else JobTable(result)
    setup = np.array(t.setup_s, dtype=np.float64).reshape(len(t))[t.started]
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
