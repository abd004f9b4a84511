"""SLA attainment per tier of a finished run (see `loom.policies.sla`).

A job's GPUs over time are rebuilt from the run's decision log
(`SimulationResult.decisions`): Start / Resume / Resize / Migrate set the GPUs
it holds to its new allocation's size, Preempt (by the policy or by a node
failure) to 0, and its end time to 0. Its time in system runs from submit to
its end (or to the run's end if it never finished).

Per tier (`premium`, `standard`, `basic`, by the policy's tier rule), over the
tier's jobs (rejected jobs excluded):

* `attainment` — mean over jobs of the share of its time in system during which
  it held at least its guarantee, and at least one GPU (queueing counts
  against it; a best-effort job with no guarantee thus "attains" while it runs);
* `met_99` — fraction of jobs with attainment ≥ 0.99;
* `held_share` — mean over jobs of time-averaged GPUs held ÷ GPUs requested;
* `jobs`, `fraction` (the tier's guaranteed fraction of the request).

Tiers with no jobs report `jobs = 0` and None for the averages.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from loom.core.decisions import Migrate, Preempt, Resize, Resume, Start
from loom.core.jobs import Job, JobState
from loom.errors import LoomInputError
from loom.policies.sla import TIERS, SlaTiers, TierRule, tier_rule_of
from loom.sim.engine import SimulationResult

MET = 0.99


@dataclass(frozen=True, slots=True)
class JobAttainment:
    job_id: str
    tier: str
    attainment: float
    held_share: float


def held_steps(result: SimulationResult) -> dict[str, list[tuple[float, int]]]:
    """Per job, (time, GPUs held from then on) in log order."""
    steps: dict[str, list[tuple[float, int]]] = {}
    for t, d in result.decisions:
        if isinstance(d, (Start, Resume, Resize, Migrate)):
            steps.setdefault(d.job_id, []).append((t, d.allocation.total))
        elif isinstance(d, Preempt):
            steps.setdefault(d.job_id, []).append((t, 0))
    return steps


def job_attainment(job: Job, steps: list[tuple[float, int]], need: int, until: float, tier: str) -> JobAttainment:
    """Share of [submit, end] holding ≥ `need` GPUs (and ≥ 1), and the mean held ÷ requested."""
    start = job.spec.submit_time
    end = job.end_time if job.end_time is not None else until
    span = end - start
    if span <= 0:
        return JobAttainment(job.job_id, tier, 1.0, 1.0)
    threshold = max(need, 1)
    met = held = 0.0
    points = [*steps, (end, 0)]
    for (t0, gpus), (t1, _) in pairwise(points):
        a, b = max(t0, start), min(t1, end)
        if b <= a:
            continue
        held += gpus * (b - a)
        if gpus >= threshold:
            met += b - a
    return JobAttainment(job.job_id, tier, met / span, held / span / job.spec.gpus)


def per_job(result: SimulationResult, rule: SlaTiers | TierRule) -> list[JobAttainment]:
    if not result.decisions and any(j.first_start is not None for j in result.jobs):
        raise LoomInputError("SLA attainment needs the decision log: run with log_decisions=True",
                             field="log_decisions")
    tiers = tier_rule_of(rule)
    steps = held_steps(result)
    return [job_attainment(j, steps.get(j.job_id, []), tiers.guarantee(j.spec, j.plan), result.end_time,
                           tiers.tier(j.spec))
            for j in result.jobs if j.state is not JobState.REJECTED]


def sla_attainment(result: SimulationResult, rule: SlaTiers | TierRule) -> list[dict]:
    """One row per tier, highest first; see the module docstring for the fields."""
    fractions = tier_rule_of(rule).fractions
    jobs = per_job(result, rule)
    rows = []
    for tier in TIERS:
        mine = [j for j in jobs if j.tier == tier]
        n = len(mine)
        rows.append({
            "tier": tier,
            "fraction": fractions[tier],
            "jobs": n,
            "attainment": sum(j.attainment for j in mine) / n if n else None,
            "met_99": sum(j.attainment >= MET for j in mine) / n if n else None,
            "held_share": sum(j.held_share for j in mine) / n if n else None,
        })
    return rows
