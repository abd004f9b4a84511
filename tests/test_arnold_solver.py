"""Arnold placement: the proxy MIP + local search, and the exact Eq. 2 reference."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.placement.arnold.exact import exact_place
from loom.placement.arnold.problem import (
    JobShape,
    default_grid,
    minipod_of,
    rank_nodes,
    score,
)
from loom.placement.arnold.solver import arnold_place

ALPHAS = [0.0, 0.3, 0.5, 0.7, 1.0]


def check_valid(res, shape, topo, free, alpha):
    grid = res.grid
    assert grid.shape == (shape.rows, shape.cols)
    nodes = grid.ravel().tolist()
    assert len(set(nodes)) == shape.nodes  # distinct nodes, exactly the job's count
    assert set(nodes) <= {int(n) for n in free}  # only free nodes
    ranks = rank_nodes(grid, shape)
    assert len(ranks) == shape.gpus  # every rank exactly once
    assert Counter(ranks) == {n: shape.gpus_per_node for n in nodes}  # each node holds G ranks
    assert res.score == score(grid, topo, alpha)  # never solver variables


@st.composite
def instances(draw):
    minipods = draw(st.integers(2, 5))
    nodes = draw(st.integers(max(4, minipods), 40))
    topo = clos("h", minipods=minipods, nodes=nodes, nodes_per_leaf=4)
    mask = draw(st.lists(st.booleans(), min_size=nodes, max_size=nodes))
    free = np.flatnonzero(mask)
    tp = draw(st.sampled_from([2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    max_rows = len(free) // pp
    rows = draw(st.integers(1, max(1, min(max_rows, 10))))
    shape = JobShape(rows * 8 // tp, tp, pp)
    alpha = draw(st.sampled_from(ALPHAS))
    return topo, free, shape, alpha


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_placement_is_valid(inst):
    topo, free, shape, alpha = inst
    if len(free) < shape.nodes:
        with pytest.raises(LoomInputError, match="whole nodes"):
            arnold_place(shape, topo, free, alpha, time_limit_s=0.2)
        return
    res = arnold_place(shape, topo, free, alpha, time_limit_s=0.2)
    check_valid(res, topo=topo, shape=shape, free=free, alpha=alpha)
    assert res.unit == ("pp" if 1 - alpha >= alpha else "dp")
    # never worse than the default order (on its own nodes, and on the first free ones)
    first = sorted(free.tolist(), key=lambda n: topo.node_names[n])[: shape.nodes]
    for base in (default_grid(shape, res.grid.ravel(), topo), default_grid(shape, first, topo)):
        assert res.score.weighted_spread <= score(base, topo, alpha).weighted_spread + 1e-9


def test_alpha_zero_keeps_pp_groups_in_one_minipod():
    topo = clos("c", minipods=4, nodes=64)
    shape = JobShape(16, 8, 4)  # 16 rows × 4 nodes
    res = arnold_place(shape, topo, np.arange(64), 0.0)
    assert res.score.pp_max_spread == 1 and res.unit == "pp" and res.optimal


def test_alpha_one_minimises_dp_spread():
    topo = clos("c", minipods=4, nodes=64)
    shape = JobShape(16, 8, 4)  # columns of 16 nodes fit one minipod each
    res = arnold_place(shape, topo, np.arange(64), 1.0)
    assert res.unit == "dp" and res.score.dp_max_spread == 1
    # and with partial occupancy it matches the exact DP-spread optimum
    rng = np.random.default_rng(3)
    free = np.sort(rng.choice(64, 40, replace=False))
    res = arnold_place(JobShape(8, 8, 2), topo, free, 1.0)
    ref = exact_place(JobShape(8, 8, 2), topo, free, 1.0)
    assert res.score.dp_max_spread == ref.score.dp_max_spread


SETTING_I = clos("i", minipods=3, nodes=18)


@pytest.mark.parametrize("seed", range(6))
def test_matches_exact_on_setting_i(seed):
    shape = JobShape(12, 4, 2)  # 12 nodes
    rng = np.random.default_rng(seed)
    busy = int(rng.integers(0, 7))
    free = np.sort(rng.choice(18, 18 - busy, replace=False))
    for alpha in ALPHAS:
        res = arnold_place(shape, SETTING_I, free, alpha)
        ref = exact_place(shape, SETTING_I, free, alpha)
        assert ref.optimal
        check_valid(ref, shape, SETTING_I, free, alpha)
        assert res.score.weighted_spread == pytest.approx(ref.score.weighted_spread), (seed, alpha)


def test_infeasible_requests_are_clear():
    topo = clos("c", minipods=2, nodes=8)
    with pytest.raises(LoomInputError, match="only 3 are free"):
        arnold_place(JobShape(8, 8, 1), topo, np.arange(3), 0.3)
    with pytest.raises(LoomInputError, match="exceeds") as err:
        JobShape(4, 16, 1)
    assert err.value.field == "tp"
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(LoomInputError) as err:
            arnold_place(JobShape(8, 8, 1), topo, np.arange(8), bad)
        assert err.value.field == "alpha"


def test_timeout_still_returns_valid_placement():
    topo = clos("big", minipods=16, nodes=2048)
    rng = np.random.default_rng(0)
    free = np.sort(rng.choice(2048, 1500, replace=False))
    shape = JobShape(150, 8, 8)
    res = arnold_place(shape, topo, free, 0.3, time_limit_s=1e-3)
    check_valid(res, shape, topo, free, 0.3)
    assert not res.optimal or res.status == "optimal"
    if not res.optimal:
        assert "time limit" in res.status or "fallback" in res.status


def test_deterministic_and_leaf_grouped():
    topo = clos("c", minipods=4, nodes=128, nodes_per_leaf=8)
    shape = JobShape(16, 8, 4)
    a = arnold_place(shape, topo, np.arange(128), 0.3)
    b = arnold_place(shape, topo, np.arange(128), 0.3)
    assert np.array_equal(a.grid, b.grid)
    # 64 nodes on 8-node leaves: leaf-grouped choice uses the minimum of 8 leaves
    assert a.score.leaves_used == 8
    pods = minipod_of(topo)[a.grid]
    assert len(np.unique(pods)) == a.score.minipods_used
