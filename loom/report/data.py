"""Tables and series of a finished run, as plain data (no plotting, no HTML).

Everything here reads the files `loom.run.run` writes into a run directory
(`summary.json`, `jobs.parquet`, `decisions.jsonl`, `manifest.json`) and
returns polars frames, numpy arrays or dicts that the rendering layer draws.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from loom.errors import LoomInputError

ALLOC_DECISIONS = ("start", "resume", "migrate", "resize")
JOB_DECISIONS = (*ALLOC_DECISIONS, "preempt")


@dataclass
class RunData:
    path: Path
    summary: dict[str, Any]
    manifest: dict[str, Any]
    jobs: pl.DataFrame
    decisions: pl.DataFrame | None  # None when the run was made with --no-decision-log
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)

    @property
    def cluster(self) -> str | None:
        cfg = self.manifest.get("config") or {}
        return cfg.get("cluster") or (self.manifest.get("cluster") or {}).get("name")

    @property
    def total_gpus(self) -> int | None:
        return (self.manifest.get("cluster") or {}).get("gpus")


def load_run(path: Path) -> RunData:
    """Read a run directory; a missing or broken one is a `LoomInputError`."""
    path = Path(path)
    if not path.is_dir():
        raise LoomInputError("not a run directory (does not exist)", source=str(path))
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        raise LoomInputError("not a run directory (no summary.json; make one with `loom simulate`)",
                             source=str(path))
    summary = _read_json(summary_path)
    manifest = _read_json(path / "manifest.json") if (path / "manifest.json").is_file() else {}
    jobs_path = path / "jobs.parquet"
    if not jobs_path.is_file():
        raise LoomInputError("no jobs.parquet (the run was made without job records)", source=str(path))
    try:
        jobs = pl.read_parquet(jobs_path)
    except Exception as exc:  # noqa: BLE001 - polars raises several types for a bad file
        raise LoomInputError(f"cannot read: {str(exc).splitlines()[0]}", source=str(jobs_path)) from None
    decisions = None
    dec_path = path / "decisions.jsonl"
    if dec_path.is_file() and dec_path.stat().st_size > 0:
        try:
            decisions = pl.read_ndjson(dec_path, schema={
                "time": pl.Float64, "decision": pl.Utf8, "job": pl.Utf8, "gpus": pl.Int64,
                "nodes": pl.List(pl.Utf8), "plan": pl.Utf8, "reason": pl.Utf8})
        except Exception as exc:  # noqa: BLE001
            raise LoomInputError(f"cannot read: {str(exc).splitlines()[0]}", source=str(dec_path)) from None
    return RunData(path, summary, manifest, jobs, decisions)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LoomInputError(f"cannot read JSON: {exc}", source=str(path)) from None
    if not isinstance(data, dict):
        raise LoomInputError("expected a JSON object", source=str(path))
    return data


# ------------------------------------------------------------------ formatting
def fmt_value(key: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if key.endswith("_s") and abs(value) >= 3600:
            return f"{value:,.1f} ({fmt_duration(value)})"
        return f"{value:,.3f}"
    return str(value)


def fmt_duration(seconds: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


# --------------------------------------------------------------------- CDFs
def cdf(values: np.ndarray | pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their empirical CDF (k/n): the last point is exactly 1."""
    arr = np.asarray(values.drop_nulls() if isinstance(values, pl.Series) else values, dtype=float)
    arr = np.sort(arr[~np.isnan(arr)])
    return arr, np.arange(1, arr.size + 1) / max(arr.size, 1)


# ---------------------------------------------------------- busy GPUs in time
def allocation_intervals(run: RunData) -> pl.DataFrame:
    """One row per span a job held a fixed allocation: job, t0, t1, gpus, nodes (list of "node:gpus").

    From the decision log when there is one (start/resume/migrate/resize open a
    span, the job's next decision or its end closes it; preempt holds nothing),
    else one span per job from jobs.parquet's start/end with `nodes` null.
    """
    if "intervals" not in run.cache:
        run.cache["intervals"] = _allocation_intervals(run)
    return run.cache["intervals"]


def _allocation_intervals(run: RunData) -> pl.DataFrame:
    jobs = run.jobs
    horizon = run_end(run)
    if run.decisions is None or run.decisions.is_empty():
        started = jobs.filter(pl.col("start").is_not_null())
        return started.select(pl.col("job_id").alias("job"), pl.col("start").alias("t0"),
                              pl.col("end").fill_null(horizon).alias("t1"), pl.col("gpus").cast(pl.Int64),
                              pl.lit(None, dtype=pl.List(pl.Utf8)).alias("nodes"))
    dec = run.decisions.filter(pl.col("decision").is_in(JOB_DECISIONS) & pl.col("job").is_not_null())
    ends = jobs.select(pl.col("job_id").alias("job"), pl.col("end").fill_null(horizon).alias("t1"))
    if dec["job"].is_unique().all():  # one decision per job (no preemption, resize...): no sort needed
        raw = dec.filter(pl.col("decision").is_in(ALLOC_DECISIONS)).join(ends, on="job", how="left").select(
            "job", pl.col("time").alias("t0"), pl.col("t1").fill_null(horizon), "gpus", "nodes")
    else:
        raw = _spans_between_decisions(dec, ends, horizon)
    # a failure stops a job without a decision: its spans end there
    from loom.report.failures import cut_at_evictions

    return cut_at_evictions(run, raw)


def _spans_between_decisions(dec: pl.DataFrame, ends: pl.DataFrame, horizon: float) -> pl.DataFrame:
    """Each allocation decision opens a span that the job's next decision or its end closes."""
    dec = dec.with_row_index("seq").select("seq", "job", "time", "decision", "gpus", "nodes")
    ends = ends.filter(pl.col("job").is_in(dec["job"].unique().implode())).select(
        pl.lit(len(dec), dtype=pl.UInt32).alias("seq"), "job", pl.col("t1").alias("time"),
        pl.lit("end").alias("decision"), pl.lit(None, dtype=pl.Int64).alias("gpus"),
        pl.lit(None, dtype=pl.List(pl.Utf8)).alias("nodes"))
    events = pl.concat([dec, ends]).sort("job", "time", "seq")
    # every job's last row is its end, so the next row of an allocation is always the same job's
    events = events.with_columns(pl.col("time").shift(-1).fill_null(horizon).alias("t1"))
    return events.filter(pl.col("decision").is_in(ALLOC_DECISIONS)).select(
        "job", pl.col("time").alias("t0"), "t1", "gpus", "nodes")


def run_topology(run: RunData) -> Any:
    """The cluster named in the manifest (loaded once per report), or None when it cannot be loaded."""
    if "topology" not in run.cache:
        from loom.hardware.clusters import load_cluster

        topology = None
        if run.cluster:
            try:
                topology = load_cluster(run.cluster)
            except (LoomInputError, OSError):
                topology = None
        run.cache["topology"] = topology
    return run.cache["topology"]


def node_spans(run: RunData, topology: Any) -> pl.DataFrame | None:
    """The allocation spans split per node: span, job, t0, t1, node (index in `topology`), g (GPUs);
    None without node lists (no decision log)."""
    if "node_spans" not in run.cache:
        run.cache["node_spans"] = _node_spans(allocation_intervals(run), topology)
    return run.cache["node_spans"]


def _node_spans(iv: pl.DataFrame, topology: Any) -> pl.DataFrame | None:
    if iv.is_empty() or iv["nodes"].null_count() == len(iv):
        return None
    parts = iv.with_row_index("span").explode("nodes").drop_nulls("nodes").with_columns(
        pl.col("nodes").str.replace(r":\d+$", "").alias("name"),
        pl.col("nodes").str.extract(r":(\d+)$", 1).cast(pl.Int64).alias("g"))
    index = pl.DataFrame({"name": list(topology.node_names),
                          "node": np.arange(topology.num_nodes, dtype=np.int64)})
    return parts.join(index, on="name", how="inner").select("span", "job", "t0", "t1", "node", "g")


def run_start(run: RunData) -> float:
    return float(run.jobs["submit"].min() or 0.0)


def run_end(run: RunData) -> float:
    ends = [run.jobs["end"].max(), run.jobs["start"].max(), run.jobs["submit"].max()]
    if run.decisions is not None and not run.decisions.is_empty():
        ends.append(run.decisions["time"].max())
    return float(max(e for e in ends if e is not None) if any(e is not None for e in ends) else 0.0)


def step_function(t0: np.ndarray, t1: np.ndarray, amount: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints `times` and `level[i]` = sum of amounts active on [times[i], times[i+1])
    (both empty when nothing was ever active, e.g. a run where no job started)."""
    times = np.concatenate([t0, t1]).astype(float)
    if times.size == 0:
        return times, times.copy()
    deltas = np.concatenate([amount, -amount]).astype(float)
    order = np.argsort(times, kind="stable")
    times, deltas = times[order], deltas[order]
    uniq, first = np.unique(times, return_index=True)
    levels = np.cumsum(deltas)
    last = np.append(first[1:], times.size) - 1
    return uniq, np.round(levels[last], 9)


def busy_gpus(run: RunData) -> tuple[np.ndarray, np.ndarray]:
    """The exact busy-GPU step function of the run."""
    iv = allocation_intervals(run)
    return step_function(iv["t0"].to_numpy(), iv["t1"].to_numpy(), iv["gpus"].fill_null(0).to_numpy())


def step_integral(times: np.ndarray, levels: np.ndarray) -> float:
    return float(np.sum(levels[:-1] * np.diff(times))) if times.size > 1 else 0.0


def binned(times: np.ndarray, levels: np.ndarray, edges: np.ndarray) -> dict[str, np.ndarray]:
    """Mean, min and max of a step function in each bin [edges[i], edges[i+1])."""
    if times.size == 0:
        zero = np.zeros(edges.size - 1)
        return {"mean": zero, "min": zero, "max": zero}
    area = np.concatenate([[0.0], np.cumsum(levels[:-1] * np.diff(times))])
    at = np.interp(edges, times, area, left=0.0, right=area[-1])
    mean = np.diff(at) / np.diff(edges)
    # level in force at each bin's left edge, then the extremes of breakpoints inside each bin
    idx = np.searchsorted(times, edges[:-1], side="right") - 1
    entry = np.where(idx >= 0, levels[np.clip(idx, 0, None)], 0.0)
    lo, hi = entry.copy(), entry.copy()
    inside = np.searchsorted(edges, times, side="right") - 1
    ok = (inside >= 0) & (inside < edges.size - 1)
    np.minimum.at(lo, inside[ok], levels[ok])
    np.maximum.at(hi, inside[ok], levels[ok])
    return {"mean": mean, "min": lo, "max": hi}


def time_edges(run: RunData, bins: int) -> np.ndarray:
    start, end = run_start(run), run_end(run)
    return np.linspace(start, max(end, start + 1.0), bins + 1)


# ------------------------------------------------------------------ heatmap
def node_groups(topology: Any, max_groups: int = 64) -> tuple[str, np.ndarray, list[str], np.ndarray]:
    """Tier name, group index per node, group names and GPU capacity per group.

    Leaf switches when there are at most `max_groups` of them, else minipods.
    """
    leaf = len(topology.tiers) - 1
    tier = leaf if topology.num_switches(leaf) <= max_groups else topology.minipod_tier
    group_of = np.asarray(topology.switch_of[tier])
    names = list(topology.switch_names[tier])
    capacity = np.bincount(group_of, weights=topology.node_gpus, minlength=len(names))
    return topology.tiers[tier].name, group_of, names, capacity


def occupancy_heatmap(run: RunData, topology: Any, bins: int = 200) -> dict[str, Any] | None:
    """Busy GPUs / capacity per node group and time bin; None without a decision log."""
    spans = node_spans(run, topology)
    if spans is None:
        return None
    tier, group_of, names, capacity = node_groups(topology)
    edges = time_edges(run, bins)
    grid = grouped_binned(spans, group_of, len(names), edges)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(capacity[:, None] > 0, grid / capacity[:, None], 0.0)
    order = sorted(range(len(names)), key=lambda i: names[i])  # switches of one minipod side by side
    prefix = common_prefix([names[i] for i in order])
    return {"tier": tier, "groups": [names[i][len(prefix):] for i in order], "capacity": capacity[order],
            "edges": edges, "occupancy": frac[order]}


def grouped_binned(spans: pl.DataFrame, group_of: np.ndarray, groups: int, edges: np.ndarray) -> np.ndarray:
    """Mean busy GPUs per time bin for each group of nodes (`group_of[node]`), shape (groups, bins)."""
    group = np.asarray(group_of, dtype=np.int64)[spans["node"].to_numpy()]
    return boxcar_means(group, spans["t0"].to_numpy(), spans["t1"].to_numpy(), spans["g"].to_numpy(), groups, edges)


def boxcar_means(group: np.ndarray, t0: np.ndarray, t1: np.ndarray, amount: np.ndarray, groups: int,
                 edges: np.ndarray) -> np.ndarray:
    """Per group, the mean over each bin [edges[k], edges[k+1]) of a sum of boxcars (`amount` on
    [t0, t1)), shape (groups, bins), without sorting: the integral up to an edge e is
    Σ_{t0<e} a·(e − t0) − Σ_{t1<e} a·(e − t1), from per-group cumulative sums over the edges."""
    t0, t1 = np.asarray(t0, dtype=float), np.asarray(t1, dtype=float)
    a = np.asarray(amount, dtype=float)
    slots = edges.size + 1  # j = number of edges ≤ t, 0..len(edges); t < edges[k] ⟺ j ≤ k

    def cumulative(t: np.ndarray, weight: np.ndarray) -> np.ndarray:
        j = np.searchsorted(edges, t, side="right")
        flat = np.bincount(group * slots + j, weights=weight, minlength=groups * slots)
        return np.cumsum(flat.reshape(groups, slots), axis=1)[:, : edges.size]

    area = edges * (cumulative(t0, a) - cumulative(t1, a)) - (cumulative(t0, a * t0) - cumulative(t1, a * t1))
    return np.diff(area, axis=1) / np.diff(edges)


def common_prefix(names: list[str]) -> str:
    """The leading "a/b/" path parts every name shares (e.g. a single core switch)."""
    if len(names) < 2:
        return ""
    parts = [n.split("/") for n in names]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    common = common[: min(len(p) for p in parts) - 1]
    return "/".join(common) + "/" if common else ""


# ---------------------------------------------------------------- placements
def largest_jobs(run: RunData, n: int) -> pl.DataFrame:
    """The `n` largest started jobs (by GPUs, then GPU time). The order is sorted once per report
    (the placement tree and the decision table both ask)."""
    ranked = run.cache.get("largest_jobs")
    if ranked is None:
        started = run.jobs.filter(pl.col("start").is_not_null())
        ranked = run.cache["largest_jobs"] = started.sort(["gpus", "gpu_seconds"], descending=True)
    return ranked.head(n)


def placements(run: RunData, n: int = 3) -> list[dict[str, Any]]:
    """The last allocation (node → GPUs) of each of the `n` largest started jobs."""
    if run.decisions is None:
        return []
    top = largest_jobs(run, n)
    dec = run.decisions.filter(pl.col("decision").is_in(ALLOC_DECISIONS) & pl.col("job").is_in(top["job_id"].implode()))
    last = dec.group_by("job", maintain_order=True).last()
    by_job = {row["job"]: row for row in last.iter_rows(named=True)}
    out = []
    for row in top.iter_rows(named=True):
        d = by_job.get(row["job_id"])
        if d is None:
            continue
        alloc: dict[str, int] = {}
        for item in d["nodes"] or []:
            node, _, g = item.rpartition(":")
            alloc[node] = alloc.get(node, 0) + int(g)
        out.append({"job": row["job_id"], "gpus": row["gpus"], "nodes": alloc, "time": d["time"],
                    "decision": d["decision"], "plan": d.get("plan")})
    return out


# ------------------------------------------------------------ decision table
def decision_subset(run: RunData, first: int = 5000, top_jobs: int = 100) -> tuple[pl.DataFrame, str]:
    """The first `first` decisions plus every decision of the `top_jobs` largest jobs, and a note saying so."""
    dec = run.decisions
    if dec is None:
        if (run.path / "decisions.jsonl").is_file():
            return pl.DataFrame(), "The run made no decisions."
        return pl.DataFrame(), "This run has no decision log (it was made with --no-decision-log)."
    dec = dec.with_row_index("seq")
    if len(dec) <= first:
        return dec, f"All {len(dec):,} decisions."
    big = largest_jobs(run, top_jobs)["job_id"].implode()
    subset = dec.filter((pl.col("seq") < first) | pl.col("job").is_in(big))
    return subset, (f"{len(subset):,} of {len(dec):,} decisions: the first {first:,} plus every decision of the "
                    f"{top_jobs} largest jobs (by GPUs). The full log is decisions.jsonl in the run directory.")
