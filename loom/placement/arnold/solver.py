"""Arnold's placement MIP (Eq. 4–10, DESIGN.md §4) solved with CP-SAT.

Pipeline of `arnold_place`:

1. scheduling unit = PP groups (grid rows, ``cols`` nodes each) when
   β = 1 − α ≥ α, else DP groups (grid columns, ``rows`` nodes each);
2. the bin-packing proxy in integer node counts ``n_ij`` (unit i, minipod j):
   ``minimise w_other·Σ_j y_j + w_unit·T`` with unit PP → (w_other, w_unit) =
   (α, β) and unit DP → (β, α); ties broken towards fewer minipods;
3. contiguous rank assignment: each unit's nodes of a minipod are consecutive,
   segments ordered by one global minipod order so the other kind of group
   lines up across units; concrete nodes grouped by leaf;
4. optional local search on the true Eq. 2 (`local_search.improve`).

The returned score is always `problem.score` of the final grid.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from loom.errors import LoomInputError
from loom.hardware.topology import Topology
from loom.placement.arnold.local_search import assign_nodes, grid_key, improve
from loom.placement.arnold.problem import (
    JobShape,
    SpreadScore,
    check_capacity,
    default_grid,
    minipod_of,
    score,
)

SCALE = 1000  # objective weights are integers for CP-SAT
SMALL_JOB_NODES = 256  # local search from every start layout up to this job size
LS_TIME_S = 0.3  # local-search cap (s); well under the targets of DESIGN.md §4


@dataclass(frozen=True)
class ArnoldResult:
    grid: np.ndarray
    score: SpreadScore
    unit: str  # "pp" | "dp"
    alpha: float
    optimal: bool  # CP-SAT proved its model (the proxy, or Eq. 2 for exact_place) optimal
    status: str
    solve_s: float  # wall time of the whole call
    mip_objective: float


def validate_alpha(alpha: float) -> float:
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise LoomInputError(f"must be a number in [0, 1], got {alpha!r}", field="alpha") from None
    if isinstance(alpha, bool) or not 0.0 <= value <= 1.0:
        raise LoomInputError(f"must be in [0, 1], got {alpha!r}", field="alpha")
    return value


def prepare(shape: JobShape, topology: Topology, free: np.ndarray, alpha: float) -> tuple[float, np.ndarray, np.ndarray]:
    """Validated α, sorted unique free nodes, free-node capacity per minipod."""
    alpha = validate_alpha(alpha)
    free = np.unique(np.asarray(free, dtype=np.int64).ravel())
    if len(free) and (free[0] < 0 or free[-1] >= topology.num_nodes):
        raise LoomInputError(f"free node indices must be in [0, {topology.num_nodes})", field="free")
    check_capacity(shape, free, topology)
    pods = minipod_of(topology)
    cap = np.bincount(pods[free], minlength=topology.num_switches(topology.minipod_tier))
    return alpha, free, cap


# ----------------------------------------------------------------- greedy
def _whole_counts(n_units: int, size: int, cap: np.ndarray) -> np.ndarray:
    """Whole units into the minipods that hold the most whole units first (few
    minipods at spread 1); units left over are split sequentially."""
    rem = cap.astype(np.int64).copy()
    order = sorted(range(len(cap)), key=lambda j: (-(cap[j] // size), -cap[j], j))
    n = np.zeros((n_units, len(cap)), dtype=np.int64)
    i = 0
    for j in order:
        while i < n_units and rem[j] >= size:
            n[i, j] = size
            rem[j] -= size
            i += 1
    k = 0
    order = sorted(range(len(cap)), key=lambda j: (-rem[j], j))
    for u in range(i, n_units):
        need = size
        while need:
            j = order[k]
            take = min(need, rem[j])
            n[u, j] += take
            rem[j] -= take
            need -= take
            if rem[j] == 0:
                k += 1
    return n


def _min_pods(values: np.ndarray, need: int) -> int | None:
    """Fewest entries of `values` summing to ≥ need (None if impossible)."""
    acc = 0
    for k, v in enumerate(sorted(values.tolist(), reverse=True), start=1):
        acc += v
        if acc >= need:
            return k
    return None if need > 0 else 0


def _greedy_counts(n_units: int, size: int, cap: np.ndarray, whole_first: bool) -> np.ndarray:
    """Units to minipods, those with most free nodes first.

    Sequential (whole_first=False): fill minipods in order of free nodes,
    spilling a unit over to the next one (few minipods used). Whole-first: put a
    unit whole into the tightest minipod it fits, else split it over the
    minipods with most room (few units split)."""
    rem = cap.astype(np.int64).copy()
    order = sorted(range(len(cap)), key=lambda j: (-cap[j], j))
    n = np.zeros((n_units, len(cap)), dtype=np.int64)
    k = 0
    for i in range(n_units):
        need = size
        if whole_first:
            fits = [j for j in order if rem[j] >= need]
            if fits:
                j = min(fits, key=lambda j: (rem[j], order.index(j)))
                n[i, j] = need
                rem[j] -= need
                continue
            for j in sorted(order, key=lambda j: (-rem[j], order.index(j))):
                take = min(need, rem[j])
                if take:
                    n[i, j] += take
                    rem[j] -= take
                    need -= take
                if need == 0:
                    break
        else:
            while need:
                j = order[k]
                take = min(need, rem[j])
                n[i, j] += take
                rem[j] -= take
                need -= take
                if rem[j] == 0:
                    k += 1
    return n


def _proxy(n: np.ndarray, w_other: int, w_unit: int) -> tuple[int, int]:
    used = int((n.sum(axis=0) > 0).sum())
    t = int((n > 0).sum(axis=1).max())
    return w_other * used + w_unit * t, used


# ----------------------------------------------------------------- CP-SAT
def _solve_counts(n_units: int, size: int, cap: np.ndarray, w_other: int, w_unit: int, hint: np.ndarray,
                  time_limit_s: float, seed: int) -> tuple[np.ndarray | None, str, bool]:
    from ortools.sat.python import cp_model

    pods = [j for j in sorted(range(len(cap)), key=lambda j: (-cap[j], j)) if cap[j] > 0]
    J = len(pods)
    m = cp_model.CpModel()
    n = [[m.NewIntVar(0, int(min(size, cap[j])), f"n{i}_{j}") for j in pods] for i in range(n_units)]
    s = [[m.NewBoolVar(f"s{i}_{j}") for j in pods] for i in range(n_units)]
    y = [m.NewBoolVar(f"y{j}") for j in pods]
    T = m.NewIntVar(1, min(J, size), "T")
    for i in range(n_units):
        m.Add(sum(s[i]) <= T)  # Eq. max spread
        m.Add(sum(n[i]) == size)  # allocation
        for k in range(J):
            m.Add(n[i][k] <= size * s[i][k])  # selection
            m.Add(n[i][k] >= s[i][k])  # s means "uses"
            m.AddImplication(s[i][k], y[k])
    for k, j in enumerate(pods):
        m.Add(sum(n[i][k] for i in range(n_units)) <= int(cap[j]) * y[k])  # capacity
    m.Add(sum(int(cap[j]) * y[k] for k, j in enumerate(pods)) >= n_units * size)  # redundant cut
    # Redundant bounds on minipods used: at least the fewest minipods whose free
    # nodes hold the job; and with T = 1 every unit is whole inside one minipod,
    # so at least the fewest minipods whose whole-unit slots ⌊c_j/|unit|⌋ hold
    # all units (T = 1 is impossible if no such set exists).
    capv = np.asarray([int(cap[j]) for j in pods])
    m.Add(sum(y) >= _min_pods(capv, n_units * size))
    k_whole = _min_pods(capv // size, n_units)
    t1 = m.NewBoolVar("T_is_1")
    m.Add(T == 1).OnlyEnforceIf(t1)
    m.Add(T >= 2).OnlyEnforceIf(t1.Not())
    k_cap = _min_pods(capv, n_units * size)
    if k_whole is None:
        m.Add(t1 == 0)
        bound = w_other * k_cap + w_unit * 2
    else:
        m.Add(sum(y) >= k_whole).OnlyEnforceIf(t1)
        bound = min(w_other * k_whole + w_unit, w_other * k_cap + w_unit * 2)
    # the same case split as a bound on the objective, which the LP misses
    m.Add(w_other * sum(y) + w_unit * T >= bound)
    # Symmetry breaking. All units have the same size and enter every constraint
    # and the objective identically, so permuting units (rows of n, s together)
    # maps any solution to one of equal cost; sorting the rows of any optimal
    # solution lexicographically (descending, minipods in the order `pods`)
    # gives an optimal solution with n_i ≥lex n_{i+1}. We impose the weaker,
    # implied order on the first K coordinates through one linear key per unit,
    # Σ_{k<K} n_ik·(size+1)^(K−1−k) ≥ the same for unit i+1 (mixed radix: key
    # order = lex order of the prefix), with K small enough for ~2^40 keys.
    # Since the sorted optimum satisfies it, at least one optimum remains.
    K = 0
    while K < J and (size + 1) ** (K + 1) <= 2**40:
        K += 1
    if n_units > 1 and K:
        coef = [(size + 1) ** (K - 1 - k) for k in range(K)]
        keys = [sum(coef[k] * n[i][k] for k in range(K)) for i in range(n_units)]
        for i in range(n_units - 1):
            m.Add(keys[i] >= keys[i + 1])
    # lexicographic tie-break: fewer minipods used among equal-proxy solutions
    big = J + 1
    objective = big * (w_other * sum(y) + w_unit * T) + sum(y)
    # The case split once more, on the full objective: when w_other = 0 (α = 0
    # with PP units) the bound above says nothing about Σy, and proving the
    # tie-break optimal turned into a bin-packing proof that timed out.
    if k_whole is None:
        m.Add(objective >= big * bound + k_cap)
    else:
        m.Add(objective >= min(big * (w_other * k_whole + w_unit) + k_whole,
                               big * (w_other * k_cap + w_unit * 2) + k_cap))
    m.Minimize(objective)
    # hint: the greedy solution, rows sorted to satisfy the symmetry breaking
    h = hint[:, pods]
    h = h[np.lexsort([-h[:, k] for k in reversed(range(J))])] if J else h
    for i in range(n_units):
        for k in range(J):
            m.AddHint(n[i][k], int(h[i, k]))
            m.AddHint(s[i][k], int(h[i, k] > 0))
    for k in range(J):
        m.AddHint(y[k], int(h[:, k].sum() > 0))
    m.AddHint(T, int((h > 0).sum(axis=1).max()))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(float(time_limit_s), 1e-4)
    solver.parameters.num_workers = 2
    solver.parameters.random_seed = int(seed)
    status = solver.Solve(m)
    if status == cp_model.OPTIMAL:
        label, proved = "optimal", True
    elif status == cp_model.FEASIBLE:
        label, proved = "time limit: best incumbent", False
    else:
        return None, f"no CP-SAT solution ({solver.StatusName(status).lower()})", False
    out = np.zeros((n_units, len(cap)), dtype=np.int64)
    for i in range(n_units):
        for k, j in enumerate(pods):
            out[i, j] = solver.Value(n[i][k])
    return out, label, proved


# ----------------------------------------------------------- counts → grid
def labels_from_counts(n: np.ndarray, shape: JobShape, unit: str) -> np.ndarray:
    """Minipod label per cell: each unit's nodes of a minipod are consecutive,
    segments in one global minipod order (most used first) so the other kind of
    group meets the same minipods at the same positions across units."""
    total = n.sum(axis=0)
    order = sorted(range(n.shape[1]), key=lambda j: (-total[j], j))
    lines = []
    for i in range(n.shape[0]):
        line = [j for j in order for _ in range(int(n[i, j]))]
        lines.append(line)
    lab = np.asarray(lines, dtype=np.int64)
    return lab if unit == "pp" else lab.T.copy()


def aligned_labels_from_counts(n: np.ndarray, shape: JobShape, unit: str) -> np.ndarray:
    """Alternative layout: units in order, each unit's cells placed so that the
    other kind of group (the positions) meets as few minipods as possible —
    a cell of minipod j goes to the free position whose group already holds the
    most nodes of j, else to the position group with the fewest minipods."""
    L = n.shape[0]
    width = int(n[0].sum()) if L else 0
    total = n.sum(axis=0)
    order = sorted(range(n.shape[1]), key=lambda j: (-total[j], j))
    lab = np.empty((L, width), dtype=np.int64)
    pos_cnt: list[dict[int, int]] = [{} for _ in range(width)]
    for i in range(L):
        open_pos = list(range(width))
        for j in sorted(order, key=lambda j: (-int(n[i, j]), order.index(j))):
            for _ in range(int(n[i, j])):
                p = max(open_pos, key=lambda q: (pos_cnt[q].get(j, 0), -len(pos_cnt[q]), -q))
                open_pos.remove(p)
                lab[i, p] = j
                pos_cnt[p][j] = pos_cnt[p].get(j, 0) + 1
    return lab if unit == "pp" else lab.T.copy()


# ------------------------------------------------------------------ entry
def arnold_place(shape: JobShape, topology: Topology, free: np.ndarray, alpha: float, *,
                 time_limit_s: float = 1.0, local_search: bool = True, seed: int = 0) -> ArnoldResult:
    """Place `shape` on the free nodes with Arnold's MIP (+ local search)."""
    t0 = time.perf_counter()
    alpha, free, cap = prepare(shape, topology, free, alpha)
    beta = 1.0 - alpha
    a = round(alpha * SCALE)
    b = SCALE - a
    if beta >= alpha:
        unit, n_units, size, w_other, w_unit = "pp", shape.rows, shape.cols, a, b
    else:
        unit, n_units, size, w_other, w_unit = "dp", shape.cols, shape.rows, b, a

    greedy = min([_greedy_counts(n_units, size, cap, wf) for wf in (False, True)] + [_whole_counts(n_units, size, cap)],
                 key=lambda g: _proxy(g, w_other, w_unit))
    # `time_limit_s` bounds the whole call: CP-SAT gets what model building and
    # the local search leave of it.
    budget = time_limit_s - (time.perf_counter() - t0) - (LS_TIME_S if local_search else 0.0)
    counts, status, proved = _solve_counts(n_units, size, cap, w_other, w_unit, greedy, max(budget, 0.05), seed)
    if counts is None:
        counts, status = greedy, f"time limit: {status}; greedy fallback"
    mip_objective = _proxy(counts, w_other, w_unit)[0] / SCALE
    rows_first = unit == "pp"
    starts = [assign_nodes(lab, topology, free, rows_first)
              for lab in (labels_from_counts(counts, shape, unit), aligned_labels_from_counts(counts, shape, unit))]
    starts.sort(key=lambda g: grid_key(g, topology, alpha))
    grid = starts[0]

    if local_search:
        if shape.nodes <= SMALL_JOB_NODES:  # cheap: search from both layouts
            starts = [improve(g, topology, free, alpha, time_limit_s=LS_TIME_S / 2) for g in starts]
            grid = min(starts, key=lambda g: grid_key(g, topology, alpha))
        else:
            grid = improve(grid, topology, free, alpha, time_limit_s=LS_TIME_S)
        # The proxy can miss what the default order gets right; never return worse.
        chosen = np.sort(grid.ravel())
        first = sorted(free.tolist(), key=lambda x: topology.node_names[x])[: shape.nodes]
        for base in (default_grid(shape, chosen, topology), default_grid(shape, first, topology)):
            if grid_key(base, topology, alpha) < grid_key(grid, topology, alpha):
                grid = improve(base, topology, free, alpha, time_limit_s=LS_TIME_S / 3)
                status += "; default-order start was better"
    return ArnoldResult(grid=grid, score=score(grid, topology, alpha), unit=unit, alpha=alpha, optimal=proved,
                        status=status, solve_s=time.perf_counter() - t0, mip_objective=mip_objective)
