"""Property-based tests of the simulator, the built-in policies and placers.

Random small clusters (homogeneous Clos or heterogeneous two-type trees),
random traces (ties in submit times, zero durations, oversized requests that
must be rejected, GPU-type constraints, priorities), every built-in policy x
every built-in placer, optional node failures and, through a test-only
`ChaosPolicy` wrapper, random preemptions and migrations.

Every run is wrapped in an `AuditPolicy` that checks the cluster accounting at
each scheduling round. The remaining properties are checked on the result
(the decision log, per-job records and totals).

Numbered properties 1-8 are the core invariants; the properties that caught
real bugs live in test_property_regressions.py. The harness (strategies,
wrappers, `simulate`) is in simharness.py.
A failing property prints the Scenario (cluster, trace, failures, policy,
placer, chaos seed), which `simulate()` replays.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given
from simharness import (
    INF,
    PROPERTY_SETTINGS,
    Scenario,
    _time_tol,
    alloc_decisions,
    check_finish_or_rejected,
    scenarios,
    simulate,
)

from loom.core.decisions import Migrate, Preempt, Resize, Resume, Start
from loom.core.jobs import JobState
from loom.sim.engine import SimulationResult


# ====================================================================== properties
# 1. No GPU is ever allocated twice ----------------------------------------------
@PROPERTY_SETTINGS
@given(scenarios(permanent_failures=True))
def test_cluster_accounting_holds_every_round(sc: Scenario) -> None:
    """At every round, per node: GPUs of running jobs + free == capacity on
    healthy nodes, nothing runs on a failed node, free >= 0, queues and the
    release index agree with job states. (Checked by AuditPolicy/simulate.)"""
    run = simulate(sc)
    assert run.audit.rounds == run.result.rounds >= 1


# 2. A job runs on exactly its requested GPUs ------------------------------------
@PROPERTY_SETTINGS
@given(scenarios(permanent_failures=True))
def test_allocations_match_request(sc: Scenario) -> None:
    run = simulate(sc)
    topo = sc.topology
    jobs = {j.job_id: j for j in run.result.jobs}
    for t, d in alloc_decisions(run.result):
        spec = jobs[d.job_id].spec
        alloc = d.allocation
        assert not isinstance(d, Resize), "built-in policies never resize"
        assert alloc.total == spec.gpus, f"{d} gives {alloc.total} GPUs, job asked for {spec.gpus}"
        assert len(set(alloc.nodes)) == len(alloc.nodes), f"node listed twice in {alloc}"
        assert all(g > 0 for g in alloc.gpus)
        assert all(g <= topo.node_gpus[n] for n, g in zip(alloc.nodes, alloc.gpus))
        types = {topo.gpu_types[topo.node_type[n]] for n in alloc.nodes}
        assert len(types) == 1, f"{d.job_id} spans GPU types {types}"
        if spec.gpu_type is not None:
            assert types == {spec.gpu_type}, f"{d.job_id} wants {spec.gpu_type}, got {types}"


# 3. Everything finishes unless rejected; rejected == oversized --------------------
@PROPERTY_SETTINGS
@given(scenarios(permanent_failures=False))
def test_every_job_finishes_or_is_rejected(sc: Scenario) -> None:
    """With repaired failures, random preemptions/migrations and every policy."""
    check_finish_or_rejected(sc, simulate(sc).result)


# 4. GPU-seconds are conserved ----------------------------------------------------
@PROPERTY_SETTINGS
@given(scenarios(permanent_failures=True))
def test_gpu_seconds_conserved(sc: Scenario) -> None:
    """Trace speed model: rate 1 on the requested GPUs and progress is kept over
    preemptions, evictions and migrations, so busy time == duration."""
    result = simulate(sc).result
    for job in result.jobs:
        work = job.spec.gpus * job.spec.duration
        if job.state is JobState.FINISHED:
            assert job.gpu_seconds == pytest.approx(work, rel=1e-9, abs=1e-6), job
        else:
            assert job.gpu_seconds <= work + 1e-6, job
        if job.state is JobState.REJECTED:
            assert job.gpu_seconds == 0.0
    assert result.busy_gpu_seconds == pytest.approx(sum(j.gpu_seconds for j in result.jobs), rel=1e-9, abs=1e-6)


# 5. Time never goes backwards; run time == duration ----------------------------------
@PROPERTY_SETTINGS
@given(scenarios(permanent_failures=True))
def test_time_is_monotone_and_runs_last_their_duration(sc: Scenario) -> None:
    """Replays each job's lifecycle from the run record (one start decision, then
    running spells ended by preemptions or failures, resumed later) and checks
    that the time spent running adds up to the duration, so end - first_start is
    the duration plus the time spent preempted/evicted (migration costs nothing
    under the trace model). Migrations come from the decision log."""
    result = simulate(sc).result
    times_ = [t for t, _ in result.decisions]
    assert times_ == sorted(times_), "decision log goes back in time"
    assert all(t >= result.start_time for t in times_)
    transitions = list(result.record.transitions)
    assert [t.at for t in transitions] == sorted(t.at for t in transitions), "run record goes back in time"
    by_job: dict[str, list] = defaultdict(list)
    for t in transitions:
        by_job[t.job_id].append(t)
    migrations = defaultdict(int)
    for _, d in result.decisions:
        if isinstance(d, Migrate):
            migrations[d.job_id] += 1
    S = JobState
    for job in result.jobs:
        spec, entries = job.spec, by_job.get(job.job_id, [])
        if job.first_start is None:
            assert not any(t.new is S.STARTING for t in entries) and job.end_time is None
            continue
        assert spec.submit_time <= job.first_start
        launches = [t for t in entries if t.new is S.STARTING]
        assert launches[0].at == job.first_start and launches[0].event == "start decision"
        assert all(t.event == "resume decision" for t in launches[1:])
        running_since: float | None = None
        ran = gaps = 0.0
        stopped_at = None
        stops = 0
        for t in entries:
            if t.new is S.RUNNING and t.old is S.STARTING:
                assert running_since is None, f"{t} for a job already running"
                if stopped_at is not None:
                    gaps += t.at - stopped_at
                running_since = t.at
            elif t.old is S.RUNNING and t.new is not S.RUNNING:
                assert running_since is not None
                ran += t.at - running_since
                running_since = None
                if t.new is not S.FINISHED:
                    stopped_at, stops = t.at, stops + 1
        assert stops == job.preemptions + job.failures
        assert migrations[job.job_id] == job.migrations
        if job.state is JobState.FINISHED:
            assert entries[-1].new is S.FINISHED and entries[-1].at == job.end_time
            tol = _time_tol(job.end_time, spec.duration)
            assert ran == pytest.approx(spec.duration, abs=tol), f"{job} ran {ran}s, duration {spec.duration}"
            assert job.first_start <= job.end_time
            span = job.end_time - job.first_start
            assert span >= spec.duration - tol
            assert span == pytest.approx(spec.duration + gaps, abs=tol)
            if job.preemptions == job.failures == 0:
                assert span == pytest.approx(spec.duration, abs=tol), "migrations must not cost time"
        else:
            assert job.end_time is None
    # The run ends when the last job finishes or, for a job stranded by a
    # permanent failure, when it last stopped (its GPU time counts until then).
    ends = [j.end_time for j in result.jobs if j.end_time is not None]
    ends += [by_job[j.job_id][-1].at for j in result.jobs if j.end_time is None and j.first_start is not None]
    assert result.end_time == (max(ends) if ends else result.start_time)


# 6. Same seed, same result --------------------------------------------------------
def fingerprint(result: SimulationResult):
    jobs = [(j.job_id, j.state, j.first_start, j.end_time, j.preemptions, j.migrations, j.failures,
             j.gpu_seconds, j.allocation) for j in result.jobs]
    log = [(t, type(d).__name__, getattr(d, "job_id", None), getattr(d, "allocation", None),
            getattr(d, "reason", None)) for t, d in result.decisions]
    totals = (result.busy_gpu_seconds, result.failed_gpu_seconds, result.start_time, result.end_time,
              result.rounds, result.events, dict(result.rejected))
    return jobs, log, totals


@PROPERTY_SETTINGS
@given(scenarios(permanent_failures=True))
def test_same_inputs_same_result(sc: Scenario) -> None:
    first, second = simulate(sc).result, simulate(sc).result
    a, b = fingerprint(first), fingerprint(second)
    assert a[0] == b[0]
    assert a[1] == b[1]
    assert a[2] == b[2]


# 7. FCFS never lets a later job overtake -------------------------------------------
@PROPERTY_SETTINGS
@given(scenarios(policies=("fcfs",), chaos=False, permanent_failures=True))
def test_fcfs_is_strict(sc: Scenario) -> None:
    """No job first-starts before an earlier-submitted (or same-time,
    earlier-listed) accepted job; a job that never starts blocks all later ones."""
    result = simulate(sc).result
    starts = [INF if j.first_start is None else j.first_start
              for j in result.jobs if j.state is not JobState.REJECTED]
    assert starts == sorted(starts), f"first starts in queue order: {starts}"


# 8. Priority preemption only ever makes room for a strictly higher priority ------------
@PROPERTY_SETTINGS
@given(scenarios(policies=("priority",), chaos=False, permanent_failures=True))
def test_priority_preempts_only_lower_priority(sc: Scenario) -> None:
    """Within each round, every Preempt the policy returns is followed by the
    start of the job it names, of strictly higher priority than the victim;
    no job is preempted twice, and a job started this round is not a victim."""
    run = simulate(sc)
    jobs = {j.job_id: j for j in run.result.jobs}
    for t, ds in run.audit.round_log:
        victims = [d.job_id for d in ds if isinstance(d, Preempt)]
        assert len(victims) == len(set(victims)), f"t={t}: a job preempted twice in one round"
        started_so_far: set[str] = set()
        for i, d in enumerate(ds):
            if isinstance(d, (Start, Resume)):
                started_so_far.add(d.job_id)
            elif isinstance(d, Preempt):
                assert d.job_id not in started_so_far, f"t={t}: {d.job_id} started and preempted in one round"
                winner = d.reason.split()[3]  # "preempted by job <id> (priority ...)"
                later = {e.job_id for e in ds[i + 1:] if isinstance(e, (Start, Resume))}
                assert winner in later, f"t={t}: {d.job_id} preempted for {winner}, which did not start"
                assert jobs[winner].spec.priority > jobs[d.job_id].spec.priority, d


