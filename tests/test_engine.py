"""The simulator's decision contract, end to end through `Simulation`."""

from __future__ import annotations

import pytest
from conftest import job

from loom.core.context import SchedulingContext
from loom.core.decisions import Migrate, Release, Reserve, Resize, Start, Timer
from loom.core.jobs import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.core.scheduler import DecisionError
from loom.hardware.state import Allocation
from loom.sim.engine import Simulation
from loom.workload.faults import NodeFailure
from simharness import FakeClock


class Scripted:
    """FCFS plus scripted extra decisions at given times; records what it saw."""

    name = "scripted"

    def __init__(self, script=None):
        self.script = dict(script or {})
        self.fcfs = POLICIES.get("fcfs")()
        self.rounds: list[float] = []
        self.announced_seen: dict[float, list[str]] = {}

    def schedule(self, ctx: SchedulingContext):
        self.rounds.append(ctx.now)
        self.announced_seen[ctx.now] = sorted(ctx.announced)
        extra = self.script.pop(ctx.now, None)
        if extra is not None:  # a scripted round: only the script acts
            return list(extra(ctx) if callable(extra) else extra)
        return self.fcfs.schedule(ctx)


def simulate(topo, specs, policy=None, placer="best-fit", **kw):
    sim = Simulation(topo, specs, policy or POLICIES.get("fcfs")(), PLACERS.get(placer)(), **kw)
    return sim.run()


def by_id(result):
    return {j.job_id: j for j in result.jobs}


def test_fcfs_replay_times_are_exact(small_clos):
    specs = [job("a", 0, 64, 100), job("b", 10, 8, 5), job("c", 20, 8, 5)]
    jobs = by_id(simulate(small_clos, specs))
    assert (jobs["a"].first_start, jobs["a"].end_time) == (0, 100)
    assert (jobs["b"].first_start, jobs["b"].end_time) == (100, 105)
    assert jobs["c"].first_start == 100


def test_easy_backfills_short_job_without_delaying_head(small_clos):
    specs = [job("big", 0, 48, 100), job("head", 1, 56, 50), job("short", 2, 4, 90), job("long", 3, 12, 500)]
    fcfs = by_id(simulate(small_clos, specs))
    easy = by_id(simulate(small_clos, specs, POLICIES.get("easy")()))
    assert fcfs["short"].first_start == 100  # blocked behind the head
    assert easy["short"].first_start == 2  # ends at 92 < shadow time 100
    assert easy["head"].first_start == fcfs["head"].first_start == 100
    assert easy["long"].first_start >= 100  # would have delayed the head


def test_sjf_starts_shortest_first(small_clos):
    specs = [job("block", 0, 64, 10), job("long", 1, 64, 100), job("short", 2, 64, 1)]
    jobs = by_id(simulate(small_clos, specs, POLICIES.get("sjf")()))
    assert jobs["short"].first_start == 10 and jobs["long"].first_start == 11


def test_job_larger_than_cluster_is_rejected_with_reason(small_clos):
    result = simulate(small_clos, [job("huge", 0, 65, 1), job("ok", 0, 8, 1)])
    jobs = by_id(result)
    assert jobs["huge"].state is JobState.REJECTED and "64" in jobs["huge"].reason
    assert jobs["ok"].state is JobState.FINISHED
    assert result.rejected == {"huge": jobs["huge"].reason}


def test_priority_preemption_keeps_progress_and_resumes(small_clos):
    specs = [job("low", 0, 64, 100, priority=0), job("high", 30, 32, 10, priority=5)]
    result = simulate(small_clos, specs, POLICIES.get("priority")())
    jobs = by_id(result)
    assert jobs["high"].first_start == 30 and jobs["high"].end_time == 40
    assert jobs["low"].preemptions == 1
    assert jobs["low"].end_time == pytest.approx(110)  # 30 s done, 10 s paused, 70 s left
    assert jobs["low"].gpu_seconds == pytest.approx(64 * 100)
    kinds = [type(d).__name__ for _, d in result.decisions]
    assert kinds == ["Start", "Preempt", "Start", "Resume"]
    assert "preempted by job high" in result.decisions[1][1].reason


def test_migrate_and_resize_change_rate(small_clos):
    def at50(ctx):
        return [Migrate("a", Allocation.single(7, 8), "move off node0")]

    def at60(ctx):
        return [Resize("a", Allocation.single(7, 4), "shrink to half")]

    policy = Scripted({50.0: at50, 60.0: at60})
    specs = [job("a", 0, 8, 100), job("tick1", 50, 1, 0), job("tick2", 60, 1, 0), job("tick3", 61, 1, 0)]
    a = by_id(simulate(small_clos, specs, policy))["a"]
    assert a.migrations == 1 and a.resizes == 1
    assert a.allocation == Allocation.single(7, 4)
    assert a.end_time == pytest.approx(60 + 40 * 2)  # 40 s of work left at half speed
    assert a.gpu_seconds == pytest.approx(8 * 60 + 4 * 80)


def test_migrate_must_keep_gpu_count(small_clos):
    policy = Scripted({5.0: [Migrate("a", Allocation.single(7, 4), "bad")]})
    with pytest.raises(DecisionError, match="Resize"):
        simulate(small_clos, [job("a", 0, 8, 100), job("t", 5, 1, 0)], policy)


def test_decision_for_unknown_or_wrong_state_job_is_rejected(small_clos):
    policy = Scripted({0.0: [Start("ghost", Allocation.single(0, 1), "bug")]})
    with pytest.raises(DecisionError, match="ghost"):
        simulate(small_clos, [job("a", 0, 8, 1)], policy)


def test_reservation_blocks_others_until_released(small_clos):
    nodes = tuple(range(4))  # minipod 0
    script = {
        0.0: [Reserve(0, nodes, 1000.0, "planned", "hold minipod 0 for planned")],
        50.0: [Release(0, "planned job cancelled")],
    }
    specs = [job("tick", 0, 1, 0), job("x", 1, 40, 10), job("y", 2, 8, 10), job("tick2", 50, 1, 0)]
    result = simulate(small_clos, specs, Scripted(script))
    jobs = by_id(result)
    assert jobs["x"].first_start == 50  # needs 40 GPUs; the release frees them and a follow-up round runs
    assert jobs["y"].first_start == 50  # FCFS: y waits behind x


def test_reservation_expires_at_its_end_time(small_clos):
    script = {0.0: [Reserve(3, tuple(range(8)), 200.0, "planned", "hold all")]}
    result = simulate(small_clos, [job("tick", 0, 1, 0), job("x", 1, 8, 10)], Scripted(script))
    assert by_id(result)["x"].first_start == 200
    assert any(isinstance(d, Release) and "end time" in d.reason for _, d in result.decisions)


def test_reserved_nodes_usable_by_their_job(small_clos):
    script = {0.0: [Reserve(1, tuple(range(8)), 1e9, "planned", "hold all")]}
    specs = [job("planned", 5, 64, 10, announce_time=0.0), job("other", 6, 8, 10)]
    policy = Scripted(script)
    result = simulate(small_clos, specs, policy)
    jobs = by_id(result)
    assert policy.announced_seen[0.0] == ["planned"]
    assert jobs["planned"].first_start == 5
    assert jobs["other"].first_start == 15  # the reservation went away when "planned" started
    assert any(isinstance(d, Release) and "planned started" in d.reason for _, d in result.decisions)


def test_timer_triggers_a_round(small_clos):
    policy = Scripted({0.0: [Timer(77.0, "check back later")]})
    simulate(small_clos, [job("a", 0, 8, 10)], policy)
    assert 77.0 in policy.rounds


def test_periodic_rounds_only_while_jobs_wait(small_clos):
    policy = Scripted()
    simulate(small_clos, [job("a", 0, 64, 100), job("b", 1, 64, 10)], policy, round_interval=30.0)
    assert 31.0 in policy.rounds and 91.0 in policy.rounds
    assert max(policy.rounds) <= 121.0  # the last periodic round fires once, then none while idle


def test_node_failure_evicts_requeues_and_accounts(small_clos):
    specs = [job("a", 0, 8, 100)]
    result = simulate(small_clos, specs, failures=[NodeFailure("node0", 40.0, 60.0)], placer="first-fit")
    a = by_id(result)["a"]
    assert a.failures == 1
    assert a.end_time == pytest.approx(100 + 0)  # restarted at once on another node, progress kept
    assert 0 not in a.allocation.nodes
    assert result.failed_gpu_seconds == pytest.approx(8 * 60)
    # the failure is a lifecycle transition in the run record, not a made-up decision
    assert not any("node0 failed" in d.reason for _, d in result.decisions)
    hit = [t for t in result.record.transitions_of("a") if "node0 failed" in t.event]
    assert [(t.old.name, t.new.name, t.at) for t in hit] == [("RUNNING", "SUSPENDED", 40.0)]


def test_failed_node_never_used_until_repaired(small_clos):
    specs = [job("a", 10, 64, 10)]
    jobs = by_id(simulate(small_clos, specs, failures=[NodeFailure("node3", 0.0, 100.0)]))
    assert jobs["a"].first_start == 100


def test_zero_duration_job_finishes_when_started(small_clos):
    jobs = by_id(simulate(small_clos, [job("z", 5, 8, 0)]))
    assert jobs["z"].first_start == jobs["z"].end_time == 5


def test_gpu_type_set_constraint_runs_on_one_type_of_the_set(hetero):
    from dataclasses import replace

    specs = [
        replace(job("any-of", 0, 8, 10), gpu_types=("V100", "A100-80GB")),
        replace(job("v100-only", 0, 4, 10), gpu_types=("V100", "H100")),  # H100 absent: V100 it is
        replace(job("too-big", 0, 12, 10), gpu_types=("V100",)),  # only 8 V100 GPUs exist
    ]
    result = simulate(hetero, specs, POLICIES.get("easy")())
    jobs = by_id(result)
    kinds = {hetero.node_type[n] for n in jobs["any-of"].allocation.nodes}
    assert len(kinds) == 1
    assert {hetero.node_names[n][0] for n in jobs["v100-only"].allocation.nodes} == {"v"}
    assert jobs["too-big"].state is JobState.REJECTED and "V100" in jobs["too-big"].reason


def test_run_ends_when_a_stranded_job_last_stopped():
    """A job evicted by a permanent failure never finishes; the run's end (and
    its GPU-time accounting) stops at the eviction, not at the start."""
    from loom.hardware.clos import clos

    one = clos("one", minipods=1, nodes=1, gpus_per_node=1, gpu_type="A100-80GB")
    result = simulate(one, [job("a", 0.0, 1, 2.0)], failures=[NodeFailure("node0", 1.0, float("inf"))])
    (stranded,) = result.jobs
    assert stranded.end_time is None and stranded.first_start == 0.0
    assert result.end_time == 1.0


def test_resize_and_migrate_pauses_cost_time_on_the_new_gpus(small_clos):
    def at50(ctx):
        return [Migrate("a", Allocation.single(7, 8), "move", pause_s=10.0)]

    def at70(ctx):
        return [Resize("a", Allocation.single(7, 4), "shrink", pause_s=20.0)]

    policy = Scripted({50.0: at50, 70.0: at70})
    specs = [job("a", 0, 8, 100), job("t1", 50, 1, 0), job("t2", 70, 1, 0)]
    a = by_id(simulate(small_clos, specs, policy))["a"]
    # t=50: 50 s of work left; a 10 s pause then 10 s of work by t=70 leaves 40 s;
    # halving the GPUs: a 20 s pause, then 40 s of work at half speed (80 s)
    assert a.end_time == pytest.approx(70 + 20 + 80)
    assert a.gpu_seconds == pytest.approx(8 * 70 + 4 * 100)


class SlowWhenQueued(Scripted):
    """FCFS that "takes" 1 ms per waiting job (on a fake clock): latency must follow the queue it saw."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def schedule(self, ctx: SchedulingContext):
        self.clock.now += 0.001 * len(ctx.pending)
        return super().schedule(ctx)


def test_decision_latency_recorded_per_round_with_its_queue(small_clos, monkeypatch):
    from loom.sim import engine
    from loom.report.metrics import latency_by_queue, summary

    clock = FakeClock()
    monkeypatch.setattr(engine, "time", clock)  # the engine's `time.perf_counter()`
    specs = [job("a", 0, 64, 100)] + [job(f"w{i}", 1 + i, 64, 1) for i in range(6)]
    result = simulate(small_clos, specs, SlowWhenQueued(clock))
    assert len(result.round_seconds) == len(result.round_queue) == result.rounds
    # the queue each round saw: a alone at t=0; w0..w5 join one by one (t=1..6) while a runs; a ends
    # at t=100 with all six waiting, then each 1-s job leaves the next five, four, ... none
    assert result.round_queue == [1, 1, 2, 3, 4, 5, 6, 6, 5, 4, 3, 2, 1, 0]
    assert result.round_seconds == pytest.approx([q / 1000 for q in result.round_queue])
    s = summary(result)
    # sorted ms: 0 1 1 1 2 2 3 3 4 4 5 5 6 6 (14 rounds): median (3 + 3) / 2 = 3; p99 at rank
    # 0.99 × 13 = 12.87 between the two 6s = 6; max 6
    assert (s["decision_ms_median"], s["decision_ms_p99"], s["decision_ms_max"]) == pytest.approx((3.0, 6.0, 6.0))
    rows = {r["queue"]: r for r in latency_by_queue(result, edges=(0, 3, 6))}
    # 0-2: 0 1 1 1 2 2 → median 1; 3-5: 3 3 4 4 5 5 → median 4; 6+: 6 6 → 6
    assert {k: r["rounds"] for k, r in rows.items()} == {"0-2": 6, "3-5": 6, "6+": 2}
    assert {k: r["median_ms"] for k, r in rows.items()} == pytest.approx({"0-2": 1.0, "3-5": 4.0, "6+": 6.0})
    assert sum(r["rounds"] for r in rows.values()) == result.rounds
