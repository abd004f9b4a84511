"""ElasticFlow and Sia baselines: arena runs, admission control, resizes, type moves, rounds, params."""

from __future__ import annotations

import pytest

from loom.core.decisions import Migrate, Resize, Timer
from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.clusters import arena_1280
from loom.placement.first_fit import FirstFit
from loom.policies.elasticflow import ElasticFlow
from loom.policies.sia import Sia
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.workload.job import JobSpec
from loom.workload.loaders import load_trace


@pytest.fixture(scope="module")
def arena60():
    return sorted(load_trace("arena-pai"), key=lambda s: s.submit_time)[:60]


def one_node():
    return clos("one", minipods=1, nodes=1, gpus_per_node=8, gpu_type="A100-80GB", nodes_per_leaf=1)


def spec(jid, t, gpus, duration, **kw):
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, duration=duration, **kw)


@pytest.mark.parametrize("policy_cls", [ElasticFlow, Sia])
def test_arena_pai_first_60_complete(arena60, policy_cls):
    policy = policy_cls()
    result = Simulation(arena_1280(), arena60, policy, FirstFit(), EstimatorSpeed()).run()
    assert not result.rejected
    for job in result.jobs:
        dropped = getattr(policy, "dropped", {})
        assert job.end_time is not None or job.job_id in dropped, job
    if policy_cls is ElasticFlow:  # admitted jobs meet their deadlines
        for job in result.jobs:
            if job.job_id in policy.admitted:
                assert job.end_time <= job.spec.deadline + 1e-6
    else:
        assert any(isinstance(d, Timer) for _, d in result.decisions)


def test_elasticflow_drops_unmeetable_and_meets_admitted():
    specs = [
        spec("a", 0, 8, 1000, deadline=1100),
        spec("b", 10, 8, 1000, deadline=1500),  # feasible alone, not with a's commitment
        spec("c", 20, 1, 5000, deadline=100),  # never feasible
    ]
    policy = ElasticFlow()
    result = Simulation(one_node(), specs, policy, FirstFit()).run()
    jobs = {j.job_id: j for j in result.jobs}
    assert "a" in policy.admitted and jobs["a"].end_time <= 1100
    assert "commitments" in policy.dropped["b"]
    assert "even" in policy.dropped["c"]
    # best-effort: dropped jobs still run on leftover GPUs, and their decisions say why
    assert jobs["b"].end_time is not None and jobs["c"].end_time is not None
    assert any("dropped" in d.reason for _, d in result.decisions if getattr(d, "job_id", None) == "b")


def test_elasticflow_hold_never_starts_dropped():
    specs = [spec("a", 0, 8, 1000, deadline=1100), spec("b", 10, 8, 1000, deadline=1500)]
    policy = ElasticFlow(on_miss="hold")
    result = Simulation(one_node(), specs, policy, FirstFit()).run()
    jobs = {j.job_id: j for j in result.jobs}
    assert jobs["a"].end_time <= 1100 and jobs["b"].first_start is None and "b" in policy.dropped


def test_elasticflow_resize_carries_pause():
    specs = [spec("a", 0, 2, 1000), spec("b", 100, 4, 400, deadline=1100)]
    policy = ElasticFlow(pause_s=25.0)
    result = Simulation(one_node(), specs, policy, FirstFit()).run()
    jobs = {j.job_id: j for j in result.jobs}
    resizes = [d for _, d in result.decisions if isinstance(d, Resize)]
    assert resizes and all(d.pause_s == 25.0 for d in resizes)
    assert jobs["a"].resizes >= 1
    assert "b" in policy.admitted and jobs["b"].end_time <= 1100


def test_sia_moves_job_to_faster_type_when_capacity_frees(hetero):
    specs = [
        JobSpec("big", 0, 16, model="bert__760M", iterations=3000, batch_size=128),
        JobSpec("x", 10, 4, model="bert__760M", iterations=20000, batch_size=128, gpu_type="V100"),
    ]
    policy = Sia(round_s=60, pause_s=5, max_scale=1)
    result = Simulation(hetero, specs, policy, FirstFit(), EstimatorSpeed()).run()
    jobs = {j.job_id: j for j in result.jobs}
    assert all(j.end_time is not None for j in result.jobs)
    topo = hetero
    first = next(d for _, d in result.decisions if getattr(d, "job_id", None) == "x")
    assert topo.gpu_types[topo.node_type[first.allocation.nodes[0]]] == "V100"
    moves = [(t, d) for t, d in result.decisions if isinstance(d, (Migrate, Resize)) and d.job_id == "x"]
    assert moves, "x never moved"
    t, move = moves[0]
    assert topo.gpu_types[topo.node_type[move.allocation.nodes[0]]] == "A100-80GB"
    assert move.pause_s == 5
    assert t >= jobs["big"].end_time
    # rounds: timers keep them going, one every round_s while work remains
    timers = [d for _, d in result.decisions if isinstance(d, Timer)]
    assert len(timers) >= 2 and policy.rounds_solved >= 2


@pytest.mark.parametrize("cls, params, field", [
    (ElasticFlow, {"pause_s": -1}, "pause_s"),
    (ElasticFlow, {"max_scale": 0}, "max_scale"),
    (ElasticFlow, {"max_scale": 2.5}, "max_scale"),
    (ElasticFlow, {"margin": 1.0}, "margin"),
    (ElasticFlow, {"on_miss": "drop"}, "on_miss"),
    (Sia, {"round_s": 0}, "round_s"),
    (Sia, {"p": 1.0}, "p"),
    (Sia, {"p": "x"}, "p"),
    (Sia, {"pause_s": float("nan")}, "pause_s"),
    (Sia, {"max_scale": True}, "max_scale"),
])
def test_bad_params(cls, params, field):
    with pytest.raises(LoomInputError) as err:
        cls(**params)
    assert err.value.field == f"policy.params.{field}"
