"""Inputs of the Arnold placement benchmarks: baselines, occupancy, affinity."""

from __future__ import annotations

import numpy as np
import pytest

from loom.core.protocols import PLACERS
from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.clusters import load_cluster
from loom.hardware.state import Allocation, ClusterState
from loom.perf.model import ModelSpec
from loom.placement.arnold import baselines
from loom.placement.arnold.affinity import (
    affinity_for,
    load_affinity,
    parse_affinity,
    profile_with_estimator,
    ratios,
    volumes,
)
from loom.placement.arnold.baselines import (
    BASELINES,
    baseline_allocation,
    baseline_grid,
)
from loom.placement.arnold.problem import JobShape, free_nodes, minipod_of
from loom.placement.occupancy import busy_nodes, occupancy_summary, occupy
from loom.workload.job import JobSpec

SPEC = JobSpec("j", 0.0, 8, 1.0)


@pytest.fixture(scope="module")
def arnold_ii():
    return load_cluster("arnold-ii")


@pytest.fixture(scope="module")
def busy_ii(arnold_ii):
    return occupy(arnold_ii, 0.5, seed=0)


# ------------------------------------------------------------------ baselines
def test_baselines_registered():
    for name in BASELINES:
        assert name in PLACERS
        assert PLACERS.get(name)().name == name


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_takes_exactly_the_jobs_whole_free_nodes(name, busy_ii):
    state = busy_ii.copy()
    shape = JobShape(dp=24, tp=4, pp=8)  # 96 nodes
    free_before = set(free_nodes(state).tolist())
    alloc = baseline_allocation(name, shape, state, seed=3)
    assert alloc is not None
    assert len(alloc.nodes) == shape.nodes == len(set(alloc.nodes))
    assert set(alloc.nodes) <= free_before
    assert all(g == 8 for g in alloc.gpus)
    grid = baseline_grid(name, shape, state, seed=3)
    assert grid.shape == (shape.rows, shape.cols)
    assert sorted(grid.ravel().tolist()) == sorted(alloc.nodes)
    # default order: nodes sorted by name fill the matrix column by column
    names = [state.topology.node_names[n] for n in grid.T.ravel()]
    assert names == sorted(names)
    np.testing.assert_array_equal(grid, baseline_grid(name, shape, state, seed=3))


def test_random_fit_deterministic_per_seed(busy_ii):
    shape = JobShape(dp=8, tp=8, pp=4)
    a = baseline_grid("random-fit", shape, busy_ii, seed=1)
    np.testing.assert_array_equal(a, baseline_grid("random-fit", shape, busy_ii, seed=1))
    others = [baseline_grid("random-fit", shape, busy_ii, seed=s) for s in range(2, 6)]
    assert any(not np.array_equal(a, o) for o in others)


def test_baseline_none_when_too_few_free_nodes():
    topo = clos("t", minipods=2, nodes=8, gpus_per_node=8, gpu_type="H800", nodes_per_leaf=2)
    state = ClusterState(topo)
    state.allocate(Allocation.single(0, 1))  # node 0 no longer wholly free
    shape = JobShape(dp=8, tp=8, pp=1)  # 8 nodes
    for name in BASELINES:
        assert baseline_grid(name, shape, state) is None


def test_baseline_rejects_partial_nodes(monkeypatch, busy_ii):
    class Partial:
        name = "partial"

        def place(self, job, gpus, state, allowed=None):
            nodes = np.flatnonzero(allowed)[: gpus // 4]
            return Allocation(tuple(int(n) for n in nodes), (4,) * len(nodes))

    monkeypatch.setattr(baselines, "make_placer", lambda name, seed=0: Partial())
    with pytest.raises(LoomInputError, match="partial node") as info:
        baseline_grid("partial", JobShape(dp=2, tp=8, pp=2), busy_ii)
    assert info.value.field == "placer"


def test_random_fit_places_on_fitting_nodes(small_clos):
    state = ClusterState(small_clos)
    state.allocate(Allocation.single(0, 6))
    placer = PLACERS.get("random-fit")(seed=0)
    for _ in range(20):
        alloc = placer.place(SPEC, 4, state)
        assert len(alloc.nodes) == 1 and alloc.nodes[0] != 0
    alloc = placer.place(SPEC, 20, state)  # partial gang: exact count from free GPUs
    assert alloc.total == 20 and all(state.free[n] >= g for n, g in zip(alloc.nodes, alloc.gpus))
    assert placer.place(SPEC, 59, state) is None


# ------------------------------------------------------------------ topo-aware
@pytest.fixture
def pods():
    """2 minipods × 16 nodes, 4 nodes per leaf."""
    return clos("p", minipods=2, nodes=32, gpus_per_node=8, gpu_type="H800", nodes_per_leaf=4)


def _fill(state, nodes):
    for n in nodes:
        state.allocate(Allocation.single(n, 8))


def test_topo_aware_keeps_job_under_tightest_leaf(pods):
    state = ClusterState(pods)
    _fill(state, [0, 1, 4, 16, 17, 18])  # leaf0: 2 free, leaf1: 3 free, mp1/leaf0: 1 free
    alloc = PLACERS.get("topo-aware")().place(SPEC, 16, state)
    assert sorted(alloc.nodes) == [2, 3]  # the tightest leaf that holds 2 nodes
    alloc = PLACERS.get("topo-aware")().place(SPEC, 24, state)
    leaves = {int(pods.switch_of[pods.leaf_tier, n]) for n in alloc.nodes}
    assert len(leaves) == 1 and alloc.total == 24


def test_topo_aware_keeps_job_in_one_minipod(pods):
    state = ClusterState(pods)
    _fill(state, [0, 1, 2, 5, 9, 13])  # mp0: 10 free, spread; mp1: 16 free
    alloc = PLACERS.get("topo-aware")().place(SPEC, 80, state)  # 10 nodes: mp0 is the tightest fit
    pods_used = set(minipod_of(pods)[list(alloc.nodes)].tolist())
    assert pods_used == {0} and len(alloc.nodes) == 10
    alloc = PLACERS.get("topo-aware")().place(SPEC, 96, state)  # 12 nodes: only mp1 holds them
    assert set(minipod_of(pods)[list(alloc.nodes)].tolist()) == {1}
    # prefers fuller leaves: with 12 of 16 nodes in mp1, and all its leaves equal, 3 whole leaves
    assert len({int(pods.switch_of[pods.leaf_tier, n]) for n in alloc.nodes}) == 3


def test_topo_aware_spans_fewest_minipods_when_none_holds_it(arnold_ii):
    state = ClusterState(arnold_ii)
    grid = baseline_grid("topo-aware", JobShape(dp=24, tp=4, pp=8), state)  # 96 nodes > 88 per minipod
    assert len(set(minipod_of(arnold_ii)[grid].ravel().tolist())) == 2


def test_topo_aware_uses_masked_capacity(pods):
    state = ClusterState(pods)
    allowed = np.zeros(pods.num_nodes, dtype=bool)
    allowed[[3, 20, 21]] = True
    alloc = PLACERS.get("topo-aware")().place(SPEC, 16, state, allowed)
    assert sorted(alloc.nodes) == [20, 21]


# ------------------------------------------------------------------ occupancy
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5, 0.7, 1.0])
def test_occupancy_hits_target(arnold_ii, fraction):
    state = occupy(arnold_ii, fraction, seed=4)
    assert abs(busy_nodes(state).mean() - fraction) <= 0.01
    # whole-node jobs only: every node is either fully busy or fully free
    assert set(state.free.tolist()) <= {0, 8}


def test_occupancy_small_cluster_within_one_node():
    topo = load_cluster("arnold-i")
    for seed in range(3):
        assert abs(busy_nodes(occupy(topo, 0.3, seed)).sum() - round(0.3 * 18)) <= 1


def test_occupancy_deterministic_per_seed(arnold_ii):
    a, b, c = occupy(arnold_ii, 0.5, 7), occupy(arnold_ii, 0.5, 7), occupy(arnold_ii, 0.5, 8)
    np.testing.assert_array_equal(a.free, b.free)
    assert not np.array_equal(a.free, c.free)


def test_occupancy_fragments(busy_ii, arnold_ii):
    free = free_nodes(busy_ii)
    summary = occupancy_summary(busy_ii)
    assert len(summary) == 5 and abs(np.mean(list(summary.values())) - 0.5) < 0.05
    pods_with_free = set(minipod_of(arnold_ii)[free].tolist())
    assert len(pods_with_free) >= 3
    runs = 1 + int((np.diff(free) > 1).sum())  # contiguous stretches of free nodes
    assert runs >= 10
    assert free.min() < arnold_ii.num_nodes // 2 < free.max()


def test_occupancy_rejects_bad_fraction(arnold_ii):
    with pytest.raises(LoomInputError) as info:
        occupy(arnold_ii, 1.5, 0)
    assert info.value.field == "target_fraction"


# ------------------------------------------------------------------ affinity
def test_affinity_paper_points():
    entries = {e.name: e for e in load_affinity()}
    dense, moe = entries["arnold-24b-dense-h800"], entries["arnold-24b-moe-h800"]
    alpha, beta, entry = affinity_for("H800", dense.r1, dense.r2)
    assert (alpha, beta, entry.name) == (0.0, 1.0, dense.name)
    alpha, beta, entry = affinity_for("H800", moe.r1, moe.r2)
    assert entry.name == moe.name and alpha == pytest.approx(0.3) and beta == pytest.approx(0.7)
    assert entries["arnold-7b-dense-l20"].alpha > 0.5 > entries["arnold-14b-dense-l20"].alpha
    assert any(e.source.startswith("loom.perf estimator") for e in entries.values())


def test_affinity_nearest_neighbour_and_gpu_type():
    text = """entries:
  - {name: a, gpu_type: H800, r1: 1.0, r2: 10.0, j_dp: 0.0, j_pp: 0.02, source: t}
  - {name: b, gpu_type: H800, r1: 1.0, r2: 100.0, j_dp: 0.03, j_pp: 0.01, source: t}
  - {name: c, gpu_type: L20, r1: 1.0, r2: 30.0, j_dp: 0.0, j_pp: 0.0, source: t}
"""
    entries = parse_affinity(text, "mem.yaml")
    assert affinity_for("H800", 1.1, 12.0, entries)[2].name == "a"
    assert affinity_for("H800", 0.9, 50.0, entries)[2].name == "b"  # log scale: 50 is nearer 100 than 10
    alpha, _, entry = affinity_for("H800", 1.0, 100.0, entries)
    assert entry.name == "b" and alpha == pytest.approx(0.75)
    alpha, beta, entry = affinity_for("L20", 5.0, 1000.0, entries)  # same type wins over distance
    assert entry.name == "c" and alpha == beta == 0.5  # both gains 0
    assert affinity_for("A100-80GB", 1.0, 25.0, entries)[2].name == "c"  # unknown type: all entries


@pytest.mark.parametrize(
    "entry, field",
    [
        ("{name: a, gpu_type: H800, r1: 1.0, r2: 2.0, j_dp: 0.1, source: t}", "entries[0].j_pp"),
        ("{name: a, gpu_type: H800, r1: -1.0, r2: 2.0, j_dp: 0.1, j_pp: 0, source: t}", "entries[0].r1"),
        ("{name: a, gpu_type: H800, r1: 1.0, r2: x, j_dp: 0.1, j_pp: 0, source: t}", "entries[0].r2"),
        ("{name: a, gpu_type: H800, r1: 1.0, r2: 2.0, j_dp: -0.1, j_pp: 0, source: t}", "entries[0].j_dp"),
        ("{name: a, gpu_type: H800, r1: 1.0, r2: 2.0, j_dp: 0, j_pp: 0, source: t, alpah: 1}", "entries[0].alpah"),
        ("{name: '', gpu_type: H800, r1: 1.0, r2: 2.0, j_dp: 0, j_pp: 0, source: t}", "entries[0].name"),
    ],
)
def test_bad_affinity_yaml_names_field(entry, field, tmp_path):
    path = tmp_path / "aff.yaml"
    path.write_text(f"entries:\n  - {entry}\n")
    with pytest.raises(LoomInputError) as info:
        load_affinity(path)
    assert info.value.field == field and info.value.source == str(path)
    assert str(path) in str(info.value) and field in str(info.value)


def test_bad_affinity_yaml_structure(tmp_path):
    path = tmp_path / "aff.yaml"
    path.write_text("entries: [\n")
    with pytest.raises(LoomInputError, match="invalid YAML"):
        load_affinity(path)
    path.write_text("- a\n")
    with pytest.raises(LoomInputError) as info:
        load_affinity(path)
    assert info.value.field == "entries"


SMALL = ModelSpec("tiny", layers=4, hidden=8, heads=2, seq_len=16, vocab=32)


def test_volumes_match_hand_computation():
    # h=8, V=32, s=16, l=4, GPT layer (gelu, biases, layernorm, learned positions, tied)
    # params: embedding V·h + s·h = 384; final norm 2h = 16; layer 12h²+13h + 4h = 872 → total 3888
    v_w, v_d, v_p = volumes(SMALL, tp=2, pp=2, micro_batch=3)
    assert v_w == 3888 / 4
    # Eq. 12: (h·(V+s) + (l/pp)·(4h²+2h + 8h²+7h)) / tp = (384 + 2·840) / 2
    assert v_d == (8 * (32 + 16) + 2 * (4 * 64 + 16 + 8 * 64 + 56)) / 2 == 1032
    assert v_p == 2 * 3 * 16 * 8 == 768
    r1, r2 = ratios(SMALL, tp=2, pp=2, micro_batch=3)
    assert r1 == pytest.approx(3 * 972 / (1032 + 768)) and r2 == pytest.approx(1032 / 768)
    # bytes per element scale the two volumes separately
    assert volumes(SMALL, 2, 2, 3, grad_bytes=4, activation_bytes=1)[1:] == (4 * 1032, 768)


def test_volumes_reject_bad_plan():
    with pytest.raises(LoomInputError) as info:
        volumes(SMALL, tp=0, pp=1, micro_batch=1)
    assert info.value.field == "tp"


def test_profile_with_estimator_entry():
    entry = profile_with_estimator("megatron-7.5b", "H800", tp=4, pp=2, dp=16)
    assert entry.j_dp >= 0 and entry.j_pp >= 0 and 0 <= entry.alpha <= 1
    assert (entry.r1, entry.r2) == pytest.approx(ratios(entry_model("megatron-7.5b"), 4, 2, 1, 2, 2))
    assert entry.source.startswith("loom.perf estimator, ")
    parse_affinity("entries:\n  - " + repr(entry.as_dict()).replace("'", '"') + "\n", "roundtrip")


def entry_model(name):
    from loom.perf import preset

    return preset(name)
