"""SLA attainment per tier of a finished run (tiers: `loom.workload.tiers`).

A job's GPUs over time are rebuilt from the run record
(`SimulationResult.record`), never from a policy object:

* the lifecycle transitions say when it holds GPUs — from each move into
  STARTING (a Start or Resume: its GPUs are committed) until it leaves
  STARTING or RUNNING for anything else (stopping on a Preempt or Cancel,
  a failed launch, a failure that sends it to recovery or back to the queue,
  the end);
* the decisions say how many: each move into STARTING takes the allocation of
  the Start / Resume that caused it, and a Resize or Migrate changes the count
  while it runs.

Decisions alone are not enough: a node failure stops a job without any
decision (it is a transition, RUNNING → RECOVERING / SUSPENDED / FAILED,
caused by "JobFailed: …"), and the job must count 0 GPUs while it waits.
The two logs are merged per job in the order the core wrote them (see
`held_steps`). Its time in system runs from submit to its end (or to the
run's end if it never finished).

Per tier (`premium`, `standard`, `basic`, by the run's `TierRule`), over the
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

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from loom.core.decisions import (
    Cancel,
    Decision,
    Migrate,
    Preempt,
    Resize,
    Resume,
    Start,
)
from loom.core.jobs import Job, JobState
from loom.core.record import RunRecord, Transition
from loom.errors import LoomInputError
from loom.sim.engine import SimulationResult
from loom.workload.tiers import TIERS, TierRule

MET = 0.99
_HOLDING = (JobState.STARTING, JobState.RUNNING)
# decisions the core turns into a transition at once (into STARTING, into STOPPING): they pin the
# decision log to the transition log; Resize / Migrate fall between two of them
_ANCHORS = (Start, Resume, Preempt, Cancel)
_ANCHOR_STATES = (JobState.STARTING, JobState.STOPPING)
_JOB_DECISIONS = (*_ANCHORS, Resize, Migrate)


@dataclass(frozen=True, slots=True)
class JobAttainment:
    job_id: str
    tier: str
    attainment: float
    held_share: float


def _job_steps(transitions: Sequence[Transition], decisions: Sequence[tuple[float, Decision]],
               fallback: int) -> list[tuple[float, int]]:
    """(time, GPUs held from then on) for one job, from its transitions and decisions in order.

    The two logs share no sequence number, so they are aligned by what the core guarantees:
    every Start / Resume is followed at once by the job's move into STARTING and every Preempt /
    Cancel by its move into STOPPING (no other transition enters those states), so the k-th such
    decision is the k-th such transition. A Resize or Migrate logged after the k-th of them came
    after that transition and before the next one; among the transitions in between (JobStarted,
    restarts, failures) it comes at its time — at the same instant, after the job started running
    and before it stopped. `fallback`: GPUs of a launch whose decision is missing from the log.
    """
    launches = iter([d.allocation.total for _, d in decisions if isinstance(d, (Start, Resume))])
    moves: list[tuple[float, int, int]] = []  # (time, anchors logged before it, new GPU count)
    logged = 0
    for t, d in decisions:
        if isinstance(d, _ANCHORS):
            logged += 1
        elif isinstance(d, (Resize, Migrate)):
            moves.append((t, logged, d.allocation.total))

    steps: list[tuple[float, int]] = []
    state: JobState | None = None
    seen = m = 0  # anchor transitions walked; moves applied
    for tr in transitions:
        anchor = tr.new in _ANCHOR_STATES
        leaves = tr.old is JobState.RUNNING and tr.new is not JobState.RUNNING
        while m < len(moves):
            t, after, gpus = moves[m]
            if after > seen or (after == seen and not (anchor or t < tr.at or (t == tr.at and leaves))):
                break
            if state is JobState.RUNNING:
                steps.append((t, gpus))
            m += 1
        if anchor:
            seen += 1
        if tr.new is JobState.STARTING:
            steps.append((tr.at, next(launches, fallback)))
        elif tr.old in _HOLDING and tr.new not in _HOLDING:
            steps.append((tr.at, 0))
        state = tr.new
    if state is JobState.RUNNING:  # still running when the run ended
        steps.extend((t, gpus) for t, _, gpus in moves[m:])
    return steps


def held_steps(result: SimulationResult) -> dict[str, list[tuple[float, int]]]:
    """Per job, (time, GPUs held from then on) in time order, from the run record."""
    return _held_steps(result.record, result.jobs)


def _held_steps(record: RunRecord, jobs: Sequence[Job]) -> dict[str, list[tuple[float, int]]]:
    transitions: dict[str, list[Transition]] = {}
    for tr in record.transitions:
        transitions.setdefault(tr.job_id, []).append(tr)
    decisions: dict[str, list[tuple[float, Decision]]] = {}
    for t, d in record.decisions:
        if isinstance(d, _JOB_DECISIONS):
            decisions.setdefault(d.job_id, []).append((t, d))
    out: dict[str, list[tuple[float, int]]] = {}
    for job in jobs:
        mine = transitions.get(job.job_id)
        if mine:
            fallback = job.allocation.total if job.allocation is not None else job.gpus
            out[job.job_id] = _job_steps(mine, decisions.get(job.job_id, ()), fallback)
    return out


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


def _rule(rule: TierRule) -> TierRule:
    if not isinstance(rule, TierRule):
        raise TypeError(f"SLA attainment takes the run's TierRule (an sla policy's `.rule`, or "
                        f"`loom.workload.tiers.tier_rule(params)`), got {type(rule).__name__}")
    return rule


def per_job(result: SimulationResult, rule: TierRule) -> list[JobAttainment]:
    if not result.decisions and any(j.first_start is not None for j in result.jobs):
        raise LoomInputError("SLA attainment needs the decision log: run with log_decisions=True",
                             field="log_decisions")
    tiers = _rule(rule)
    steps = held_steps(result)
    return [job_attainment(j, steps.get(j.job_id, []), tiers.guarantee(j.spec, j.plan), result.end_time,
                           tiers.tier(j.spec))
            for j in result.jobs if j.state is not JobState.REJECTED]


def sla_attainment(result: SimulationResult, rule: TierRule) -> list[dict]:
    """One row per tier, highest first; see the module docstring for the fields."""
    fractions = _rule(rule).fractions
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
