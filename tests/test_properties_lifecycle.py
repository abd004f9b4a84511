"""Properties of the core's lifecycle under asynchronous starts (issue 16): random
clusters and traces with random launch latencies per job class, launch failures,
node failures (also while jobs are starting), user cancellations and chaos
preemptions/migrations.

* no GPU is ever booked twice and the core's queues match each job's state (AuditPolicy, every round);
* every job ends in a terminal state: finished, cancelled, or rejected when it can never fit;
* every decision handed to the backend is answered;
* GPU time is conserved: each job's GPU-seconds equal the spells it held GPUs for, rebuilt
  independently from the run record's transitions, and they add up to the run's busy GPU-seconds;
* a finished job ran (in RUNNING) exactly its duration, launches not counted.

The default tier runs a few hundred cases; the slow tier ten thousand.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from simharness import PROPERTY_SETTINGS, Scenario, _time_tol, scenarios, simulate, type_capacity

from loom.core.jobs import JobState
from loom.sim.launch import CLASSES, LaunchModel
from loom.workload.job import JobClass

S = JobState
HOLDING = (S.STARTING, S.RUNNING)


@st.composite
def async_cases(draw: st.DrawFn):
    # at most 12 jobs (ten thousand cases must fit the slow tier), each of a random class
    sc: Scenario = draw(scenarios(permanent_failures=False, max_jobs=12))
    classes = list(JobClass)
    sc.specs = [s.__class__(**{**{f: getattr(s, f) for f in s.__slots__}, "job_class": draw(st.sampled_from(classes))})
                for s in sc.specs]
    latency = {c: float(draw(st.sampled_from([0, 0, 1, 7, 30, 120]))) for c in CLASSES if draw(st.booleans())}
    launch = LaunchModel(latency_s=latency, default_s=float(draw(st.sampled_from([0, 5, 60]))),
                         failure_probability=draw(st.sampled_from([0.0, 0.0, 0.1, 0.4])),
                         seed=draw(st.integers(0, 2**16)))
    cancels = []
    for spec in sc.specs:
        if draw(st.integers(0, 4)) == 0:
            cancels.append((spec.job_id, spec.submit_time + float(draw(st.integers(0, 600)))))
    return sc, launch, cancels


def _check(case) -> None:
    sc, launch, cancels = case
    run = simulate(sc, launch=launch, cancellations=cancels)
    result, core = run.result, run.sim.core
    assert not core.unanswered, f"unanswered decisions: {core.unanswered}"
    cancelled = {job_id for job_id, _ in cancels}
    spells: dict[str, float] = defaultdict(float)
    running: dict[str, float] = defaultdict(float)
    since: dict[str, float] = {}
    for t in result.record.transitions:
        if t.new in HOLDING and t.old not in HOLDING:
            since[t.job_id] = t.at
        elif t.old in HOLDING and t.new not in HOLDING:
            spells[t.job_id] += t.at - since.pop(t.job_id)
        if t.new is S.RUNNING and t.old is not S.RUNNING:
            since["run:" + t.job_id] = t.at
        elif t.old is S.RUNNING and t.new is not S.RUNNING:
            running[t.job_id] += t.at - since.pop("run:" + t.job_id)
    assert not since, f"still holding GPUs at the end: {since}"
    for job in result.jobs:
        spec = job.spec
        fits = spec.gpus <= type_capacity(sc.topology, spec.gpu_type)
        if not fits:
            assert job.state is S.REJECTED or (job.state is S.CANCELLED and job.job_id in cancelled)
        elif job.job_id in cancelled:
            assert job.state in (S.FINISHED, S.CANCELLED), job
        else:
            assert job.state is S.FINISHED, f"{job} fits but ended {job.state.name}"
        tol = _time_tol(job.end_time or 0.0, spec.duration or 0.0)
        assert job.gpu_seconds == pytest.approx(spells[job.job_id] * spec.gpus, abs=tol * spec.gpus)
        if job.state is S.FINISHED:
            assert running[job.job_id] == pytest.approx(spec.duration, abs=tol), job
    total = sum(j.gpu_seconds for j in result.jobs)
    assert result.busy_gpu_seconds == pytest.approx(total, rel=1e-9, abs=1e-6)


@PROPERTY_SETTINGS
@given(async_cases())
def test_async_lifecycle_invariants(case) -> None:
    _check(case)


def _slow_part(part: int):
    """One of four tests of 2,500 cases each (10,000 in all), each from its own seed, so the slow
    tier's workers share them."""
    @pytest.mark.slow
    @seed(part)
    @settings(PROPERTY_SETTINGS, max_examples=2_500, derandomize=False)
    @given(async_cases())
    def test(case) -> None:
        _check(case)

    test.__name__ = f"test_async_lifecycle_invariants_ten_thousand_cases_part{part}"
    return test


for _part in range(4):
    globals()[f"test_async_lifecycle_invariants_ten_thousand_cases_part{_part}"] = _slow_part(_part)
