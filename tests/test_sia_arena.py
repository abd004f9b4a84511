"""sia-arena (Arena's Sia baseline): registration, params, no preemption or resizing,
waiting when full, round grid, restart costs, type moves, a short arena run."""

from __future__ import annotations

import pytest

from loom.core.decisions import Migrate, Preempt, Resize, Resume, Start
from loom.core.protocols import POLICIES
from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.clusters import arena_1280
from loom.hardware.importers._common import INVENTORY_TIERS, group_inventory
from loom.hardware.topology import Topology
from loom.placement.first_fit import FirstFit
from loom.policies.sia_arena import SiaArena
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.workload.job import JobSpec
from loom.workload.loaders import load_trace


def one_node(gpus: int = 8):
    return clos("one", minipods=1, nodes=1, gpus_per_node=gpus, gpu_type="A100-80GB", nodes_per_leaf=1)


def three_types():
    rows = [("a100-000", "A100-40GB", 4), ("a40-000", "A40", 4), ("a10-000", "A10", 4)]
    return Topology.build("t3", INVENTORY_TIERS, group_inventory(rows), minipod_tier="pod")


def spec(jid, t, gpus, duration, **kw):
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, duration=duration, **kw)


def run(topo, specs, **params):
    policy = SiaArena(**params)
    result = Simulation(topo, specs, policy, FirstFit()).run()
    return policy, result, {j.job_id: j for j in result.jobs}


def of_kind(result, kind):
    return [d for _, d in result.decisions if isinstance(d, kind)]


def test_registered():
    assert POLICIES.get("sia-arena") is SiaArena
    assert "sia-arena" in POLICIES.names()


@pytest.mark.parametrize("field, value", [
    ("round_s", 0), ("round_s", 4000), ("restart_s_per_gpu", -1), ("restart_cap_s", float("nan")),
    ("max_gpus", 0), ("max_gpus", 2.5), ("max_moves", -1), ("quantise_cost", 1), ("first_start_cost", "yes"),
])
def test_bad_params_name_the_field(field, value):
    with pytest.raises(LoomInputError) as err:
        SiaArena(**{field: value})
    assert field in str(err.value) or field in str(getattr(err.value, "field", ""))


def test_restart_cost_quantised_like_arena_and_plain():
    quantised, plain = SiaArena(), SiaArena(quantise_cost=False)
    assert [quantised.restart_cost(g) for g in (1, 2, 4, 16)] == [0, 0, 300, 300]
    assert [plain.restart_cost(g) for g in (1, 2, 4, 16)] == [150, 300, 600, 600]
    assert SiaArena(round_s=100, restart_cap_s=1000).restart_cost(8) == 900  # cap 1000 → 9 rounds lost
    assert SiaArena(round_s=100, restart_s_per_gpu=125).restart_cost(2) == 200  # 250 → 2 rounds lost


@pytest.mark.parametrize("params, end", [({}, 1300.0), ({"quantise_cost": False}, 1600.0),
                                         ({"first_start_cost": False}, 1000.0)])
def test_first_start_cost(params, end):
    # one 8-GPU job alone: it takes all 8 GPUs (rate 1) and pays the start cost once
    _, result, jobs = run(one_node(), [spec("a", 0, 8, 1000)], **params)
    assert jobs["a"].end_time == pytest.approx(end)
    pauses = [d.pause_s for d in of_kind(result, Migrate)]
    assert pauses == ([] if end == 1000.0 else [end - 1000.0])


def test_takes_largest_power_of_two_ignoring_request():
    _, result, jobs = run(one_node(), [spec("a", 0, 1, 1000)], first_start_cost=False)
    (start,) = of_kind(result, Start)
    assert start.allocation.total == 8  # linear belief: more GPUs is always better
    assert jobs["a"].end_time == pytest.approx(125.0)  # trace semantics: rate = 8 / 1
    _, result, _ = run(one_node(), [spec("a", 0, 1, 1000)], max_gpus=2)
    assert of_kind(result, Start)[0].allocation.total == 2


def test_full_cluster_arrival_waits_for_a_departure_round():
    specs = [spec("a", 0, 8, 1000), spec("b", 10, 4, 500), spec("c", 700, 2, 500)]
    _, result, jobs = run(one_node(), specs, first_start_cost=False)
    assert jobs["a"].first_start == 0.0 and jobs["a"].end_time == pytest.approx(1000.0)
    # b and c wait; a ends at 1000, the restart trial runs at the next 300-s grid point (1200)
    assert jobs["b"].first_start == pytest.approx(1200.0)
    assert jobs["c"].first_start is not None and jobs["c"].first_start >= jobs["b"].end_time - 1e-6
    assert not of_kind(result, Preempt) and not of_kind(result, Resize) and not of_kind(result, Resume)


def test_never_preempts_or_resizes():
    specs = [spec(f"j{i}", 37.0 * i, 1 + i % 4, 400 + 90 * i) for i in range(25)]
    _, result, jobs = run(one_node(16), specs)
    assert not of_kind(result, Preempt) and not of_kind(result, Resize)
    sizes: dict[str, set[int]] = {}
    for d in [*of_kind(result, Start), *of_kind(result, Migrate)]:
        sizes.setdefault(d.job_id, set()).add(d.allocation.total)
    assert all(len(s) == 1 for s in sizes.values())  # each job keeps its GPU count for life
    assert all(j.end_time is not None and j.preemptions == 0 for j in jobs.values())


def test_moves_running_job_to_faster_type_when_another_is_placed():
    model = {"model": "bert__760M", "batch_size": 32}
    specs = [
        spec("a", 0, 4, 1000, gpu_types=("A100-40GB",), **model),
        spec("b", 10, 4, 20000, gpu_types=("A100-40GB", "A40"), **model),  # A100 full: lands on A40
        spec("d", 3000, 4, 1000, gpu_types=("A10",), **model),  # placing d lets b move to the freed A100
    ]
    policy, result, jobs = run(three_types(), specs, max_gpus=4)
    topo = result.topology
    moves = [d for d in of_kind(result, Migrate) if d.job_id == "b" and "moved" in d.reason]
    assert len(moves) == 1 and moves[0].pause_s == 300.0
    assert topo.gpu_types[int(topo.node_type[moves[0].allocation.nodes[0]])] == "A100-40GB"
    assert policy.restarts["b"] == 2 and jobs["b"].end_time is not None
    _, result, _ = run(three_types(), specs, max_gpus=4, max_moves=0)
    assert not [d for d in of_kind(result, Migrate) if "moved" in d.reason]


def test_arena_pai_first_40_finish():
    specs = sorted(load_trace("arena-pai"), key=lambda s: s.submit_time)[:40]
    policy = SiaArena()
    result = Simulation(arena_1280(), specs, policy, FirstFit(), EstimatorSpeed()).run()
    assert not policy.dropped and all(j.end_time is not None for j in result.jobs)
    assert not of_kind(result, Preempt) and not of_kind(result, Resize)
    starts = of_kind(result, Start)
    assert all(s.allocation.total in (1, 2, 4, 8, 16) for s in starts)
