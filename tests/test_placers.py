import numpy as np
import pytest

from loom.core.protocols import PLACERS
from loom.hardware.state import Allocation, ClusterState
from loom.workload.job import JobSpec

SPEC = JobSpec("j", 0.0, 1, 1.0)


def occupy(state: ClusterState, used: dict[int, int]) -> None:
    for node, gpus in used.items():
        state.allocate(Allocation.single(node, gpus))


@pytest.mark.parametrize("name", ["first-fit", "best-fit", "gpu-packing"])
def test_gang_all_or_nothing_and_exact_count(name, small_clos):
    placer = PLACERS.get(name)()
    state = ClusterState(small_clos)
    occupy(state, {n: 5 for n in range(8)})  # 3 free per node, 24 total
    alloc = placer.place(SPEC, 20, state)
    assert alloc is not None and alloc.total == 20
    assert all(state.free[n] >= g for n, g in zip(alloc.nodes, alloc.gpus))
    assert placer.place(SPEC, 25, state) is None


def test_best_fit_picks_tightest_node(small_clos):
    state = ClusterState(small_clos)
    occupy(state, {0: 2, 3: 6, 5: 4})
    alloc = PLACERS.get("best-fit")().place(SPEC, 2, state)
    assert alloc == Allocation.single(3, 2)


def test_first_fit_picks_first_node(small_clos):
    state = ClusterState(small_clos)
    occupy(state, {0: 7, 3: 6})
    assert PLACERS.get("first-fit")().place(SPEC, 2, state) == Allocation.single(1, 2)


def test_best_fit_multi_node_uses_fewest_nodes(small_clos):
    state = ClusterState(small_clos)
    occupy(state, {0: 4, 1: 6})  # free: 4, 2, 8, 8, 8, ...
    alloc = PLACERS.get("best-fit")().place(SPEC, 12, state)
    assert len(alloc.nodes) == 2 and alloc.total == 12
    assert 0 in alloc.nodes  # remainder of 4 goes to the node with exactly 4 free


def test_gpu_packing_keeps_multi_node_jobs_in_one_leaf(small_clos):
    # leaves hold 2 nodes; leaf0 = nodes 0,1 (partly busy), leaf1 = nodes 2,3 (free)
    state = ClusterState(small_clos)
    occupy(state, {0: 4})
    packing = PLACERS.get("gpu-packing")().place(SPEC, 16, state)
    leaves = {int(small_clos.switch_of[small_clos.leaf_tier, n]) for n in packing.nodes}
    assert len(packing.nodes) == 2 and len(leaves) == 1


def test_gpu_packing_single_node_prefers_fuller_leaf(small_clos):
    state = ClusterState(small_clos)
    occupy(state, {0: 4, 2: 4, 3: 6})  # node0 and node2 both have 4 free; leaf of node2 is fuller
    alloc = PLACERS.get("gpu-packing")().place(SPEC, 4, state)
    assert alloc == Allocation.single(2, 4)


@pytest.mark.parametrize("name", ["first-fit", "best-fit", "gpu-packing"])
def test_never_mixes_gpu_types_and_respects_constraint(name, hetero):
    placer = PLACERS.get(name)()
    state = ClusterState(hetero)
    alloc = placer.place(SPEC, 12, state)  # fits only as 8+4 across types, or 8+8 on A100
    types = {hetero.node_type[n] for n in alloc.nodes}
    assert len(types) == 1
    v100 = state.usable_mask(gpu_type="V100")
    alloc = placer.place(SPEC, 8, state, v100)
    assert {hetero.node_names[n] for n in alloc.nodes} == {"v0", "v1"}
    assert placer.place(SPEC, 9, state, v100) is None


@pytest.mark.parametrize("name", ["first-fit", "best-fit", "gpu-packing"])
def test_respects_allowed_mask(name, small_clos):
    state = ClusterState(small_clos)
    allowed = np.zeros(small_clos.num_nodes, dtype=bool)
    allowed[[6, 7]] = True
    alloc = PLACERS.get(name)().place(SPEC, 10, state, allowed)
    assert set(alloc.nodes) == {6, 7}
