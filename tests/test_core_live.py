"""The core's additions for the live world, and the live engine around the unchanged core.

* `Scheduler.adopt`: a job found running after a restart becomes RUNNING without a start;
* `TransitionLog.since`: what a store has not seen yet, across sealed chunks;
* `LiveEngine`: driven by the simulator's own world (`SimLiveBackend`) on a virtual clock it
  makes the simulator's decisions at the simulator's times; its hooks see every decision before
  the backend does (write-ahead), every answer and transition; it is fed from many threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from loom.core.decisions import Decision, Preempt, Start, Timer
from loom.core.events import DecisionFailed, JobFinished
from loom.core.jobs import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.core.record import TransitionLog
from loom.core.recovery import RecoveryConfig
from loom.core.scheduler import DecisionError, Scheduler
from loom.hardware.clos import clos
from loom.hardware.state import Allocation, AllocationError
from loom.service.backends.sim import SimLiveBackend
from loom.service.clock import VirtualClock, WallClock
from loom.service.engine import LiveEngine
from loom.sim.engine import Simulation
from loom.sim.launch import LaunchModel
from loom.workload.faults import NodeFailure
from loom.workload.job import JobSpec

S = JobState


def _topology(nodes: int = 3):
    return clos("live", minipods=1, nodes=nodes, gpus_per_node=8, gpu_type="A100-80GB", nodes_per_leaf=nodes)


class _Recorder:
    """A backend that only records what it is asked (the core's tests drive the answers)."""

    name = "recorder"

    def __init__(self, topology) -> None:
        from loom.core.backend import Inventory

        self.inv = Inventory(topology, 0)
        self.applied: list[Decision] = []
        self.sink = None

    def bind(self, sink) -> None:
        self.sink = sink

    def inventory(self):
        return self.inv

    def apply(self, decision, ticket, at) -> None:
        self.applied.append(decision)

    def set_timer(self, at, token) -> None:
        return None


# ------------------------------------------------------------------ Scheduler.adopt
def test_an_adopted_job_runs_where_it_was_and_is_never_started_again():
    core = Scheduler(_Recorder(_topology(2)), POLICIES.get("fcfs")(), PLACERS.get("first-fit")())
    job = core.add(JobSpec("a", 0.0, 8, 100.0))
    core.adopt(job, Allocation((1,), (8,)), 50.0, progress=30.0, rate=1.0, first_start=10.0)
    assert job.state is S.RUNNING and job.allocation.nodes == (1,)
    assert job.first_start == 10.0 and job.progress == 30.0 and job.since == 50.0
    assert int(core.ctx.state.free[1]) == 0 and "a" in core.ctx.running
    assert [(t.old.name, t.new.name, t.event) for t in core.record.transitions_of("a")] == [
        ("PENDING", "STARTING", "adopted: found running"), ("STARTING", "RUNNING", "adopted")]
    other = core.add(JobSpec("b", 50.0, 16, 10.0))
    core.submit(other, 50.0)
    assert core.round(50.0) == []  # b needs both nodes; a is not started again
    assert core.backend.applied == []
    core.observe(JobFinished("a", 120.0, 100.0))
    assert job.state is S.FINISHED and job.gpu_seconds == 70.0 * 8
    assert [type(d).__name__ for d in core.round(120.0)] == ["Start"]


def test_adopting_onto_taken_gpus_or_a_running_job_is_refused():
    core = Scheduler(_Recorder(_topology(1)), POLICIES.get("fcfs")(), PLACERS.get("first-fit")())
    a, b = core.add(JobSpec("a", 0.0, 8, 100.0)), core.add(JobSpec("b", 0.0, 8, 100.0))
    core.adopt(a, Allocation((0,), (8,)), 0.0)
    with pytest.raises(AllocationError):
        core.adopt(b, Allocation((0,), (8,)), 0.0)
    with pytest.raises(DecisionError, match="cannot adopt job 'a': it is RUNNING"):
        core.adopt(a, Allocation((0,), (8,)), 0.0)


# ------------------------------------------------------------------ TransitionLog.since
def test_transitions_since_an_index_cross_sealed_chunks(monkeypatch):
    monkeypatch.setattr(TransitionLog, "CHUNK", 4)
    log = TransitionLog(["a", "b"])
    for i in range(11):
        log.add(float(i), i % 2, S.PENDING, S.STARTING, f"e{i}")
        log.compact()
    assert len(log) == 11 and len(log._chunks) == 2
    everything = list(log)
    for start in (0, 3, 4, 7, 8, 10, 11, 15):
        assert log.since(start) == everything[start:]


# ------------------------------------------------------------------ the engine = the simulator, on its world
def _live(specs: Sequence[JobSpec], policy: str, *, nodes: int = 3, latency: float = 0.0,
          failures: Sequence[NodeFailure] = (), recovery: RecoveryConfig | None = None, **hooks) -> LiveEngine:
    clock = VirtualClock()
    backend = SimLiveBackend(_topology(nodes), clock=clock, launch=LaunchModel(default_s=latency))
    engine = LiveEngine(backend, policy, "first-fit", clock=clock, round_interval=None, recovery=recovery, **hooks)
    ordered = sorted(specs, key=lambda s: s.submit_time)
    for spec in ordered:
        engine.add(spec)
    for f in failures:
        clock.call_at(f.at, lambda f=f: backend.fail_node(f.node, f.repair_after))
    for spec in ordered:
        clock.call_at(spec.submit_time, lambda spec=spec: engine.submit(spec))
    engine.run_until(lambda: engine.idle() and not clock.scheduled, timeout=60)
    return engine


def _workload() -> list[JobSpec]:
    return [JobSpec(f"j{i}", 5.0 * i, 8 if i % 2 else 16, 200.0 + 13 * i, priority=(i * 7) % 4) for i in range(12)]


def _fingerprint(jobs) -> list[tuple]:
    return [(j.job_id, j.state, j.first_start, j.end_time, j.preemptions, j.failures, j.gpu_seconds) for j in jobs]


def _decisions(pairs) -> list[tuple]:
    return [(at, type(d).__name__, getattr(d, "job_id", None), getattr(getattr(d, "allocation", None), "nodes", None))
            for at, d in pairs]


@pytest.mark.parametrize(("policy", "latency", "failures"), [
    ("fcfs", 0.0, ()), ("priority", 0.0, ()), ("priority", 15.0, ()), ("easy", 10.0, ()),
    ("priority", 15.0, (NodeFailure("node1", 120.0, 300.0),)),
])
def test_the_engine_makes_the_simulators_decisions_at_its_times(policy, latency, failures):
    sim = Simulation(_topology(), _workload(), POLICIES.get(policy)(), PLACERS.get("first-fit")(),
                     launch=LaunchModel(default_s=latency), failures=failures, recovery=RecoveryConfig())
    expected = sim.run()
    engine = _live(_workload(), policy, latency=latency, failures=failures, recovery=RecoveryConfig())
    assert _fingerprint(engine.core.jobs.values()) == _fingerprint(expected.jobs)
    assert _decisions(engine.core.record.decisions) == _decisions(expected.decisions)
    assert engine.rounds == expected.rounds


# ------------------------------------------------------------------ hooks
def test_every_job_decision_is_written_before_the_backend_sees_it():
    written: list[tuple[int | None, str]] = []
    answers: list[tuple[int, str]] = []
    transitions = []
    engine = None

    class Checking(SimLiveBackend):
        def apply(self, decision, ticket, at):
            assert (ticket, type(decision).__name__) in written, "applied before it was written"
            super().apply(decision, ticket, at)

    clock = VirtualClock()
    backend = Checking(_topology(), clock=clock, launch=LaunchModel(default_s=5.0))
    engine = LiveEngine(backend, "priority", "first-fit", clock=clock, round_interval=None,
                        on_decision=lambda d, ticket, at: written.append((ticket, type(d).__name__)),
                        on_answer=lambda ticket, status, at, reason: answers.append((ticket, status)),
                        on_transition=transitions.append)
    for spec in _workload():
        clock.call_at(spec.submit_time, lambda spec=spec: engine.submit(spec))
    engine.run_until(lambda: len(engine.core.jobs) == 12 and engine.idle() and not clock.scheduled, timeout=60)
    record = engine.core.record
    assert [t for t, _ in written] == list(range(1, len(written) + 1))
    assert len(written) == sum(1 for _, d in record.decisions if not isinstance(d, Timer))
    done = {t for t, status in answers if status in ("done", "failed")}
    assert done == {t for t, _ in written}  # every ticket answered, as the hook saw it
    assert transitions == list(record.transitions)


def test_a_decision_that_cannot_be_written_is_not_carried_out():
    failing = {"on": True}

    def write(decision, ticket, at):
        if failing["on"] and isinstance(decision, Start):
            failing["on"] = False
            raise OSError("disk full")

    engine = _live([JobSpec("a", 0.0, 8, 10.0)], "fcfs", on_decision=write)
    a = engine.core.jobs["a"]
    assert a.state is S.FINISHED and a.end_time == 10.0  # the second start, at the same instant
    failed = engine.core.record.failed_decisions
    assert len(failed) == 1 and "could not be recorded: disk full" in failed[0][2]


# ------------------------------------------------------------------ timers, errors, threads
def test_timers_and_periodic_rounds_wake_the_engine():
    class Wake:
        name = "wake"

        def __init__(self) -> None:
            self.seen: list[float] = []

        def schedule(self, ctx):
            self.seen.append(ctx.now)
            return [Timer(100.0, "look again")] if ctx.now == 0.0 else []

    policy = Wake()
    clock = VirtualClock()
    backend = SimLiveBackend(_topology(1), clock=clock)
    engine = LiveEngine(backend, policy, "first-fit", clock=clock, round_interval=30.0)
    clock.call_at(0.0, lambda: engine.submit(JobSpec("a", 0.0, 8, 10.0)))
    engine.run_until(lambda: clock.now() >= 100.0, timeout=30)
    assert policy.seen == [0.0, 30.0, 60.0, 90.0, 100.0]  # periodic while a job waits, and the timer


def test_a_policy_error_stops_the_engine_and_reaches_the_caller():
    class Broken:
        name = "broken"

        def schedule(self, ctx):
            return [Preempt("nobody", "bug")] if ctx.pending else []

    clock = VirtualClock()
    engine = LiveEngine(SimLiveBackend(_topology(1), clock=clock), Broken(), "first-fit", clock=clock,
                        round_interval=None)
    clock.call_at(1.0, lambda: engine.submit(JobSpec("a", 1.0, 8, 10.0)))
    with pytest.raises(DecisionError, match="unknown job 'nobody'"):
        engine.run_until(lambda: bool(engine.core.jobs) and engine.idle(), timeout=30)
    with pytest.raises(RuntimeError, match="the engine stopped"):
        engine.submit(JobSpec("b", 2.0, 8, 10.0)).result(timeout=5)


def test_submissions_and_cancels_from_many_threads_on_the_wall_clock():
    clock = WallClock()
    backend = SimLiveBackend(_topology(2), clock=clock)
    engine = LiveEngine(backend, "fcfs", "first-fit", clock=clock, round_interval=0.5)
    engine.start()
    try:
        def client(k: int) -> None:
            for i in range(10):
                engine.submit(JobSpec(f"c{k}-{i}", clock.now(), 4, 0.05))
            engine.cancel(f"c{k}-9", "changed my mind")

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        engine.run_until(lambda: len(engine.core.jobs) == 80 and engine.idle(), timeout=60)
        with pytest.raises(ValueError, match="already submitted"):
            engine.submit(JobSpec("c0-0", clock.now(), 4, 0.05)).result(timeout=10)
        states = engine.call(lambda core: {j.job_id: j.state for j in core.jobs.values()}).result(timeout=10)
    finally:
        engine.stop()
        clock.close()
    assert sum(s is S.FINISHED for s in states.values()) >= 72
    assert all(s in (S.FINISHED, S.CANCELLED) for s in states.values())


def test_events_posted_after_the_loop_stopped_are_applied_in_the_callers_thread():
    engine = _live([JobSpec("a", 0.0, 8, 10.0)], "fcfs")
    engine.post(DecisionFailed(999, 20.0, "late answer to nothing"))
    assert engine.core.record.stale_events == 1


def test_what_one_job_reported_is_applied_in_the_order_it_was_reported():
    from loom.core.events import JobFailed, JobFinished, JobStarted
    from loom.service.engine import _in_order

    started, failed = JobStarted("a", 5.0, ticket=3), JobFailed("a", 5.0, "exit status 3", fatal=True)
    other = JobFinished("b", 5.0)
    got = [item[1] for item in _in_order([("event", started), ("event", failed), ("event", other)])]
    assert got.index(started) < got.index(failed)  # a's start before its failure, as reported
    assert got[0] is other  # across jobs, the simulator's order at an instant: finishes first
