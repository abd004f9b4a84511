"""SLA attainment per tier of an `sla` run, from its files (the definitions of `loom.report.sla`,
which computes the same from the in-memory run record).

Per job, over its time in system (submit → end, or the run's end if it never finished):
attainment = share of that time it held at least its tier's guarantee (and at least one GPU);
held share = time-averaged GPUs held ÷ GPUs requested. Per tier: the mean of each over the tier's
jobs, and `met_99` = share of jobs with attainment ≥ 0.99. GPUs held come from the decision log
(`loom.report.data.allocation_intervals`, with spans cut where a failure stopped the job).

Tiers and guarantees come from the policy's parameters in the manifest (`tier_rule`); a job's
tier may depend on its priority, which the run's files do not hold, so the trace is read again
(`loom.report.inputs.simulated_specs`). Jobs whose spec cannot be found are left out and counted.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from loom.report import inputs
from loom.report.data import RunData, allocation_intervals, run_end

TIER_POLICIES = ("sla",)
MET = 0.99  # as loom.report.sla (not imported: it pulls in the simulator)


def applies(run: RunData) -> bool:
    return inputs.policy_name(run) in TIER_POLICIES


def job_tiers(run: RunData) -> tuple[pl.DataFrame, int] | None:
    """(job, tier, guarantee) per simulated job and how many jobs had no spec; None if the specs
    cannot be read at all."""
    from loom.errors import LoomInputError
    from loom.workload.tiers import tier_rule

    try:
        rule = tier_rule(inputs.policy_params(run))
    except LoomInputError:
        return None
    specs = inputs.simulated_specs(run)
    if specs is None:
        return None
    plans = _plans(run)
    rows: dict[str, list[Any]] = {"job": [], "tier": [], "guarantee": []}
    missing = 0
    for job in run.jobs.filter(pl.col("state") != "rejected")["job_id"].to_list():
        spec = specs.get(job)
        if spec is None:
            missing += 1
            continue
        rows["job"].append(job)
        rows["tier"].append(rule.tier(spec))
        rows["guarantee"].append(rule.guarantee(spec, plans.get(job)))
    return pl.DataFrame(rows, schema={"job": pl.Utf8, "tier": pl.Utf8, "guarantee": pl.Int64}), missing


def _plans(run: RunData) -> dict[str, Any]:
    """Job → its parallel plan (dp × tp × pp) from its first decision that carries one."""
    from loom.core.plan import ParallelPlan

    dec = run.decisions
    if dec is None or "plan" not in dec.columns:
        return {}
    first = dec.filter(pl.col("plan").is_not_null() & pl.col("job").is_not_null()).group_by(
        "job", maintain_order=True).first()
    out = {}
    for job, plan in first.select("job", "plan").iter_rows():
        dp, tp, pp = (int(x) for x in plan.split("x"))
        out[job] = ParallelPlan(dp=dp, tp=tp, pp=pp)
    return out


def attainment(run: RunData) -> dict[str, Any] | None:
    """{"rows": per tier (tier, fraction, jobs, attainment, met_99, held_share), "missing": n}."""
    found = job_tiers(run)
    if found is None:
        return None
    tiers, missing = found
    per_job = _per_job(run, tiers)
    from loom.workload.tiers import TIERS, tier_rule

    fractions = tier_rule(inputs.policy_params(run)).fractions
    rows = []
    for tier in TIERS:
        mine = per_job.filter(pl.col("tier") == tier)
        n = mine.height
        rows.append({"tier": tier, "fraction": fractions[tier], "jobs": n,
                     "attainment": mine["attainment"].mean() if n else None,
                     "met_99": float((mine["attainment"] >= MET).mean()) if n else None,
                     "held_share": mine["held_share"].mean() if n else None})
    return {"rows": rows, "missing": missing}


def _per_job(run: RunData, tiers: pl.DataFrame) -> pl.DataFrame:
    """job, tier, attainment, held_share from the allocation spans clipped to each job's time in system."""
    until = run_end(run)
    jobs = run.jobs.select(pl.col("job_id").alias("job"), pl.col("submit").alias("a"),
                           pl.col("end").fill_null(until).alias("b"), pl.col("gpus").alias("request"))
    jobs = tiers.join(jobs, on="job", how="left")
    spans = allocation_intervals(run).select("job", "t0", "t1", "gpus").join(jobs, on="job", how="inner")
    length = (pl.min_horizontal("t1", "b") - pl.max_horizontal("t0", "a")).clip(lower_bound=0.0)
    met = pl.col("gpus") >= pl.max_horizontal("guarantee", pl.lit(1))
    per = spans.group_by("job").agg((pl.when(met).then(length).otherwise(0.0)).sum().alias("met_s"),
                                    (length * pl.col("gpus")).sum().alias("held_gpu_s"))
    span = pl.col("b") - pl.col("a")
    return jobs.join(per, on="job", how="left").with_columns(pl.col("met_s", "held_gpu_s").fill_null(0.0)).select(
        "job", "tier",
        pl.when(span > 0).then(pl.col("met_s") / span).otherwise(1.0).alias("attainment"),
        pl.when(span > 0).then(pl.col("held_gpu_s") / span / pl.col("request")).otherwise(1.0).alias("held_share"))
