"""ElasticFlow and Sia baselines: arena runs, admission control, resizes, type moves, rounds, params."""

from __future__ import annotations

import heapq
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from loom.core.decisions import Migrate, Resize, Timer
from loom.core.jobs import Job, JobState
from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.clusters import arena_1280
from loom.hardware.state import Allocation, ClusterState
from loom.placement.first_fit import FirstFit
from loom.policies.elastic_common import (
    healthy_capacities,
    healthy_capacity,
    power_sizes,
)
from loom.policies.elasticflow import GAIN_EPS, ElasticFlow, Ladder
from loom.policies.sia import Sia
from loom.policies.throughput import Throughputs
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


# ----------------------------------------------------------------- ElasticFlow's filling: fast routes vs the heap
def heap_fill(policy, ctx, pool, members, ladders, share, free):
    """The leftover-GPU rule as a plain heap (the code the faster routes replaced)."""
    heap = []
    by_id = {j.job_id: j for j in members}
    for job in members:
        jid = job.job_id
        steps, norms = ladders[jid].sizes, ladders[jid].norms
        cur = share.get(jid, 0)
        at = next((i for i, g in enumerate(steps) if g > cur), len(steps))
        if at == len(steps):
            continue
        now_norm = norms[at - 1] if at and steps[at - 1] == cur else policy._norm(job, pool, cur)
        gain = (norms[at] - now_norm) / (steps[at] - cur)
        if gain > 1e-12:
            heap.append((-gain, job.key, jid, at))
    heapq.heapify(heap)
    while heap and free > 0:
        _, key, jid, at = heapq.heappop(heap)
        steps, norms = ladders[jid].sizes, ladders[jid].norms
        nxt = steps[at]
        cur = share.get(jid, 0)
        if nxt - cur > free:
            continue
        job = by_id[jid]
        if job.allocation is not None:
            running = job.allocation.total
            if cur >= running and policy._time_at(ctx, job, pool, nxt) >= policy._time_at(ctx, job, pool, running):
                continue
        share[jid] = nxt
        free -= nxt - cur
        at += 1
        if at < len(steps):
            gain = (norms[at] - norms[at - 1]) / (steps[at] - nxt)
            if gain > 1e-12:
                heapq.heappush(heap, (-gain, key, jid, at))


def random_pool(rng, policy, n):
    """Jobs with random ladders (concave or not, ties, flat steps), some running, some with a share."""
    members, ladders, share = [], {}, {}
    keys = rng.sample(range(100), n)
    for i in range(n):
        request = rng.choice([1, 2, 3, 4, 8])
        sizes = power_sizes(request, 1, request * rng.choice([1, 2, 4]))
        shape = rng.random()
        norms, value = [], 0.0
        for g in sizes:
            if shape < 0.3:  # concave-ish
                value = g ** 0.7 / request ** 0.7
            else:  # arbitrary, with ties and flats from a coarse grid
                value = max(0.0, value + rng.choice([0.0, 0.25, 0.5, 1.0, 2.0, -0.25]))
            norms.append(value)
        job = Job(JobSpec(f"j{i}", 0.0, request, duration=rng.uniform(10, 5000)), keys[i])
        for g, v in zip(sizes, norms):
            policy._norms[(job.job_id, None, g)] = v
        policy._norms[(job.job_id, None, 0)] = 0.0
        off = request * 4 + 1  # a size off the ladder
        policy._norms[(job.job_id, None, off)] = rng.choice([0.0, 0.3, 1.5])
        policy._norms[(job.job_id, None, 3)] = policy._norms.get((job.job_id, None, 3), rng.choice([0.0, 0.3, 1.5]))
        if rng.random() < 0.6:
            job.state = JobState.RUNNING
            job.rate, job.since = rng.uniform(0.5, 2.0), 0.0
            job.allocation = Allocation.single(0, rng.choice([*sizes, 3]))
        roll = rng.random()
        if roll < 0.2:
            share[job.job_id] = rng.choice(sizes)
        elif roll < 0.25:
            share[job.job_id] = 3 if 3 not in sizes else off
        ladders[job.job_id] = Ladder(sizes, norms)
        members.append(job)
    members.sort(key=lambda j: j.key)
    return members, ladders, share


@pytest.mark.parametrize("seed", range(300))
def test_elasticflow_fill_matches_heap(seed):
    rng = random.Random(seed)
    policy = ElasticFlow(pause_s=rng.choice([0.0, 30.0, 3000.0]))
    members, ladders, share = random_pool(rng, policy, rng.randint(1, 14))
    now = rng.uniform(0, 100)
    ctx = SimpleNamespace(now=now, remaining_work=lambda j: max(
        0.0, j.spec.duration - (j.rate * (now - j.since) if j.state is JobState.RUNNING else 0.0)))
    ids = [j.job_id for j in members]
    top = sum(ladders[j].sizes[-1] if ladders[j].sizes else 0 for j in ids)
    for free in sorted({0, 1, rng.randint(0, top), rng.randint(0, top), top, top + 5}):
        for moves in range(4):  # the memo answers repeats; then running sizes change (which it must notice)
            if moves >= 2:
                for job in rng.sample(members, max(1, len(members) // 3)):
                    sizes = ladders[job.job_id].sizes
                    job.allocation = None if rng.random() < 0.3 else Allocation.single(0, rng.choice([*sizes, 3]))
                    job.state = JobState.PENDING if job.allocation is None else JobState.RUNNING
            want = dict(share)
            heap_fill(policy, ctx, None, members, ladders, want, free)
            got = dict(share)
            policy._fill(ctx, None, 1000, members, ids, ladders, got, free)
            assert got == want, (seed, free, moves)


def test_elasticflow_fill_reuses_sorted_steps_across_members():
    rng = random.Random(7)
    policy = ElasticFlow()
    members, ladders, share = random_pool(rng, policy, 12)
    ctx = SimpleNamespace(now=5.0)
    for subset in (members, members[:-1], members[1:], members):  # the pool's sorted steps change and repeat
        ids = [j.job_id for j in subset]
        for free in (3, 11, 40):
            want = {k: v for k, v in share.items() if k in ids}
            got = dict(want)
            heap_fill(policy, ctx, None, subset, ladders, want, free)
            policy._fill(ctx, None, 64, subset, ids, ladders, got, free)
            assert got == want


def test_ladder_gains_and_climb_ends():
    ladder = Ladder([1, 2, 4, 8], [0.5, 1.0, 1.0, 2.0])
    assert ladder.gains == [0.5, 0.5, 0.0, 0.25]
    assert ladder.ends == [2, 2, 4, 4]  # a climb stops before a gain <= GAIN_EPS
    assert GAIN_EPS == 1e-12
    negs, indices, sizes, below = ladder.climb(2)
    assert indices.tolist() == [2, 3] and sizes.tolist() == [2, 4] and below.tolist() == [2, 4]
    assert negs.tolist() == [-0.0, -0.0]  # effective gain: the least of the climb so far


class HeapElasticFlow(ElasticFlow):
    """ElasticFlow with the plain heap filling (the reference)."""

    def _fill(self, ctx, pool, capacity, members, ids, ladders, share, free):
        heap_fill(self, ctx, pool, members, ladders, share, free)


def test_elasticflow_decisions_match_heap_reference(arena60):
    small = clos("small", minipods=1, nodes=4, gpus_per_node=8, gpu_type="A100-80GB", nodes_per_leaf=2)
    specs = [replace(s, gpu_type=None, gpu_types=None,
                     deadline=(s.submit_time + 3 * (s.duration or 1000) if i % 3 == 0 else None))
             for i, s in enumerate(arena60)]
    runs = []
    for cls in (ElasticFlow, HeapElasticFlow):
        policy = cls()
        result = Simulation(small, specs, policy, FirstFit(), EstimatorSpeed()).run()
        runs.append(([(t, repr(d)) for t, d in result.decisions], policy.admitted, policy.dropped))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) > 60 and runs[0][1] and runs[0][2]


def test_healthy_capacities_match_healthy_capacity(hetero):
    state = ClusterState(hetero)
    for failed in ([], [0], [0, len(state.failed) - 1]):
        state.failed[:] = False
        state.failed[failed] = True
        caps = healthy_capacities(state)
        for gpu_type in (None, *hetero.gpu_types):
            assert caps[gpu_type] == healthy_capacity(state, gpu_type)
        assert caps.get("no-such-type", 0) == healthy_capacity(state, "no-such-type") == 0


def test_throughputs_memo_matches_fresh(hetero):
    memo = Throughputs(hetero)
    specs = [JobSpec("a", 0, 4, model="bert__760M", batch_size=128),
             JobSpec("b", 0, 4, model="bert__760M", batch_size=128, gpu_type="V100"),
             JobSpec("c", 0, 2, model=None), JobSpec("d", 0, 8, model="no-such-model"),
             JobSpec("big", 0, 4, model="gpt3-175b", batch_size=32)]  # fits nowhere
    for _ in range(2):  # the second pass answers from the memo
        for spec in specs:
            for gpu_type in hetero.gpu_types:
                for gpus in (0, 1, 2, 4, 8):
                    for dp_only in (False, True):
                        fresh = Throughputs(hetero)
                        assert memo.of(spec, gpu_type, gpus, dp_only) == fresh.of(spec, gpu_type, gpus, dp_only)
                        assert memo.normalised(spec, gpu_type, gpus, dp_only) == \
                            fresh.normalised(spec, gpu_type, gpus, dp_only)
                    # `runs` (a feasibility search) agrees with the best plan's throughput, before or after `of`
                    assert Throughputs(hetero).runs(spec, gpu_type, gpus) == (fresh.of(spec, gpu_type, gpus) > 0)
                    assert memo.runs(spec, gpu_type, gpus) == (fresh.of(spec, gpu_type, gpus) > 0)
    assert memo.of(specs[2], hetero.gpu_types[0], 3) == 1.5  # no preset: linear in the request
