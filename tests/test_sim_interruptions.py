"""Interruptions priced by the cost model inside the simulator: checkpoints, preemption,
migration and failures, end to end through `Simulation`."""

from __future__ import annotations

import math

import pytest
from conftest import job
from test_engine import Scripted

from loom.core.decisions import Migrate, Preempt
from loom.core.jobs import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.errors import LoomInputError
from loom.hardware.state import Allocation
from loom.perf.interruptions import InterruptionCosts, InterruptionModel
from loom.report.metrics import summary
from loom.sim.engine import Simulation
from loom.workload.faults import NodeFailure
from loom.core.recovery import RecoveryConfig
from loom.workload.job_failures import FailurePlan


def run(topo, specs, model, policy=None, **kw):
    sim = Simulation(topo, specs, policy or POLICIES.get("fcfs")(), PLACERS.get("best-fit")(),
                     interruptions=model, **kw)
    result = sim.run()
    return {j.job_id: j for j in result.jobs}, result


def shape_of(model, spec, gpus=None, nodes=1):
    return model.shape(spec, gpus or spec.gpus, nodes)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_periodic_checkpoints_stall_a_job_after_every_interval_but_not_at_its_end(small_clos, mode):
    model = InterruptionModel(InterruptionCosts(checkpoint_mode=mode))  # every 1,800 s of progress
    jobs, result = run(small_clos, [job("a", 0, 8, 10_000), job("short", 0, 8, 1_000)], model)
    stall = model.checkpoint_stall_s(shape_of(model, job("a", 0, 8, 10_000)), mode)
    assert jobs["a"].end_time == pytest.approx(10_000 + 5 * stall)  # at 1,800 … 9,000 s of progress
    assert jobs["short"].end_time == pytest.approx(1_000)  # shorter than the interval: never checkpoints
    assert result.interruptions.checkpoint_gpu_s == pytest.approx(5 * stall * 8)


def test_async_checkpoints_cost_less_than_sync(small_clos):
    spec = [job("a", 0, 8, 10_000)]
    sync, _ = run(small_clos, spec, InterruptionModel(InterruptionCosts(checkpoint_mode="sync")))
    asyn, _ = run(small_clos, spec, InterruptionModel(InterruptionCosts(checkpoint_mode="async")))
    assert 10_000 < asyn["a"].end_time < sync["a"].end_time


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("fail_at", [4_200.0, 4_010.0])
def test_a_failure_loses_the_work_since_the_last_durable_checkpoint(small_clos, mode, fail_at):
    costs = InterruptionCosts(checkpoint_mode=mode, checkpoint_interval_s=1000.0)
    model = InterruptionModel(costs)
    spec = job("a", 0, 8, 10_000)
    node = small_clos.node_names[0]  # best-fit puts the job on the first node
    jobs, result = run(small_clos, [spec], model, failures=[NodeFailure(node, fail_at, 50.0)])
    shape = shape_of(model, spec)
    stall = model.checkpoint_stall_s(shape, mode)
    cycles, into = divmod(fail_at, 1000.0 + stall)
    kept = cycles * 1000.0  # progress saved by the completed checkpoints
    if mode == "async" and cycles >= 1 and into < model.persist_s(shape):
        kept -= 1000.0  # the newest one was still uploading
    lost = min(into, 1000.0) + (cycles * 1000.0 - kept)
    left = 10_000 - kept
    resume = model.load(shape).total_s  # restart from the checkpoint on another node at once
    assert jobs["a"].failures == 1
    assert jobs["a"].end_time == pytest.approx(fail_at + resume + left + (math.ceil(left / 1000) - 1) * stall)
    assert result.interruptions.lost_gpu_s == pytest.approx(lost * 8)


def test_preempted_job_pays_save_and_load_when_it_resumes(small_clos):
    model = InterruptionModel()
    spec = job("a", 0, 8, 5_000)
    policy = Scripted({100.0: [Preempt("a", "test")]})
    jobs, result = run(small_clos, [spec, job("tick", 100.0, 1, 1.0)], model, policy)
    shape = shape_of(model, spec)
    pause = model.save(shape).total_s + model.load(shape).total_s
    stall = model.checkpoint_stall_s(shape)
    assert jobs["a"].preemptions == 1
    assert jobs["a"].end_time == pytest.approx(5_000 + pause + 2 * stall)  # 4,900 s left: 2 checkpoints
    assert result.interruptions.paused_gpu_s == pytest.approx(pause * 8)  # the 1-GPU tick starts fresh


def test_migration_is_priced_by_the_model_not_the_policy(small_clos):
    model = InterruptionModel()
    spec = job("a", 0, 8, 5_000)
    target = Allocation((5,), (8,))
    policy = Scripted({200.0: [Migrate("a", target, "test", pause_s=1.0)]})
    jobs, _ = run(small_clos, [spec, job("tick", 200.0, 1, 1.0)], model, policy)
    shape = shape_of(model, spec)
    pause = model.migrate(shape, shape).total_s
    assert pause > 1.0
    assert jobs["a"].migrations == 1
    assert jobs["a"].end_time == pytest.approx(5_000 + pause + 2 * model.checkpoint_stall_s(shape))


def test_without_a_model_nothing_changes(small_clos):
    sim = Simulation(small_clos, [job("a", 0, 8, 1_000)], POLICIES.get("fcfs")(), PLACERS.get("best-fit")())
    result = sim.run()
    assert result.jobs[0].end_time == 1_000
    assert result.interruptions is None


# -- job-level failures (Acme taxonomy) ------------------------------------------------------


def plans(job_id, *items):
    return {job_id: [FailurePlan(job_id, kind, at) for kind, at in items]}


def test_a_script_error_ends_the_job_for_good_at_its_progress_point(small_clos):
    sim = Simulation(small_clos, [job("a", 10.0, 8, 1_000)], POLICIES.get("fcfs")(), PLACERS.get("best-fit")(),
                     job_failures=plans("a", ("script", 120.0)))
    result = sim.run()
    (a,) = result.jobs
    assert a.state is JobState.FAILED and a.end_time == pytest.approx(130.0)
    assert "script error" in a.reason
    assert summary(result)["failed"] == 1 and summary(result)["finished"] == 0


def test_a_hang_is_noticed_by_the_watchdog_and_restarted_in_place(small_clos):
    model = InterruptionModel(InterruptionCosts(checkpoint_interval_s=1_000.0))
    spec = job("a", 0.0, 8, 5_000)
    sim = Simulation(small_clos, [spec], POLICIES.get("fcfs")(), PLACERS.get("best-fit")(), interruptions=model,
                     job_failures=plans("a", ("hang", 2_500.0)), hang_watchdog_s=600.0)
    result = sim.run()
    (a,) = result.jobs
    shape = shape_of(model, spec)
    stall = model.checkpoint_stall_s(shape)
    hang_at = 2_500.0 + 2 * stall  # two checkpoints (after 1,000 and 2,000 s of progress) on the way
    cycles, into = divmod(hang_at, 1_000.0 + stall)
    kept = cycles * 1_000.0 - (1_000.0 if into < model.persist_s(shape) else 0.0)
    left = 5_000.0 - kept
    restart = hang_at + 600.0 + model.load(shape).total_s
    assert a.failures == 1 and a.state is JobState.FINISHED
    assert a.allocation.nodes == (0,)  # restarted where it was
    assert a.end_time == pytest.approx(restart + left + (math.ceil(left / 1_000.0) - 1) * stall)


def test_an_infrastructure_failure_takes_a_node_down_and_recovery_restarts_the_job(small_clos):
    spec = job("a", 0.0, 16, 5_000)
    sim = Simulation(small_clos, [spec], POLICIES.get("fcfs")(), PLACERS.get("best-fit")(),
                     interruptions=InterruptionModel(), recovery=RecoveryConfig(),
                     job_failures=plans("a", ("infrastructure", 1_000.0)), infra_repair_s=3_600.0)
    result = sim.run()
    (a,) = result.jobs
    (rec,) = result.recoveries
    assert a.failures == 1 and a.state is JobState.FINISHED
    assert rec.failed_at == pytest.approx(1_000.0) and rec.restarted_at == pytest.approx(1_000.0 + 300.0)
    assert rec.minipods_after == 1
    assert result.interruptions.lost_gpu_s == pytest.approx(1_000.0 * 16)  # no checkpoint before it


def test_plans_for_unknown_jobs_are_refused(small_clos):
    with pytest.raises(LoomInputError, match="unknown job"):
        Simulation(small_clos, [job("a", 0.0, 8, 10)], POLICIES.get("fcfs")(), PLACERS.get("best-fit")(),
                   job_failures=plans("zzz", ("script", 1.0)))
