"""Gavel (heterogeneity-aware LP rounds) and Gandiva (time-slicing, migration)."""

from __future__ import annotations

import numpy as np
import pytest

from loom.core.decisions import Migrate, Preempt, Start, Timer
from loom.core.protocols import PLACERS, POLICIES
from loom.errors import LoomInputError
from loom.hardware.clusters import CLUSTERS
from loom.hardware.topology import NodeDef, Tier, Topology
from loom.policies import gavel_lp as gavel_module
from loom.policies.gandiva import Gandiva
from loom.policies.gavel import Gavel
from loom.policies.gavel_lp import equal_share, solve_allocation
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.workload.job import JobSpec
from loom.workload.loaders import load_trace


def job(jid: str, t: float, gpus: int, duration: float, **kw) -> JobSpec:
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, duration=duration, **kw)


def simulate(topology, specs, policy, placer="first-fit", speed=None):
    return Simulation(topology, specs, policy, PLACERS.get(placer)(), speed).run()


def of_type(res, decision_type, job_id=None):
    return [(t, d) for t, d in res.decisions if isinstance(d, decision_type) and (job_id is None or d.job_id == job_id)]


def type_of(topology, alloc) -> str:
    return topology.gpu_types[int(topology.node_type[alloc.nodes[0]])]


def leaves(name: str, gpu_type: str, per_node: int, layout: list[int]) -> Topology:
    """One core switch; `layout[k]` nodes under leaf k."""
    nodes = [NodeDef(f"n{k}{i}", ("c", f"l{k}"), gpu_type, per_node) for k, count in enumerate(layout)
             for i in range(count)]
    return Topology.build(name, (Tier("core"), Tier("leaf")), nodes)


# ------------------------------------------------------------------ registry / params
def test_registered():
    assert POLICIES.get("gavel") is Gavel
    assert POLICIES.get("gandiva") is Gandiva


@pytest.mark.parametrize("cls, kw, field", [
    (Gavel, {"objective": "fastest"}, "objective"),
    (Gavel, {"round_s": 0}, "round_s"),
    (Gavel, {"round_s": "360"}, "round_s"),
    (Gavel, {"migration_pause_s": -1.0}, "migration_pause_s"),
    (Gandiva, {"time_slice_s": 0.0}, "time_slice_s"),
    (Gandiva, {"time_slice_s": float("inf")}, "time_slice_s"),
    (Gandiva, {"migration_pause_s": -5}, "migration_pause_s"),
    (Gandiva, {"migration_pause_s": True}, "migration_pause_s"),
])
def test_bad_params_name_the_field(cls, kw, field):
    with pytest.raises(LoomInputError) as err:
        cls(**kw)
    assert err.value.field is not None and err.value.field.endswith(field)
    assert field in err.value.located()


def test_solve_allocation_rejects_unknown_objective():
    with pytest.raises(LoomInputError, match="objective"):
        solve_allocation(np.ones((1, 1)), np.ones(1), np.ones(1), "nope")


# ------------------------------------------------------------------ the LP
@pytest.mark.parametrize("objective", ["max-sum-throughput", "max-min-fairness"])
def test_lp_allocation_is_feasible(objective):
    rng = np.random.default_rng(7)
    thr = rng.uniform(0.1, 5.0, size=(25, 3))
    thr[rng.random(thr.shape) < 0.15] = 0.0  # some jobs cannot use some types
    gpus = rng.choice([1, 2, 4, 8, 16], size=25)
    capacity = np.array([16.0, 32.0, 8.0])
    x = solve_allocation(thr, gpus, capacity, objective)
    assert x.shape == thr.shape
    assert (x >= -1e-9).all() and (x <= 1 + 1e-9).all()
    assert (x.sum(axis=1) <= 1 + 1e-7).all()
    assert ((x * gpus[:, None]).sum(axis=0) <= capacity + 1e-6).all()
    assert (x[thr == 0] == 0).all()
    assert (x[gpus > 8][:, 2] == 0).all()  # larger than the type: never there
    assert x.sum() > 0


def test_max_min_raises_the_minimum_over_max_sum():
    thr = np.array([[3.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    gpus = np.array([1, 1, 1])
    capacity = np.array([1.0, 1.0])
    eq = equal_share(thr, gpus, capacity)

    def minimum(x):
        return float(((x * thr).sum(axis=1) / eq).min())

    fair = solve_allocation(thr, gpus, capacity, "max-min-fairness")
    greedy = solve_allocation(thr, gpus, capacity, "max-sum-throughput")
    assert minimum(fair) > minimum(greedy) + 0.1
    assert minimum(fair) >= 1.0 - 1e-6  # everyone gets at least its equal share (more: types are used well)
    # max-sum is the better total throughput: the trade-off is real
    ref = thr.max(axis=1)
    assert ((greedy * thr).sum(axis=1) / ref).sum() >= ((fair * thr).sum(axis=1) / ref).sum() - 1e-6


def test_lp_puts_each_job_where_it_is_relatively_fastest():
    # both jobs are faster on type 1, but job 0 relatively much more (3× vs 1.5×)
    thr = np.array([[1.0, 3.0], [1.0, 1.5]])
    x = solve_allocation(thr, np.array([1, 1]), np.array([1.0, 1.0]), "max-sum-throughput")
    assert x[0, 1] == pytest.approx(1.0) and x[1, 0] == pytest.approx(1.0)


def test_identical_jobs_share_alike_at_the_per_job_optimum():
    # jobs 0-2 are identical, as are 3-4: the LP is solved per class, so identical jobs get
    # identical X, and the fair level matches solving each job separately (classes of one)
    thr = np.array([[1.0, 2.0]] * 3 + [[1.0, 1.2]] * 2 + [[3.0, 0.5]])
    gpus = np.array([2, 2, 2, 1, 1, 4])
    capacity = np.array([4.0, 4.0])
    x = solve_allocation(thr, gpus, capacity, "max-min-fairness")
    assert np.allclose(x[0], x[1]) and np.allclose(x[0], x[2]) and np.allclose(x[3], x[4])
    eq = equal_share(thr, gpus, capacity)
    fair = ((x * thr).sum(axis=1) / eq).min()
    perturbed = thr * (1 + 1e-9 * np.arange(len(thr)))[:, None]  # every job its own class
    y = solve_allocation(perturbed, gpus, capacity, "max-min-fairness")
    assert fair == pytest.approx(((y * perturbed).sum(axis=1) / equal_share(perturbed, gpus, capacity)).min(),
                                 rel=1e-5)
    assert ((x * gpus[:, None]).sum(axis=0) <= capacity + 1e-6).all()


def test_unique_rows_matches_numpy():
    rng = np.random.default_rng(5)
    for _ in range(200):
        base = rng.choice([0.0, 0.5, 1.0, 2.0, float(rng.uniform(0, 3))], size=(int(rng.integers(1, 8)), 4))
        a = base[rng.integers(0, len(base), int(rng.integers(1, 50)))]
        rows, member, count = np.unique(a, axis=0, return_inverse=True, return_counts=True)
        mine = gavel_module._unique_rows(a)
        assert all(np.array_equal(p, q) for p, q in zip(mine, (rows, member.ravel(), count)))


@pytest.mark.parametrize("objective", ["max-sum-throughput", "max-min-fairness"])
def test_direct_highs_matches_linprog_and_ignores_job_order(objective, monkeypatch):
    # the LP goes to scipy's HiGHS binding directly; it must give exactly linprog's answer,
    # whatever the order of the jobs (classes are ordered by content), and reuse it when memoised
    rng = np.random.default_rng(11)
    cases = []
    for _ in range(40):
        n, types = int(rng.integers(1, 60)), int(rng.integers(1, 5))
        base = rng.uniform(0.1, 5.0, size=(int(rng.integers(1, 12)), types))
        thr = base[rng.integers(0, len(base), n)]
        thr[rng.random(thr.shape) < 0.1] = 0.0
        cases.append((thr, rng.choice([1, 2, 4, 8, 16], size=n).astype(float),
                      rng.choice([8.0, 16.0, 32.0], size=types), rng.permutation(n)))
    direct = [solve_allocation(thr, gpus, cap, objective) for thr, gpus, cap, _ in cases]
    memo: dict = {}
    for (thr, gpus, cap, perm), x in zip(cases, direct):
        assert np.array_equal(solve_allocation(thr[perm], gpus[perm], cap, objective, memo=memo), x[perm])
        assert np.array_equal(solve_allocation(thr, gpus, cap, objective, memo=memo), x)  # memoised
    monkeypatch.setattr(gavel_module, "_HIGHS", None)  # the linprog path
    for (thr, gpus, cap, _), x in zip(cases, direct):
        assert np.array_equal(solve_allocation(thr, gpus, cap, objective), x)


# ------------------------------------------------------------------ Gavel in the simulator
def test_gavel_moves_a_job_to_its_faster_type(hetero):
    # bert asks for V100 but is ~2.5× faster on A100; the A100s also hold a job that fits
    # nowhere else. The LP time-shares the A100s between them, so bert is migrated between
    # types by round, and ends on A100 once the filler is done.
    specs = [job("filler", 0.0, 16, 1000.0), job("bert", 0.0, 4, 20000.0, gpu_type="V100", model="bert__1.3B")]
    policy = Gavel(round_s=360.0)
    res = simulate(hetero, specs, policy, speed=EstimatorSpeed())
    filler, bert = (next(j for j in res.jobs if j.job_id == k) for k in ("filler", "bert"))
    assert filler.end_time is not None and bert.end_time is not None
    moves = of_type(res, Migrate, "bert")
    to_a100 = [(t, d) for t, d in moves if type_of(hetero, d.allocation) == "A100-80GB"]
    assert to_a100 and all(d.pause_s == 30.0 for _, d in moves)
    assert type_of(hetero, moves[-1][1].allocation) == "A100-80GB"
    assert not [t for t, d in moves if t > filler.end_time and type_of(hetero, d.allocation) == "V100"]
    assert of_type(res, Preempt, "filler")  # time-sharing the A100s
    assert bert.end_time < 20000.0  # faster than staying on its requested V100
    assert set(policy.last_allocation) <= {"bert", "filler"}


def test_gavel_timers_keep_rounds_going(hetero):
    specs = [job("long", 0.0, 4, 2000.0)]
    policy = Gavel(round_s=360.0)
    res = simulate(hetero, specs, policy)
    timers = [d.at for _, d in of_type(res, Timer)]
    assert timers[:6] == pytest.approx([360.0 * k for k in range(1, 7)])
    rounds = [t for t, _s, kind in policy.round_latencies if kind == "round"]
    assert rounds[:6] == pytest.approx([360.0 * k for k in range(6)])
    assert res.jobs[0].end_time == pytest.approx(2000.0)


def test_gavel_time_shares_when_oversubscribed(hetero):
    # three 16-GPU jobs, only the A100 pool holds one: Gavel rotates them by round
    specs = [job(f"j{i}", 0.0, 16, 1500.0) for i in range(3)]
    res = simulate(hetero, specs, Gavel(round_s=360.0))
    assert all(j.end_time is not None for j in res.jobs)
    assert of_type(res, Preempt)
    assert max(j.first_start for j in res.jobs) < min(j.end_time for j in res.jobs)


def test_gavel_rows_follow_the_jobs_in_the_system_not_every_job_ever_submitted(hetero):
    """A service submits jobs without end: Gavel's per-job arrays must be bounded by the jobs in
    the system, rows of finished jobs reused (not indexed by submission number)."""
    burst = [job(f"b{i}", 0.0, 4, 100.0) for i in range(70)]
    later = [job(f"s{i}", 10_000.0 + 400.0 * i, 4, 100.0) for i in range(200)]
    policy = Gavel(round_s=360.0)
    res = simulate(hetero, burst + later, policy)
    assert all(j.end_time is not None for j in res.jobs)
    rows = policy._rows
    assert rows.used <= 70 and len(rows.ref) == 128  # the burst's peak, grown geometrically from 64
    assert not rows.row and len(rows.free) == rows.used  # every row back on the free list


@pytest.fixture(scope="module")
def arena():
    return CLUSTERS.get("arena-1280")(), load_trace("arena-pai")[:60]


@pytest.mark.parametrize("name", ["gavel", "gandiva"])
def test_first_60_arena_pai_jobs_complete(arena, name):
    topology, specs = arena
    policy = POLICIES.get(name)()
    res = simulate(topology, specs, policy, speed=EstimatorSpeed())
    assert len(res.jobs) == 60
    assert all(j.end_time is not None for j in res.jobs)
    assert policy.round_latencies
    if name == "gavel":
        assert of_type(res, Timer)


# ------------------------------------------------------------------ Gandiva
def test_gandiva_time_slices_a_waiting_job_in(small_clos):
    one = leaves("one", "A100-80GB", 8, [1])
    specs = [job("long", 0.0, 8, 10000.0), job("short", 10.0, 8, 100.0)]
    res = simulate(one, specs, Gandiva(time_slice_s=600.0))
    long, short = res.jobs
    assert short.end_time < long.end_time
    assert short.first_start == pytest.approx(610.0)  # first slice (600 s after it began waiting)
    suspends = of_type(res, Preempt, "long")
    assert suspends and suspends[0][0] == pytest.approx(610.0)
    assert long.end_time == pytest.approx(10100.0)  # progress kept: only short's 100 s were lost


def test_gandiva_round_robin_same_size(small_clos):
    one = leaves("one", "A100-80GB", 8, [1])
    specs = [job(f"j{i}", 0.0, 8, 1500.0) for i in range(3)]
    res = simulate(one, specs, Gandiva(time_slice_s=300.0))
    assert all(j.end_time is not None for j in res.jobs)
    assert max(j.first_start for j in res.jobs) < min(j.end_time for j in res.jobs)
    assert len(of_type(res, Preempt)) >= 3


def test_gandiva_slices_only_same_size(small_clos):
    one = leaves("one", "A100-80GB", 8, [1])
    specs = [job("big", 0.0, 8, 5000.0), job("small", 10.0, 4, 100.0)]
    res = simulate(one, specs, Gandiva(time_slice_s=600.0))
    assert not of_type(res, Preempt)
    assert res.jobs[1].first_start == pytest.approx(5000.0)


def test_gandiva_migrates_for_locality():
    # 2 leaves × 2 nodes × 4 GPUs; fillers leave one GPU per node, so a 4-GPU job
    # spans all four nodes; when two fillers end it moves onto one node
    topo = leaves("two-leaves", "A100-80GB", 4, [2, 2])
    specs = [job("s0", 0.0, 3, 5000.0), job("s1", 0.0, 3, 100.0), job("s2", 0.0, 3, 5000.0),
             job("s3", 0.0, 3, 100.0), job("wide", 1.0, 4, 3000.0)]
    res = simulate(topo, specs, Gandiva(migration_pause_s=30.0))
    wide = next(j for j in res.jobs if j.job_id == "wide")
    start = of_type(res, Start, "wide")[0][1]
    assert len(start.allocation.nodes) == 4
    moves = of_type(res, Migrate, "wide")
    assert len(moves) == 1
    at, move = moves[0]
    assert at == pytest.approx(100.0)
    assert len(move.allocation.nodes) == 1 and move.pause_s == 30.0
    assert topo.switches_spanned(move.allocation.nodes) < topo.switches_spanned(start.allocation.nodes)
    assert wide.migrations == 1
    assert wide.end_time == pytest.approx(1.0 + 3000.0 + 30.0)  # the pause is the migration's cost


def test_gandiva_respects_the_jobs_gpu_type(hetero):
    specs = [job("v", 0.0, 4, 100.0, gpu_type="V100"), job("a", 0.0, 8, 100.0, gpu_type="A100-80GB")]
    res = simulate(hetero, specs, Gandiva())
    for _, d in of_type(res, Start):
        assert type_of(hetero, d.allocation) == ("V100" if d.job_id == "v" else "A100-80GB")
