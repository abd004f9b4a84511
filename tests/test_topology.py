import numpy as np
import pytest

from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.clusters import load_cluster
from loom.hardware.state import Allocation, AllocationError, ClusterState
from loom.hardware.topology import NodeDef, Tier, Topology


def test_clos_spreads_nodes_evenly_and_names_sort_physically():
    topo = clos("x", minipods=3, nodes=18, gpus_per_node=8)
    per_pod = np.bincount(topo.switch_of[topo.minipod_tier])
    assert per_pod.tolist() == [6, 6, 6]
    assert list(topo.node_names) == sorted(topo.node_names)
    assert topo.total_gpus == 144


def test_clos_rejects_minipods_over_128_nodes():
    with pytest.raises(LoomInputError, match="128"):
        clos("x", minipods=1, nodes=129)


def test_switch_names_are_scoped_by_parent():
    tiers = (Tier("spine"), Tier("leaf"))
    nodes = [NodeDef("a", ("s0", "l0"), "H100", 8), NodeDef("b", ("s1", "l0"), "H100", 8)]
    topo = Topology.build("t", tiers, nodes)
    assert topo.num_switches(1) == 2  # same leaf name under two spines = two switches
    assert topo.switches_spanned([0, 1]) == (2, 2)


def test_duplicate_node_and_bad_path_are_user_errors():
    tiers = (Tier("leaf"),)
    with pytest.raises(LoomInputError, match="twice"):
        Topology.build("t", tiers, [NodeDef("a", ("l",), "H100", 8)] * 2)
    with pytest.raises(LoomInputError, match="levels"):
        Topology.build("t", tiers, [NodeDef("a", ("s", "l"), "H100", 8)])


def test_named_clusters():
    philly = load_cluster("philly")
    assert philly.num_nodes == 552
    assert philly.gpus_by_type() == {"P100": (321, 642), "P40": (231, 1848)}
    assert load_cluster("arnold-ii").num_switches(1) == 5
    assert load_cluster("arnold-iii").num_nodes == 1019


def test_state_tracks_free_gpus_and_switch_aggregates(small_clos):
    state = ClusterState(small_clos)
    state.allocate(Allocation((0, 5), (8, 3)))
    assert state.free_total == 64 - 11
    pods = state.switch_free(small_clos.minipod_tier)
    assert pods.tolist() == [24, 29]
    copy = state.copy()
    copy.allocate(Allocation.single(1, 8))
    assert state.free[1] == 8  # the copy is independent
    with pytest.raises(AllocationError):
        state.allocate(Allocation.single(0, 1))
    state.release(Allocation((0, 5), (8, 3)))
    assert state.free_total == 64


def test_failed_and_reserved_nodes(small_clos):
    state = ClusterState(small_clos)
    state.fail_node(2)
    assert state.free[2] == 0 and state.free_total == 56
    state.repair_node(2)
    assert state.free_total == 64
    state.reserve([0, 1], reservation=7)
    mask = state.usable_mask()
    assert not mask[0] and not mask[1] and mask[2]
    assert state.usable_mask(reservation=7)[0]
    state.unreserve(7)
    assert state.usable_mask() is None


def test_unknown_gpu_type_is_a_clear_error():
    with pytest.raises(LoomInputError, match="unknown GPU type 'A100-80G'.*did you mean A100-80GB"):
        Topology.build("t", (Tier("leaf"),), [NodeDef("a", ("l",), "A100-80G", 8)], source="my.yaml")
