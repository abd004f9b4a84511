"""The backend contract as tests (loom.core.backend): every backend passes this file unchanged.

A backend is added by writing a *world* for it below: a function that runs a
scenario (cluster, jobs, a policy, launch latency, node failures, cancellations)
through the core on that backend and returns what happened — the run result,
the core, and every event the backend reported and every decision it was
handed, in order. Worlds: the simulator's, local processes, and a real Slurm
cluster (the `slurm` tier); Kubernetes adds its own to `WORLDS`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from loom.core.decisions import Decision, Preempt, Start
from loom.core.events import (
    DecisionDone,
    DecisionFailed,
    JobFinished,
    JobProgress,
    JobStarted,
    JobStopped,
)
from loom.core.jobs import Job, JobState
from loom.core.lifecycle import TERMINAL
from loom.core.protocols import PLACERS, POLICIES
from loom.core.recovery import RecoveryConfig
from loom.core.scheduler import DecisionError, Scheduler
from loom.hardware.clos import clos
from loom.sim.engine import Simulation, SimulationResult
from loom.sim.launch import LaunchModel
from loom.workload.faults import NodeFailure
from loom.workload.job import JobSpec

S = JobState
ANSWERS = (JobStarted, JobStopped, JobProgress, DecisionDone, DecisionFailed)


@dataclass
class Outcome:
    result: SimulationResult
    core: Scheduler
    events: list = field(default_factory=list)  # every event the backend reported, in order
    sent: list[tuple[int, Decision]] = field(default_factory=list)  # (ticket, decision) handed to it

    def job(self, job_id: str) -> Job:
        return self.core.jobs[job_id]

    def transitions(self, job_id: str) -> list[tuple[str, str, float, str]]:
        return [(t.old.name, t.new.name, t.at, t.event) for t in self.result.record.transitions_of(job_id)]


def sim_world(specs: Sequence[JobSpec], policy, *, nodes: int = 2, launch: LaunchModel | None = None,
              failures: Sequence[NodeFailure] = (), cancellations: Sequence[tuple[str, float]] = (),
              recovery: RecoveryConfig | None = None, duplicate: bool = False) -> Outcome:
    topology = clos("conf", minipods=1, nodes=nodes, gpus_per_node=8, gpu_type="A100-80GB", nodes_per_leaf=nodes)
    sim = Simulation(topology, specs, policy, PLACERS.get("first-fit")(), launch=launch, failures=failures,
                     cancellations=cancellations, recovery=recovery)
    return _tap(sim.core, lambda: sim.run(), duplicate)


def _tap(core: Scheduler, run: Callable[[], SimulationResult], duplicate: bool) -> Outcome:
    """Watch what flows between the core and its backend (through the protocol's own seams)."""
    outcome = Outcome(None, core)  # type: ignore[arg-type]
    backend, core_sink, apply = core.backend, core.sink, core.backend.apply

    def sink(event) -> None:
        outcome.events.append(event)
        core_sink(event)
        if duplicate and isinstance(event, (JobStarted, JobStopped, JobFinished, JobProgress, DecisionDone)):
            core_sink(event)  # at-least-once delivery

    def sent(decision: Decision, ticket: int, at: float) -> None:
        outcome.sent.append((ticket, decision))
        apply(decision, ticket, at)

    backend.bind(sink)
    backend.apply = sent  # type: ignore[method-assign]
    outcome.result = run()
    return outcome


def local_world(specs: Sequence[JobSpec], policy, *, nodes: int = 2, launch: LaunchModel | None = None,
                failures: Sequence[NodeFailure] = (), cancellations: Sequence[tuple[str, float]] = (),
                recovery: RecoveryConfig | None = None, duplicate: bool = False) -> Outcome:
    """The live engine and the local backend: every job a real process (the built-in sleep job, which
    speaks the control channel) on emulated nodes, on a virtual clock that moves only when no process
    is starting, stopping or exiting, so timings are the scenario's to the bit. The launch model's
    latency is the backend's emulated launch delay; node failures and repairs, arrivals and
    cancellations are called at their times on the clock."""
    from loom.service.backends.local import LocalBackend

    topology = clos("conf", minipods=1, nodes=nodes, gpus_per_node=8, gpu_type="A100-80GB", nodes_per_leaf=nodes)

    def backend(root, clock, model):
        return LocalBackend(topology, root=root / "jobs", clock=clock, launch_delay=model.latency, hang_s=0,
                            poll_s=0.002)

    return _live_world(backend, specs, policy, launch=launch, failures=failures, cancellations=cancellations,
                       recovery=recovery, duplicate=duplicate)


def slurm_world(specs: Sequence[JobSpec], policy, *, nodes: int = 2, launch: LaunchModel | None = None,
                failures: Sequence[NodeFailure] = (), cancellations: Sequence[tuple[str, float]] = (),
                recovery: RecoveryConfig | None = None, duplicate: bool = False) -> Outcome:
    """As the local world, but every job is a Slurm batch job on a real cluster of `nodes` 8-GPU nodes
    (loom.service.backends.slurmtest), submitted on the nodes and GPUs Loom chose; a node failure takes
    the node down in Slurm. The virtual clock waits while Slurm starts or ends a job."""
    from loom.service.backends.slurm import SlurmBackend
    from loom.service.backends.slurmcli import SlurmCLI
    from loom.service.backends.slurmtest import SlurmCluster, missing_requirements

    if missing_requirements():
        pytest.skip(missing_requirements())
    with SlurmCluster(nodes, 8, prefix="node") as cluster:
        env = cluster.env()
        cli = SlurmCLI(tuple(cluster._ns([])), {"SLURM_CONF": env["SLURM_CONF"], "MUNGE_SOCKET": env["MUNGE_SOCKET"]})

        def backend(root, clock, model):
            return SlurmBackend(cli, root=root / "jobs", gpu_type="A100-80GB", clock=clock,
                                launch_delay=model.latency, hang_s=0, poll_s=0.002, node_poll_s=0.2)

        return _live_world(backend, specs, policy, launch=launch, failures=failures, cancellations=cancellations,
                           recovery=recovery, duplicate=duplicate, timeout=300)


def _live_world(make_backend: Callable, specs: Sequence[JobSpec], policy, *, launch: LaunchModel | None,
                failures: Sequence[NodeFailure], cancellations: Sequence[tuple[str, float]],
                recovery: RecoveryConfig | None, duplicate: bool, timeout: float = 120) -> Outcome:
    import shutil
    import tempfile
    import time
    from pathlib import Path

    from loom.service.clock import VirtualClock
    from loom.service.engine import LiveEngine

    root = Path(tempfile.mkdtemp(prefix="loom-live-world-"))
    clock = VirtualClock(file=root / "clock")
    model = launch or LaunchModel()
    backend = make_backend(root, clock, model)
    topology = backend.inventory().topology
    for failure in failures:
        if failure.node not in topology.node_index:
            raise ValueError(f"unknown node '{failure.node}' in failure list")
    outcome = Outcome(None, None)  # type: ignore[arg-type]
    engine = LiveEngine(backend, policy, PLACERS.get("first-fit")(), clock=clock, recovery=recovery,
                        round_interval=None, on_event=outcome.events.append)
    core = outcome.core = engine.core
    observe, apply = core.observe, backend.apply

    def observe_twice(event) -> None:
        observe(event)
        if isinstance(event, (JobStarted, JobStopped, JobFinished, JobProgress, DecisionDone)):
            observe(event)  # at-least-once delivery

    def sent(decision: Decision, ticket: int, at: float) -> None:
        outcome.sent.append((ticket, decision))
        apply(decision, ticket, at)

    if duplicate:
        core.observe = observe_twice  # type: ignore[method-assign]
    backend.apply = sent  # type: ignore[method-assign]
    ordered = sorted(specs, key=lambda s: s.submit_time)
    for spec in ordered:
        engine.add(spec)
    for job_id, at in cancellations:  # the simulator's order at one instant: the world, then arrivals
        clock.call_at(at, lambda job_id=job_id: engine.cancel(job_id, "cancelled by its owner"))
    for failure in failures:
        clock.call_at(failure.at, lambda name=failure.node: backend.fail_node(name))
        clock.call_at(failure.at + failure.repair_after, lambda name=failure.node: backend.repair_node(name))
    for spec in ordered:
        clock.call_at(spec.submit_time, lambda spec=spec: engine.submit(spec))
    wall = time.perf_counter()
    try:
        engine.run_until(lambda: engine.idle() and not backend.running() and not clock.scheduled, timeout=timeout)
    finally:
        backend.close()
        shutil.rmtree(root, ignore_errors=True)
    jobs = list(core.jobs.values())
    start = ordered[0].submit_time if ordered else 0.0
    end = max((j.end_time if j.end_time is not None else j.held_since for j in jobs if j.first_start is not None),
              default=start)
    outcome.result = SimulationResult(
        topology=topology, jobs=jobs, record=core.close(), events=len(outcome.events), rounds=engine.rounds,
        sim_wall_s=time.perf_counter() - wall, busy_gpu_seconds=core.busy_gpu_seconds, failed_gpu_seconds=0.0,
        start_time=start, end_time=end, rejected=core.rejected, round_seconds=core.round_seconds,
        round_queue=core.round_queue, recoveries=core.recovery.records if core.recovery is not None else [])
    return outcome


WORLDS = {"sim": sim_world, "local": local_world, "slurm": slurm_world}
MARKS = {"slurm": pytest.mark.slurm}  # a world that needs a real system runs in that system's tier


@pytest.fixture(params=[pytest.param(name, marks=MARKS.get(name, ())) for name in sorted(WORLDS)])
def world(request):
    return WORLDS[request.param]


class Script:
    """A policy that issues given decisions at given times, and FCFS otherwise."""

    name = "script"

    def __init__(self, steps: dict[float, Callable[[object], list[Decision]]], fcfs: bool = True) -> None:
        self.steps, self.fcfs = dict(steps), POLICIES.get("fcfs")() if fcfs else None

    def schedule(self, ctx) -> list[Decision]:
        step = self.steps.pop(ctx.now, None)
        decisions = step(ctx) if step is not None else []
        if not decisions and self.fcfs is not None:
            decisions = self.fcfs.schedule(ctx)
        return decisions


def _job(jid: str, t: float, gpus: int, duration: float, **kw) -> JobSpec:
    return JobSpec(jid, t, gpus, duration, **kw)


def _answers_in_order(out: Outcome) -> None:
    """Every decision is answered exactly once; per job, answers come in the order the decisions went out."""
    issued = {ticket: d for ticket, d in out.sent}
    answered: dict[int, int] = defaultdict(int)
    per_job: dict[str, list[int]] = defaultdict(list)
    for ev in out.events:
        ticket = getattr(ev, "ticket", None)
        if isinstance(ev, ANSWERS) and ticket is not None and ticket in issued:
            answered[ticket] += 1
            per_job[issued[ticket].job_id].append(ticket)  # type: ignore[union-attr]
    assert set(answered) == set(issued), f"unanswered: {[issued[t] for t in set(issued) - set(answered)]}"
    assert all(n == 1 for n in answered.values()), "a decision answered twice"
    for job_id, tickets in per_job.items():
        assert tickets == sorted(tickets), f"{job_id}: answers out of order {tickets}"
    assert not out.core.unanswered


# ------------------------------------------------------------------ ordering of answers
@pytest.mark.parametrize("latency", [0.0, 30.0])
def test_every_decision_is_answered_once_and_in_order(world, latency):
    specs = [_job(f"j{i}", 10.0 * i, 8, 100.0 + 7 * i, priority=i % 3) for i in range(8)]
    out = world(specs, POLICIES.get("priority")(), launch=LaunchModel(default_s=latency))
    _answers_in_order(out)
    for job in out.result.jobs:
        assert job.state is S.FINISHED, job
        seen = [type(e).__name__ for e in out.events if getattr(e, "job_id", None) == job.job_id]
        assert seen.index("JobStarted") < seen.index("JobFinished")
        assert job.setup_s == pytest.approx(latency * len([t for t in out.transitions(job.job_id)
                                                             if t[1] == "RUNNING"]))


def test_a_start_on_gpus_a_preempt_frees_runs_after_the_stop(world):
    """Preempt A and start B on A's GPUs in one round: B comes up only after A has stopped."""
    def swap(ctx) -> list[Decision]:
        a = ctx.running["a"]
        return [Preempt("a", "make room"), Start("b", a.allocation, "on a's GPUs")]

    specs = [_job("a", 0.0, 8, 1000.0), _job("b", 25.0, 8, 50.0)]
    out = world(specs, Script({25.0: swap}), nodes=1, launch=LaunchModel(default_s=20.0))
    kinds = [(type(e).__name__, getattr(e, "job_id", None)) for e in out.events]
    assert kinds.index(("JobStopped", "a")) < kinds.index(("JobStarted", "b"))
    b_running = next(t for t in out.transitions("b") if t[1] == "RUNNING")
    a_stopped = next(t for t in out.transitions("a") if t[1] == "SUSPENDED")
    assert a_stopped[2] == 25.0 and b_running[2] == 45.0
    _answers_in_order(out)


# ------------------------------------------------------------------ decisions that race the world
def test_a_decision_for_a_job_that_just_finished_is_answered_failed(world):
    out = world([_job("a", 0.0, 8, 10.0)], POLICIES.get("fcfs")())
    assert out.job("a").state is S.FINISHED
    out.core.backend.apply(Preempt("a", "too late"), 10_001, out.result.end_time)
    failed = [e for e in out.events if isinstance(e, DecisionFailed) and e.ticket == 10_001]
    assert len(failed) == 1 and "a" in failed[0].reason
    assert out.job("a").state is S.FINISHED  # the stale answer changes nothing
    assert out.core.record.stale_events >= 1


def test_a_policy_naming_a_finished_job_is_a_policy_bug(world):
    with pytest.raises(DecisionError, match="job 'a' is FINISHED"):
        world([_job("a", 0.0, 8, 10.0), _job("b", 10.0, 8, 5.0)],
              Script({10.0: lambda ctx: [Preempt("a", "stale view")]}))


# ------------------------------------------------------------------ nodes vanishing under launches
def test_a_node_lost_under_a_starting_job_sends_it_back_to_the_head_of_the_queue(world):
    specs = [_job("a", 0.0, 8, 100.0), _job("b", 1.0, 8, 100.0), _job("c", 2.0, 8, 100.0)]
    out = world(specs, POLICIES.get("fcfs")(), launch=LaunchModel(default_s=60.0),
                failures=[NodeFailure("node0", 30.0, 1000.0)])
    a = out.job("a")
    assert ("STARTING", "PENDING", 30.0, "launch failed: node node0 failed during the launch") in \
        out.transitions("a") or any(t[:3] == ("STARTING", "PENDING", 30.0) for t in out.transitions("a"))
    assert a.state is S.FINISHED and a.failures == 0
    # it went back to the head of the queue: it starts before c, which was waiting longer in line behind b
    assert a.first_start < out.job("c").first_start
    assert all(j.state is S.FINISHED for j in out.result.jobs)
    _answers_in_order(out)


# ------------------------------------------------------------------ at-least-once delivery
def test_duplicate_observations_change_nothing(world):
    specs = [_job(f"j{i}", 5.0 * i, 8 if i % 2 else 16, 200.0 + 13 * i, priority=(i * 7) % 4) for i in range(10)]
    kwargs = dict(launch=LaunchModel(default_s=15.0), failures=[NodeFailure("node1", 120.0, 300.0)], nodes=3)
    once = world(specs, POLICIES.get("priority")(), **kwargs)
    twice = world(specs, POLICIES.get("priority")(), duplicate=True, **kwargs)
    fingerprint = [(j.job_id, j.state, j.first_start, j.end_time, j.preemptions, j.failures, j.gpu_seconds)
                   for j in once.result.jobs]
    assert fingerprint == [(j.job_id, j.state, j.first_start, j.end_time, j.preemptions, j.failures,
                            j.gpu_seconds) for j in twice.result.jobs]
    assert twice.core.record.stale_events > once.core.record.stale_events


# ------------------------------------------------------------------ cancellation
def test_cancel_during_starting_calls_the_launch_off_and_frees_the_gpus(world):
    specs = [_job("a", 0.0, 8, 100.0), _job("b", 1.0, 8, 100.0)]
    out = world(specs, POLICIES.get("fcfs")(), nodes=1, launch=LaunchModel(default_s=60.0),
                cancellations=[("a", 30.0)])
    a, b = out.job("a"), out.job("b")
    assert a.state is S.CANCELLED and a.end_time == 30.0
    assert "RUNNING" not in [t[1] for t in out.transitions("a")]
    assert not any(isinstance(e, JobStarted) and e.job_id == "a" for e in out.events)
    assert b.first_start == 30.0 and b.end_time == 30.0 + 60.0 + 100.0
    assert a.gpu_seconds == 30.0 * 8
    _answers_in_order(out)


@pytest.mark.parametrize(("victim", "at", "was"), [("z", 0.5, "PENDING"), ("a", 50.0, "RUNNING"),
                                                   ("a", 150.0, "SUSPENDED")])
def test_cancel_in_any_state_ends_the_job_and_gives_its_gpus_back(world, victim, at, was):
    def preempt_a(ctx) -> list[Decision]:
        return [Preempt("a", "make room")] if "a" in ctx.running else []

    specs = [_job("a", 0.0, 8, 1000.0), _job("b", 100.0, 8, 100.0), _job("z", 0.0, 8, 10.0)]
    out = world(specs, Script({100.0: preempt_a}), nodes=1, cancellations=[(victim, at)])
    job = out.job(victim)
    assert job.state is S.CANCELLED and job.end_time == at
    before = [t for t in out.transitions(victim) if t[2] < at or t[1] != "CANCELLED"]
    assert (before[-1][1] if before else "PENDING") in (was, "STOPPING")
    assert out.result.busy_gpu_seconds == pytest.approx(sum(j.gpu_seconds for j in out.result.jobs))
    assert all(j.state in TERMINAL for j in out.result.jobs)
    assert out.job("b").state is S.FINISHED


def test_cancel_while_recovering_releases_the_survivors(world):
    specs = [_job("big", 0.0, 16, 10_000.0)]
    out = world(specs, POLICIES.get("fcfs")(), nodes=3, failures=[NodeFailure("node0", 100.0, 50.0)],
                recovery=RecoveryConfig(), cancellations=[("big", 200.0)])
    big = out.job("big")
    assert [t[1] for t in out.transitions("big")][-2:] == ["RECOVERING", "CANCELLED"]
    assert big.end_time == 200.0 and not out.core.ctx.held
    assert int(out.core.ctx.state.free_total) == 24


def test_a_launch_preempted_before_it_came_up_never_ran(world):
    """Preempting a starting job calls its launch off: its set-up time counts, but it has not started
    (its next launch is a Start, and its queueing delay runs to that launch)."""
    class PreemptStarting:
        name = "preempt-starting"

        def schedule(self, ctx) -> list[Decision]:
            if "b" in ctx.pending and "a" in ctx.starting:
                return [Preempt("a", "make room for b")]
            return POLICIES.get("fcfs")().schedule(ctx)

    specs = [_job("a", 0.0, 8, 1000.0), _job("b", 30.0, 8, 100.0)]
    out = world(specs, PreemptStarting(), nodes=1, launch=LaunchModel(default_s=60.0))
    a = out.job("a")
    assert [t[:2] for t in out.transitions("a")][:3] == [("PENDING", "STARTING"), ("STARTING", "STOPPING"),
                                                          ("STOPPING", "PENDING")]
    assert a.first_start == 190.0 and a.setup_s == 30.0 + 60.0 and a.end_time == 190.0 + 60.0 + 1000.0
    assert [type(d).__name__ for _, d in out.result.decisions if getattr(d, "job_id", None) == "a"] == \
        ["Start", "Preempt", "Start"]
    _answers_in_order(out)
