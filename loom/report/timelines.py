"""Series over time of a run, as plain data: waiting jobs, utilisation per GPU type, resizes.

* **Waiting jobs** at time t: jobs submitted by t, not yet ended, holding no GPUs — never started
  yet, or stopped (preempted, or by a failure) and not yet resumed. Rejected jobs never wait.
* **Utilisation per GPU type**: busy GPUs of the type / GPUs of that type installed (failed
  nodes still count as installed, so a failure shows as a dip).
* **Resizes**: every `resize` decision with the job's GPUs before and after it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from loom.report.data import (
    ALLOC_DECISIONS,
    RunData,
    allocation_intervals,
    binned,
    grouped_binned,
    node_spans,
    run_end,
    step_function,
)


def waiting_jobs(run: RunData) -> tuple[np.ndarray, np.ndarray]:
    """Step function (times, jobs waiting from each time on) of the run's queue length."""
    horizon = run_end(run)
    jobs = run.jobs.filter(pl.col("state") != "rejected")
    submit = jobs["submit"].to_numpy().astype(float)
    leave = jobs["end"].fill_null(horizon).to_numpy().astype(float)
    spans = allocation_intervals(run)
    t0, t1 = spans["t0"].to_numpy().astype(float), spans["t1"].to_numpy().astype(float)
    # in the system (+1 from submit to end) minus holding GPUs (+1 over each allocation span)
    times = np.concatenate([submit, t1, leave, t0])
    deltas = np.concatenate([np.ones(submit.size), np.ones(t1.size), -np.ones(leave.size), -np.ones(t0.size)])
    return _levels(times, deltas)


def _levels(times: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints and the running sum of `deltas` after all changes at each breakpoint."""
    if times.size == 0:
        return times, times.copy()
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    uniq, first = np.unique(times, return_index=True)
    last = np.append(first[1:], times.size) - 1
    return uniq, np.round(np.cumsum(deltas)[last], 9)


def type_capacity(topology: Any) -> dict[str, int]:
    """GPUs installed per GPU type."""
    per = np.bincount(np.asarray(topology.node_type, dtype=np.int64), weights=topology.node_gpus,
                      minlength=len(topology.gpu_types))
    return {name: int(per[i]) for i, name in enumerate(topology.gpu_types)}


def utilisation_by_type(run: RunData, topology: Any, edges: np.ndarray) -> dict[str, np.ndarray] | None:
    """GPU type → mean busy / installed GPUs of that type per time bin; None with one GPU type."""
    if topology is None or len(topology.gpu_types) < 2:
        return None
    capacity = type_capacity(topology)
    spans = node_spans(run, topology)
    if spans is not None:
        grid = grouped_binned(spans, np.asarray(topology.node_type), len(topology.gpu_types), edges)
        busy = {name: grid[i] for i, name in enumerate(topology.gpu_types)}
    else:
        busy = _busy_by_recorded_type(run, edges, topology.gpu_types)
    return {name: busy[name] / capacity[name] for name in topology.gpu_types if capacity[name] > 0}


def _busy_by_recorded_type(run: RunData, edges: np.ndarray, types: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Without a decision log: each job's GPUs over start → end, on the type of its last allocation."""
    spans = allocation_intervals(run).join(run.jobs.select(pl.col("job_id").alias("job"), "gpu_type"),
                                           on="job", how="left")
    out = {}
    for name in types:
        mine = spans.filter(pl.col("gpu_type") == name)
        times, levels = step_function(mine["t0"].to_numpy(), mine["t1"].to_numpy(), mine["gpus"].to_numpy())
        out[name] = binned(times, levels, edges)["mean"]
    return out


def resizes(run: RunData) -> pl.DataFrame:
    """Every resize: time, job, from_gpus (the allocation it replaced), to_gpus; time order."""
    empty = pl.DataFrame(schema={"time": pl.Float64, "job": pl.Utf8, "from_gpus": pl.Int64, "to_gpus": pl.Int64})
    dec = run.decisions
    if dec is None or dec.is_empty() or not (dec["decision"] == "resize").any():
        return empty
    alloc = dec.with_row_index("seq").filter(pl.col("decision").is_in(ALLOC_DECISIONS) & pl.col("job").is_not_null())
    alloc = alloc.sort("job", "seq").with_columns(pl.col("gpus").shift(1).over("job").alias("from_gpus"))
    return alloc.filter(pl.col("decision") == "resize").sort("seq").select(
        "time", "job", "from_gpus", pl.col("gpus").alias("to_gpus"))


def resized_jobs_gpus(run: RunData, jobs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Step function of the GPUs held by the given jobs together."""
    spans = allocation_intervals(run).filter(pl.col("job").is_in(jobs))
    return step_function(spans["t0"].to_numpy(), spans["t1"].to_numpy(), spans["gpus"].fill_null(0).to_numpy())


def resize_counts(table: pl.DataFrame) -> dict[str, int]:
    grow = int((table["to_gpus"] > table["from_gpus"]).sum())
    shrink = int((table["to_gpus"] < table["from_gpus"]).sum())
    return {"resizes": table.height, "grows": grow, "shrinks": shrink, "jobs resized": table["job"].n_unique()}
