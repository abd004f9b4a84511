"""Per-job figures researchers compare schedulers by, as plain data: bounded slowdown, who waited,
and queueing / slowdown per job class or VC with Jain's fairness index across the groups.

* **Bounded slowdown** of a finished job = JCT / max(run time, 10 s), floored at 1 (Feitelson's
  bounded slowdown; the 10 s threshold keeps jobs of a few seconds from dominating the mean).
  Run time is the job's own duration at its requested size (`run_s`, from the trace or the speed
  model), so time lost to preemption, shrinking or failures counts as slowdown; when a job has no
  recorded duration its end − first start is used instead.
* **Waited**: a job waited when its queueing delay (first start − submit) is at least 1 s.
* **Jain's index across groups** = (Σx)² / (n·Σx²) over the groups' *mean bounded slowdown*:
  1.0 when every group is slowed down equally on average, 1/n when one group carries all of it.
  Slowdown rather than queueing delay, because it is normalised by job length (large groups of
  long jobs are not unfair just for waiting longer) and never 0 (a mean delay of 0 next to a
  mean of a few seconds would read as maximal unfairness).
"""

from __future__ import annotations

import numpy as np
import polars as pl

SLOWDOWN_THRESHOLD_S = 10.0
WAIT_THRESHOLD_S = 1.0  # a queueing delay below this is "did not wait"
MOSTLY_NO_WAIT = 0.5  # from this share of non-waiting jobs on, the queueing CDF shows the jobs that waited


def slowdown_expr() -> pl.Expr:
    """Bounded slowdown of a finished job (null otherwise); see the module docstring."""
    ran = pl.col("end") - pl.col("start")
    run = pl.col("run_s").fill_null(ran)
    value = pl.col("jct_s") / pl.max_horizontal(run, pl.lit(SLOWDOWN_THRESHOLD_S))
    return pl.when(pl.col("state") == "finished").then(pl.max_horizontal(value, pl.lit(1.0))).alias("slowdown")


def with_slowdown(jobs: pl.DataFrame) -> pl.DataFrame:
    """The jobs table with a `slowdown` column."""
    return jobs if "slowdown" in jobs.columns else jobs.with_columns(slowdown_expr())


def bounded_slowdown(jobs: pl.DataFrame) -> np.ndarray:
    """Bounded slowdown of every finished job, in table order."""
    return with_slowdown(jobs)["slowdown"].drop_nulls().to_numpy()


def distribution(values: np.ndarray) -> dict[str, float | int | None]:
    """n, mean, p50, p99 (linear interpolation, as summary.json), max; None for no values."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {"n": 0, "mean": None, "p50": None, "p99": None, "max": None}
    return {"n": int(arr.size), "mean": float(arr.mean()), "p50": float(np.median(arr)),
            "p99": float(np.percentile(arr, 99)), "max": float(arr.max())}


def wait_split(queue: np.ndarray) -> tuple[float, np.ndarray]:
    """Share of started jobs that did not wait (delay < 1 s) and the delays of those that did."""
    arr = np.asarray(queue, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return 0.0, arr
    waited = arr[arr >= WAIT_THRESHOLD_S]
    return 1.0 - waited.size / arr.size, waited


def grouped(jobs: pl.DataFrame, by: str | None, top: int = 8) -> dict[str, pl.DataFrame]:
    """The jobs split by `by` (the `top` groups with most jobs, the rest as "other"); {"all": jobs}
    for None, {} when the column is missing or has fewer than 2 groups."""
    if by is None:
        return {"all": jobs}
    if by not in jobs.columns or jobs[by].drop_nulls().n_unique() < 2:
        return {}
    keys = jobs[by].cast(pl.Utf8).fill_null("(none)")
    keep = keys.value_counts(sort=True)[keys.name][:top].to_list()
    out = {k: jobs.filter(keys == k) for k in keep}
    rest = jobs.filter(~keys.is_in(keep))
    if rest.height:
        out["other"] = rest
    return out


def group_table(jobs: pl.DataFrame, by: str, top: int = 20) -> pl.DataFrame | None:
    """Per group of `by` (most jobs first; past `top` groups the rest as "other"): job count,
    share that did not wait, queueing delay mean/p50/p99, bounded slowdown mean/p50/p99, JCT
    mean/p99 and GPU-hours; None when the column is missing or has fewer than 2 groups."""
    if by not in jobs.columns or jobs[by].drop_nulls().n_unique() < 2:
        return None
    key = pl.col(by).cast(pl.Utf8).fill_null("(none)")
    frame = with_slowdown(jobs).with_columns(key.alias("group"))
    keep = frame["group"].value_counts(sort=True)["group"][:top]
    frame = frame.with_columns(pl.when(pl.col("group").is_in(keep.implode())).then("group")
                               .otherwise(pl.lit("other")).alias("group"))
    total = jobs["gpu_seconds"].sum() or 1.0
    q, s, j = pl.col("queue_s"), pl.col("slowdown"), pl.col("jct_s")
    return frame.group_by("group").agg(
        pl.len().alias("jobs"),
        (q < WAIT_THRESHOLD_S).sum().alias("_no_wait"), q.count().alias("_started"),
        q.mean().alias("queue_mean_s"), q.median().alias("queue_p50_s"), q.quantile(0.99, "linear").alias("queue_p99_s"),
        s.mean().alias("slowdown_mean"), s.median().alias("slowdown_p50"), s.quantile(0.99, "linear").alias("slowdown_p99"),
        j.mean().alias("jct_mean_s"), j.quantile(0.99, "linear").alias("jct_p99_s"),
        (pl.col("gpu_seconds").sum() / 3600).alias("gpu_hours"),
        (pl.col("gpu_seconds").sum() / total).alias("gpu_hours_share"),
    ).with_columns((pl.col("_no_wait") / pl.col("_started")).alias("no_wait_share")).drop(
        "_no_wait", "_started").sort("jobs", "group", descending=[True, False]).select(
        pl.col("group").alias(by), "jobs", "no_wait_share", pl.exclude(by, "group", "jobs", "no_wait_share"))


def group_jain(table: pl.DataFrame) -> float | None:
    """Jain's index over the groups' mean bounded slowdown (groups with a finished job); None below 2."""
    from loom.report.fairness import (
        jain_index,  # imports the engine: only when there are groups
    )

    means = table["slowdown_mean"].drop_nulls().to_list()
    return jain_index(means) if len(means) >= 2 else None
