"""Sanity warnings: runs that are technically correct but implausible.

A replay can finish without error and still mean little: a light trace on a
big inventory (Alibaba v2023 at 0.3% utilisation for 149 days), one job the
estimator prices at 938 days stretching the makespan to 979 days, every job
rejected. Each check here names what it saw, the likely cause and the knob
that changes it; the terminal, `summary.json` (`warnings`) and the report show
the same list. Thresholds are data (`SanityLimits`), so a study can tighten
or loosen them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loom.core.jobs import Job, JobState
from loom.report.columns import JobTable
from loom.sim.engine import SimulationResult

DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class SanityLimits:
    min_utilization: float = 0.10  # below this the cluster mostly idles
    min_span_for_utilization_s: float = DAY  # shorter runs are allowed to be idle
    single_job_queue_share: float = 0.5  # one job owning this share of all queueing time
    min_total_queue_s: float = 3_600.0  # less queueing than this is not worth a warning
    duration_over_span: float = 5.0  # a job running this many times the trace's arrival span


@dataclass(frozen=True, slots=True)
class SanityWarning:
    """One finding: a stable `code` for scripts, and a sentence for people."""

    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def sanity_warnings(result: SimulationResult, stats: dict[str, float | int],
                    limits: SanityLimits = SanityLimits(), table: JobTable | None = None) -> list[SanityWarning]:
    """Every check that fires, in a fixed order (`table`: the run's `JobTable` if already built)."""
    t = table if table is not None else JobTable(result)
    found = [_all_rejected(result), _low_utilization(stats, limits), _queue_hog(t, limits),
             *_overlong_jobs(t, limits)]
    return [w for w in found if w is not None]


def _all_rejected(result: SimulationResult) -> SanityWarning | None:
    jobs = len(result.jobs)
    if jobs == 0 or len(result.rejected) < jobs:
        return None
    reason = next(iter(result.rejected.values()), "")
    return SanityWarning("all-rejected", f"all {jobs:,} jobs were rejected (e.g. {reason}): the cluster cannot "
                                    "hold them; pick a larger cluster (--cluster) or check the jobs' GPU types")


def _low_utilization(stats: dict[str, float | int], limits: SanityLimits) -> SanityWarning | None:
    util, span = float(stats.get("gpu_utilization", 0.0)), float(stats.get("makespan_s", 0.0))
    if span < limits.min_span_for_utilization_s or util >= limits.min_utilization:
        return None
    return SanityWarning("low-utilization", f"GPU utilisation is {util:.1%} over {span / DAY:,.1f} days: the trace is "
                                       "too light for this cluster; compress arrivals with --load X, replay it "
                                       "several times with --repeat N, or use a smaller cluster")


def _queue_hog(t: JobTable, limits: SanityLimits) -> SanityWarning | None:
    started = np.flatnonzero(t.started)
    if not len(started):
        return None
    waits = (t.first - t.submit)[started]
    total = float(waits.sum())
    if total < limits.min_total_queue_s:
        return None
    worst = int(waits.argmax())
    share = float(waits[worst]) / total
    if share < limits.single_job_queue_share:
        return None
    job = t.jobs[int(started[worst])]
    return SanityWarning("queue-one-job", f"job {job.job_id} ({job.spec.gpus} GPUs) accounts for {share:.0%} of all "
                                     f"queueing ({waits[worst] / DAY:,.1f} days waited): averages describe this "
                                     "one job; look at p50 or check why it waits (size, GPU type, reservation)")


def _overlong_jobs(t: JobTable, limits: SanityLimits) -> list[SanityWarning]:
    if len(t) < 2:
        return []
    span = max(t.submit_time) - min(t.submit_time)
    if span <= 0:
        return []
    # `_run_time` of every job, as a column; rejected jobs never count
    recorded = np.array([d or 0.0 for d in t.duration], dtype=np.float64)
    ran = ~np.isnan(t.first) & ~np.isnan(t.end)
    durations = np.where(ran, t.end - t.first, recorded)
    long = np.flatnonzero(~t.is_state(JobState.REJECTED) & (durations > limits.duration_over_span * span))
    if not len(long):
        return []
    worst = int(long[int(durations[long].argmax())])  # the longest; the first of equals, as a stable sort
    d, job = float(durations[worst]), t.jobs[worst]
    more = f" ({len(long) - 1} more like it)" if len(long) > 1 else ""
    return [SanityWarning("job-longer-than-trace",
                     f"job {job.job_id} runs {d / DAY:,.1f} days, {d / span:,.0f}× the trace's {span / DAY:,.1f}-day "
                     f"arrival span{more}: it alone sets the makespan; check its spec (a speed model pricing "
                     "work it cannot do fast?) or leave it out with --limit / a filtered trace")]


def _run_time(job: Job) -> float:
    """How long the job ran, first start to end, as the run priced it (the trace's duration if it
    never ended): with an estimator speed model this is the estimator's figure."""
    if job.end_time is not None and job.first_start is not None:
        return job.end_time - job.first_start
    return job.spec.duration or 0.0
