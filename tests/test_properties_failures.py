"""Properties of the simulator under failures with interruptions priced (issue 8):
random clusters, traces, node failures, chaos preemptions/migrations and job-level
failure plans (infrastructure faults and hangs, which are recoverable), with the
interruption cost model and the recovery pipeline on.

* no job ever runs on a failed node, GPUs are never allocated twice (AuditPolicy, each round);
* every job ends in a terminal state (finished, or rejected when it can never fit);
* no work is counted twice: the GPU time jobs held equals their work plus exactly the
  priced overheads (pauses, checkpoint stalls, lost work) — nothing more, nothing less. The GPU
  time held is rebuilt from the run record's transitions, not read from the engine's
  accumulators, so an overhead dropped from both the clock and the totals cannot balance out;
* checkpoint stalls are really taken: a job that ran start to finish without interruption ran
  its duration plus one stall (priced by the cost model) per checkpoint interval of progress
  but the last, by the run record — and the run's checkpoint total includes those stalls;
* lost work per failure is at most the time since the last durable checkpoint.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from simharness import PROPERTY_SETTINGS, Scenario, scenarios, simulate, type_capacity

from loom.core.decisions import Start
from loom.core.jobs import JobState
from loom.hardware.clos import clos
from loom.workload.job import JobSpec
from loom.perf.interruptions import InterruptionCosts, InterruptionModel
from loom.core.recovery import RecoveryConfig
from loom.workload.job_failures import FailurePlan

INTERVAL = 300.0  # short, so the random traces' jobs checkpoint


@st.composite
def failing(draw: st.DrawFn):
    sc: Scenario = draw(scenarios(permanent_failures=False))
    mode = draw(st.sampled_from(["sync", "async"]))
    plans = {}
    for spec in sc.specs:
        if spec.duration and spec.duration > 2 and draw(st.integers(0, 3)) == 0:
            kind = draw(st.sampled_from(["infrastructure", "hang"]))
            at = draw(st.floats(0.05, 0.95)) * spec.duration
            plans[spec.job_id] = [FailurePlan(spec.job_id, kind, at)]
    spares = draw(st.integers(0, 1))
    replacement = draw(st.sampled_from(["topology", "naive", "policy"]))
    return sc, mode, plans, spares, replacement


def run(case):
    sc, mode, plans, spares, replacement = case
    model = InterruptionModel(InterruptionCosts(checkpoint_mode=mode, checkpoint_interval_s=INTERVAL))
    return sc, model, simulate(sc, interruptions=model, job_failures=plans, hang_watchdog_s=60.0,
                               infra_repair_s=200.0,
                               recovery=RecoveryConfig(replacement=replacement, spares_per_minipod=spares))


HOLDING = (JobState.STARTING, JobState.RUNNING)


def spells(result) -> tuple[dict[str, float], dict[str, float]]:
    """Per job, seconds holding GPUs (STARTING or RUNNING) and seconds RUNNING, from the run
    record's transitions alone."""
    held: dict[str, float] = defaultdict(float)
    running: dict[str, float] = defaultdict(float)
    since: dict[tuple[str, str], float] = {}
    for t in result.record.transitions:
        for kind, states, out in (("held", HOLDING, held), ("run", (JobState.RUNNING,), running)):
            if t.new in states and t.old not in states:
                since[kind, t.job_id] = t.at
            elif t.old in states and t.new not in states:
                out[t.job_id] += t.at - since.pop((kind, t.job_id))
    assert not since, f"still holding GPUs at the end of the run: {since}"
    return held, running


# one job on one node that checkpoints three times (1000 s of progress, every 300 s) and one
# that a hang interrupts, so the checkpoint rule and the totals are exercised on every run
_ONE_NODE = clos("one", minipods=1, nodes=2, gpus_per_node=8)
_CHECKPOINTS = (Scenario(_ONE_NODE, [JobSpec("c", 0.0, 8, 1000.0), JobSpec("h", 0.0, 8, 700.0)], "fcfs",
                         "first-fit"), "sync", {"h": [FailurePlan("h", "hang", 350.0)]}, 0, "topology")


@PROPERTY_SETTINGS
@example(_CHECKPOINTS)
@example((*_CHECKPOINTS[:1], "async", *_CHECKPOINTS[2:]))
@given(failing())
def test_every_job_ends_and_no_work_is_counted_twice(case) -> None:
    sc, model, r = run(case)
    result = r.result
    for job in result.jobs:
        fits = job.spec.gpus <= type_capacity(sc.topology, job.spec.gpu_type)
        if fits and not case[3]:  # with spares held back a job may never fit the rest
            assert job.state is JobState.FINISHED, f"{job} fits but ended {job.state.name}"
        assert job.state in (JobState.FINISHED, JobState.REJECTED, JobState.PENDING, JobState.SUSPENDED)
    finished = [j for j in result.jobs if j.state is JobState.FINISHED]
    totals = result.interruptions
    # GPU time held, from the record (the GPU count never changes here: no resizes, and recoveries
    # and migrations keep it)
    held_s, running_s = spells(result)
    held = sum(held_s[j.job_id] * j.spec.gpus for j in result.jobs)
    assert held == pytest.approx(sum(j.gpu_seconds for j in result.jobs), rel=1e-6, abs=1e-3)
    done = sum(j.spec.duration * j.spec.gpus for j in finished)
    partial = sum(j.progress * j.spec.gpus for j in result.jobs
                  if j.state in (JobState.PENDING, JobState.SUSPENDED) and j.first_start is not None)
    work = done + partial
    expected = work + totals.paused_gpu_s + totals.checkpoint_gpu_s + totals.lost_gpu_s
    assert held == pytest.approx(expected, rel=1e-6, abs=1e-3)
    # the stalls of jobs that ran start to finish at once, priced independently: a periodic
    # checkpoint after every INTERVAL of progress but the last, each the cost model's stall
    first_start = {}
    for _, d in result.decisions:
        if isinstance(d, Start):
            first_start.setdefault(d.job_id, d.allocation)
    stalled = 0.0
    for job in finished:
        if job.failures or job.preemptions or job.migrations or job.resizes:
            continue
        spec, alloc = job.spec, first_start[job.job_id]
        stall = model.checkpoint_stall_s(model.shape(spec, alloc.total, len(alloc.nodes)))
        checkpoints = max(0, math.ceil(spec.duration / INTERVAL) - 1)
        tol = 1e-6 * max(1.0, job.end_time)
        assert running_s[job.job_id] == pytest.approx(spec.duration + checkpoints * stall, abs=tol), (
            f"{job.job_id}: ran {running_s[job.job_id]} s for {spec.duration} s of work and "
            f"{checkpoints} checkpoint(s) of {stall} s")
        stalled += checkpoints * stall * spec.gpus
    assert totals.checkpoint_gpu_s >= stalled - 1e-6 * max(1.0, stalled)


@PROPERTY_SETTINGS
@given(failing())
def test_lost_work_is_at_most_the_time_since_the_last_durable_checkpoint(case) -> None:
    _sc, model, r = run(case)
    result = r.result
    hits = sum(j.failures for j in result.jobs)
    widest = max((j.spec.gpus for j in result.jobs if j.failures), default=0)
    per_failure = INTERVAL * (2 if model.costs.checkpoint_mode == "async" else 1)
    assert result.interruptions.lost_gpu_s <= hits * per_failure * widest + 1e-6
