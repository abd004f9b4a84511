"""Per-VC fairness of a finished run under GPU quotas (`loom.workload.quotas`).

For each VC (every VC named in `quotas` plus every VC a job belongs to; jobs
without a VC are grouped under `vc = None`), `vc_fairness` reports:

* `quota` — guaranteed GPUs (`default_quota` for VCs not in `quotas`);
  `quota_share` — its fraction of all quotas.
* `guaranteed_gpu_seconds` / `best_effort_gpu_seconds` — GPU-seconds its
  guaranteed and best-effort jobs held (a job is best-effort by the rule of
  `loom.workload.quotas`, as the policy: preemptible, or of a class in
  `best_effort_classes`);
  `guaranteed_share` — its fraction of all guaranteed GPU-seconds, to compare
  with `quota_share`.
* `entitled_gpu_seconds` = quota × makespan (the run's first arrival to the
  last moment a job held GPUs).
* `normalized_share` = (guaranteed + best-effort GPU-seconds) /
  entitled GPU-seconds: 1.0 means the VC used exactly its entitlement, below 1
  less (idle quota or little demand), above 1 more (borrowing). None when the
  entitlement is 0.
* `avg_queue_s` — mean time from submit to first start over its jobs that
  started (`avg_guaranteed_queue_s` the same for guaranteed jobs only);
  `unstarted` — its jobs that never started.
* `best_effort_preemptions` — preemptions its best-effort jobs suffered.

`fairness_index(rows)` is Jain's index, (Σx)² / (n·Σx²), over the
`normalized_share` of the VCs with a positive quota: 1.0 when every VC got the
same share of its entitlement, down to 1/n when one VC got everything. It
measures allocation against entitlement, not against demand: a VC that simply
submitted little work lowers it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from loom.sim.engine import SimulationResult
from loom.workload.job import JobSpec
from loom.workload.quotas import (
    DEFAULT_BEST_EFFORT_CLASSES,
    best_effort_rule,
    check_quota_value,
    parse_quotas,
)


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index of non-negative values; 1.0 for none or all zero."""
    xs = [float(v) for v in values]
    if any(x < 0 for x in xs):
        raise ValueError("Jain's index is defined for non-negative values")
    squares = sum(x * x for x in xs)
    if not xs or squares == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * squares)


def vc_fairness(result: SimulationResult, quotas: Mapping[str, int], *, default_quota: int = 0,
                best_effort_classes: Iterable[str] | None = DEFAULT_BEST_EFFORT_CLASSES,
                is_best_effort: Callable[[JobSpec], bool] | None = None) -> list[dict]:
    """One row per VC (sorted by name, None last); see the module docstring for the fields."""
    quotas = parse_quotas(quotas, "quotas")
    default_quota = check_quota_value(default_quota, "default_quota")
    best_effort = is_best_effort or best_effort_rule(best_effort_classes, "best_effort_classes")
    makespan = max(0.0, result.end_time - result.start_time)
    rows: dict[str | None, dict] = {}

    def row(vc: str | None) -> dict:
        if vc not in rows:
            quota = quotas.get(vc, default_quota) if vc is not None else default_quota
            rows[vc] = {"vc": vc, "quota": quota, "jobs": 0, "finished": 0, "unstarted": 0,
                        "guaranteed_gpu_seconds": 0.0, "best_effort_gpu_seconds": 0.0,
                        "best_effort_preemptions": 0, "_queue": [], "_gqueue": []}
        return rows[vc]

    for vc in quotas:
        row(vc)
    for job in result.jobs:
        spec = job.spec
        r = row(None if spec.vc is None else str(spec.vc))
        be = best_effort(spec)
        r["jobs"] += 1
        r["finished"] += job.end_time is not None
        if be:
            r["best_effort_gpu_seconds"] += job.gpu_seconds
            r["best_effort_preemptions"] += job.preemptions
        else:
            r["guaranteed_gpu_seconds"] += job.gpu_seconds
        if job.first_start is None:
            r["unstarted"] += 1
        else:
            wait = job.first_start - spec.submit_time
            r["_queue"].append(wait)
            if not be:
                r["_gqueue"].append(wait)

    total_quota = sum(r["quota"] for r in rows.values())
    total_guaranteed = sum(r["guaranteed_gpu_seconds"] for r in rows.values())
    out = []
    for vc in sorted(rows, key=lambda v: (v is None, v or "")):
        r = rows[vc]
        queue, gqueue = r.pop("_queue"), r.pop("_gqueue")
        entitled = r["quota"] * makespan
        used = r["guaranteed_gpu_seconds"] + r["best_effort_gpu_seconds"]
        r["quota_share"] = r["quota"] / total_quota if total_quota else 0.0
        r["guaranteed_share"] = r["guaranteed_gpu_seconds"] / total_guaranteed if total_guaranteed else 0.0
        r["entitled_gpu_seconds"] = entitled
        r["normalized_share"] = used / entitled if entitled > 0 else None
        r["avg_queue_s"] = sum(queue) / len(queue) if queue else None
        r["avg_guaranteed_queue_s"] = sum(gqueue) / len(gqueue) if gqueue else None
        out.append(r)
    return out


def fairness_index(rows: Iterable[dict]) -> float:
    """Jain's index over the normalised shares of VCs with a positive quota."""
    return jain_index(r["normalized_share"] for r in rows if r["normalized_share"] is not None)
