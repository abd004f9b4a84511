"""Interruptions priced by the cost model inside the simulator: checkpoints, preemption,
migration and failures, end to end through `Simulation`."""

from __future__ import annotations

import pytest

from conftest import job
from loom.core.decisions import Migrate, Preempt
from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.state import Allocation
from loom.perf.interruptions import InterruptionCosts, InterruptionModel
from loom.sim.engine import Simulation
from loom.sim.events import NodeFailure
from test_engine import Scripted


def run(topo, specs, model, policy=None, **kw):
    sim = Simulation(topo, specs, policy or POLICIES.get("fcfs")(), PLACERS.get("best-fit")(),
                     interruptions=model, **kw)
    result = sim.run()
    return {j.job_id: j for j in result.jobs}, result


def shape_of(model, spec, gpus=None, nodes=1):
    return model.shape(spec, gpus or spec.gpus, nodes)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_periodic_checkpoints_slow_a_job_by_their_stall(small_clos, mode):
    model = InterruptionModel(InterruptionCosts(checkpoint_mode=mode))
    spec = job("a", 0, 8, 10_000)
    jobs, result = run(small_clos, [spec], model)
    slowdown = model.checkpoint_slowdown(shape_of(model, spec), mode)
    assert jobs["a"].end_time == pytest.approx(10_000 * slowdown)
    assert result.interruptions.checkpoint_gpu_s == pytest.approx((slowdown - 1) * 10_000 * 8)


def test_async_checkpoints_cost_less_than_sync(small_clos):
    spec = [job("a", 0, 8, 10_000)]
    sync, _ = run(small_clos, spec, InterruptionModel(InterruptionCosts(checkpoint_mode="sync")))
    asyn, _ = run(small_clos, spec, InterruptionModel(InterruptionCosts(checkpoint_mode="async")))
    assert 10_000 < asyn["a"].end_time < sync["a"].end_time


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failure_loses_the_work_since_the_last_durable_checkpoint(small_clos, mode):
    costs = InterruptionCosts(checkpoint_mode=mode, checkpoint_interval_s=1000.0)
    model = InterruptionModel(costs)
    spec = job("a", 0, 8, 10_000)
    node = small_clos.node_names[0]  # best-fit puts the job on the first node
    fail_at = 4_200.0
    jobs, result = run(small_clos, [spec], model, failures=[NodeFailure(node, fail_at, 50.0)])
    shape = shape_of(model, spec)
    stall = model.checkpoint_stall_s(shape, mode)
    period = 1000.0 + stall
    into = fail_at % period
    lost = into + (period if mode == "async" and into < model.persist_s(shape) else 0.0)
    rate = 1.0 / model.checkpoint_slowdown(shape, mode)
    done = fail_at * rate - lost * rate
    resume = model.load(shape).total_s  # restart from the checkpoint on another node at once
    assert jobs["a"].failures == 1
    assert jobs["a"].end_time == pytest.approx(fail_at + resume + (10_000 - done) / rate)
    assert result.interruptions.lost_gpu_s == pytest.approx(lost * 8)


def test_preempted_job_pays_save_and_load_when_it_resumes(small_clos):
    model = InterruptionModel()
    spec = job("a", 0, 8, 5_000)
    policy = Scripted({100.0: [Preempt("a", "test")]})
    jobs, result = run(small_clos, [spec, job("tick", 100.0, 1, 1.0)], model, policy)
    shape = shape_of(model, spec)
    pause = model.save(shape).total_s + model.load(shape).total_s
    slow = model.checkpoint_slowdown(shape)
    assert jobs["a"].preemptions == 1
    assert jobs["a"].end_time == pytest.approx(5_000 * slow + pause)
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
    assert jobs["a"].end_time == pytest.approx(5_000 * model.checkpoint_slowdown(shape) + pause)


def test_without_a_model_nothing_changes(small_clos):
    sim = Simulation(small_clos, [job("a", 0, 8, 1_000)], POLICIES.get("fcfs")(), PLACERS.get("best-fit")())
    result = sim.run()
    assert result.jobs[0].end_time == 1_000
    assert result.interruptions is None
