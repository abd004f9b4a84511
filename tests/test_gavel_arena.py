"""gavel-arena (Arena's Gavel baseline): registration, params, MIP admission on the best type,
the at-most-3 type changes, drops, retries only after completions (with type blocking),
restart costs, a short arena-philly run."""

from __future__ import annotations

import pytest

from loom.core.decisions import Migrate, Preempt, Resize, Start
from loom.core.protocols import POLICIES
from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.clusters import arena_1280
from loom.hardware.importers._common import INVENTORY_TIERS, group_inventory
from loom.hardware.topology import Topology
from loom.placement.first_fit import FirstFit
from loom.policies.gavel_arena import GavelArena
from loom.policies.move_search import NoGainProofs
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.workload.job import JobSpec
from loom.workload.loaders import load_trace

MODEL = {"model": "bert__760M", "batch_size": 32}


def one_node(gpus: int = 8):
    return clos("one", minipods=1, nodes=1, gpus_per_node=gpus, gpu_type="A100-80GB", nodes_per_leaf=1)


def typed(*rows):
    return Topology.build("typed", INVENTORY_TIERS, group_inventory(list(rows)), minipod_tier="pod")


def three_types():
    return typed(("a100-000", "A100-40GB", 4), ("a40-000", "A40", 4), ("a10-000", "A10", 4))


def spec(jid, t, gpus, duration, **kw):
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, duration=duration, **kw)


def run(topo, specs, **params):
    policy = GavelArena(**params)
    result = Simulation(topo, specs, policy, FirstFit()).run()
    return policy, result, {j.job_id: j for j in result.jobs}


def of_kind(result, kind):
    return [d for _, d in result.decisions if isinstance(d, kind)]


def type_at(result, alloc):
    topo = result.topology
    return topo.gpu_types[int(topo.node_type[alloc.nodes[0]])]


def test_registered():
    assert POLICIES.get("gavel-arena") is GavelArena
    assert "gavel-arena" in POLICIES.names()


@pytest.mark.parametrize("field, value", [
    ("round_s", 0), ("round_s", 4000), ("restart_s_per_gpu", -1), ("restart_cap_s", float("nan")),
    ("max_moves", -1), ("max_moves", 2.5), ("quantise_cost", 1), ("first_start_cost", "yes"),
    ("solve_limit", 0), ("solve_limit", "10"), ("dp_memory_check", None), ("search_nodes", -1),
    ("search_nodes", 1.5),
])
def test_bad_params_name_the_field(field, value):
    with pytest.raises(LoomInputError) as err:
        GavelArena(**{field: value})
    assert field in str(err.value) or field in str(getattr(err.value, "field", ""))


def test_admits_on_best_type_then_next_best_when_full():
    specs = [spec(j, 0, 4, 5000 if j == "a" else 20000, **MODEL) for j in "abcd"]
    _, result, jobs = run(three_types(), specs)
    starts = {d.job_id: type_at(result, d.allocation) for d in of_kind(result, Start)}
    # DP estimates: A100 > A40 > A10; the MIP fills by total capacity, the 4th waits
    assert starts["a"] == "A100-40GB" and starts["b"] == "A40" and starts["c"] == "A10"
    assert jobs["a"].first_start == jobs["b"].first_start == jobs["c"].first_start == 0.0
    assert jobs["d"].first_start is not None and jobs["d"].first_start > jobs["a"].end_time - 1e-6
    assert all(d.allocation.total == 4 for d in of_kind(result, Start))
    assert starts["d"] == "A100-40GB"  # equal jobs: every assignment ties, so nobody is moved
    assert "MIP" not in "".join(d.reason for d in of_kind(result, Migrate))
    assert not of_kind(result, Preempt) and not of_kind(result, Resize)


@pytest.mark.parametrize("search_nodes", [20_000, 0])  # the exact move search; CP-SAT alone
@pytest.mark.parametrize("max_moves, expect", [(3, 3), (10, 5), (0, 0)])
def test_at_most_max_moves_type_changes_per_fit(max_moves, expect, search_nodes):
    a100 = ("A100-40GB",)
    specs = [spec("x", 0, 8, 900, gpu_types=a100, **MODEL)]  # fills the A100s
    specs += [spec(f"j{i}", 0, 1, 50000, **MODEL) for i in range(5)]  # so these go to A10
    specs += [spec("y", 1100, 1, 50000, gpu_types=("A10",), **MODEL)]  # x has ended: its fit moves jobs
    policy, result, jobs = run(typed(("a100-000", "A100-40GB", 8), ("a10-000", "A10", 8)), specs,
                               max_moves=max_moves, search_nodes=search_nodes)
    moves = [d for d in of_kind(result, Migrate) if "by the MIP" in d.reason]
    assert len(moves) == expect
    assert all(type_at(result, d.allocation) == "A100-40GB" for d in moves)
    assert sum(policy.believed.get(f"j{i}") == "A100-40GB" for i in range(5)) in (expect, 0)
    assert jobs["y"].first_start == pytest.approx(1200.0)
    assert (policy.cp_sat_solves > 0) == (search_nodes == 0)


def test_job_no_type_can_run_is_dropped():
    specs = [spec("ok", 0, 2, 100, **MODEL), spec("huge", 0, 1, 100, model="gpt3-175b", batch_size=32),
             spec("huge2", 0, 2, 100, model="gpt3-175b", batch_size=32)]
    policy, _, jobs = run(three_types(), specs)
    assert set(policy.dropped) == {"huge", "huge2"}  # best plan throughput 0 on every type
    assert jobs["huge"].first_start is None and jobs["huge2"].first_start is None
    assert jobs["ok"].end_time is not None


def test_waiting_jobs_retried_only_after_a_completion():
    specs = [spec("a", 0, 8, 1000), spec("b", 10, 4, 500), spec("c", 700, 2, 500)]
    policy, _, jobs = run(one_node(), specs, first_start_cost=False)
    assert jobs["a"].end_time == pytest.approx(1000.0)
    # b fails at 300, c fails at 900 (b is not retried then), a ends, both start at 1200
    assert jobs["b"].first_start == pytest.approx(1200.0) and jobs["c"].first_start == pytest.approx(1200.0)
    assert policy.solves == 5


@pytest.mark.parametrize("c_type, c_start", [(None, 3600.0), ("A100-80GB", 1200.0)])
def test_failed_retry_blocks_its_requested_type(c_type, c_start):
    # after a ends: b (8 GPUs: no room while a2 runs) is retried first and fails; c waits behind it
    # (until b has run) when both requested the same GPU type, else it starts in that same pass
    specs = [spec("a", 0, 4, 1000), spec("a2", 0, 4, 3000), spec("b", 10, 8, 500),
             spec("c", 20, 4, 500, gpu_type=c_type)]
    policy, _, jobs = run(one_node(), specs, first_start_cost=False)
    assert jobs["c"].first_start == pytest.approx(c_start)
    assert jobs["b"].first_start == pytest.approx(3000.0) and not policy.dropped  # a2 ended at 3000


def test_restart_cost_quantised_like_arena_and_plain():
    quantised, plain = GavelArena(), GavelArena(quantise_cost=False)
    assert [quantised.restart_cost(g) for g in (1, 2, 4, 16)] == [0, 0, 300, 300]
    assert [plain.restart_cost(g) for g in (1, 2, 4, 16)] == [150, 300, 600, 600]


@pytest.mark.parametrize("params, end", [({}, 1300.0), ({"quantise_cost": False}, 1600.0),
                                         ({"first_start_cost": False}, 1000.0)])
def test_start_cost_charged(params, end):
    policy, result, jobs = run(one_node(), [spec("a", 0, 8, 1000)], **params)
    assert jobs["a"].end_time == pytest.approx(end)
    assert [d.pause_s for d in of_kind(result, Migrate)] == ([] if end == 1000.0 else [end - 1000.0])
    assert policy.restarts == {"a": 1}


def test_move_pays_restart_cost():
    a100 = ("A100-40GB",)
    specs = [spec("x", 0, 4, 900, gpu_types=a100, **MODEL), spec("j", 0, 4, 50000, **MODEL),
             spec("y", 1100, 1, 500, gpu_types=("A10",), **MODEL)]
    policy, result, _ = run(typed(("a100-000", "A100-40GB", 4), ("a10-000", "A10", 8)), specs)
    (move,) = [d for d in of_kind(result, Migrate) if "by the MIP" in d.reason]
    assert move.job_id == "j" and move.pause_s == 300.0 and type_at(result, move.allocation) == "A100-40GB"
    assert policy.restarts["j"] == 2


@pytest.mark.parametrize("dp_memory_check", [True, False])
def test_arena_philly_first_40(dp_memory_check):
    specs = sorted(load_trace("arena-philly"), key=lambda s: s.submit_time)[:40]
    policy = GavelArena(dp_memory_check=dp_memory_check)
    result = Simulation(arena_1280(), specs, policy, FirstFit(), EstimatorSpeed()).run()
    started = [j for j in result.jobs if j.first_start is not None]
    assert not policy.dropped and all(j.end_time is not None for j in started)
    # with Arena's DP memory check, jobs whose plain DP fits no GPU type wait for ever (as in Arena)
    assert (len(started) < len(specs)) == dp_memory_check
    assert not of_kind(result, Preempt) and not of_kind(result, Resize)
    request = {s.job_id: s.gpus for s in specs}
    assert all(d.allocation.total == request[d.job_id] for d in of_kind(result, Start))


def test_dp_memory_check_like_arena_oom():
    topo = typed(("a100-000", "A100-40GB", 8), ("a40-000", "A40", 8), ("a10-000", "A10", 8))
    specs = [spec("mid", 0, 4, 1000, model="bert__2.6B", batch_size=256),
             spec("big", 0, 8, 1000, model="moe__10B", batch_size=256)]
    policy, result, jobs = run(topo, specs)
    # plain DP of bert 2.6B only fits a 48-GB A40; moe 10B fits nowhere: admitted, never placed, waits
    assert [type_at(result, d.allocation) for d in of_kind(result, Start)] == ["A40"]
    assert jobs["big"].first_start is None and not policy.dropped
    policy, result, jobs = run(topo, specs, dp_memory_check=False)
    assert type_at(result, next(d for d in of_kind(result, Start) if d.job_id == "mid").allocation) != "A40"
    assert jobs["big"].end_time is not None


def test_proofs_skip_searches_without_changing_a_decision(monkeypatch):
    specs = sorted(load_trace("arena-philly"), key=lambda s: s.submit_time)[:150]

    def decisions():
        policy = GavelArena()
        result = Simulation(arena_1280(), specs, policy, FirstFit(), EstimatorSpeed()).run()
        return policy, [(t, repr(d)) for t, d in result.decisions]
    with_proofs, expected = decisions()
    assert with_proofs.proofs.answered > 0
    monkeypatch.setattr(NoGainProofs, "_settled", lambda *a: None)
    searched, got = decisions()
    assert searched.proofs.answered == 0 and got == expected
