"""Local search on the true Arnold objective (Eq. 2) and leaf-aware node choice.

The MIP of Eq. 4–10 is a proxy; this module refines a placement on what is
actually scored (``problem.score``): ``α·max DP spread + β·max PP spread``,
tie-broken by the (weighted) number of groups at the maximum spread, then the
(weighted, then plain) sum of all group spreads, and finally by leaves used.

Spreads depend only on the minipod of each cell, so the search works on a
matrix of minipod *labels* with incremental per-row / per-column counts
(no re-scoring): a move changes O(1) counters and the maxima are kept with
spread histograms. Moves, tried in a deterministic order, first improvement:

* relabel a cell to a minipod that still has unused free nodes (= replace the
  grid node by an unused free node of another minipod);
* swap the labels of two cells (= swap two grid nodes), first inside the same
  column (a row move that leaves every column unchanged) / row, then anywhere.

Only moves that take a group's minority minipod towards a minipod the group
already uses are generated, since only those can lower a spread. Concrete nodes
are chosen afterwards inside each minipod (`assign_nodes`): leaves with the most
free nodes first, and each group's cells filled consecutively in leaf order, so
a group sits under as few leaves as possible without changing any minipod set.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from loom.hardware.topology import Topology
from loom.placement.arnold.problem import minipod_of, score


def weights(alpha: float) -> tuple[int, int]:
    """Integer (α, β) weights, scaled by 1000, exact for comparisons."""
    a = round(alpha * 1000)
    return a, 1000 - a


def grid_key(grid: np.ndarray, topology: Topology, alpha: float) -> tuple[int, int, int, int, int]:
    """The search's lexicographic key of a concrete grid (lower is better)."""
    a, b = weights(alpha)
    pods = minipod_of(topology)[grid]
    rows = [len(set(r)) for r in pods.tolist()]
    cols = [len(set(c)) for c in pods.T.tolist()]
    mr, mc = max(rows), max(cols)
    return (a * mc + b * mr, a * cols.count(mc) + b * rows.count(mr), a * sum(cols) + b * sum(rows),
            sum(cols) + sum(rows), score(grid, topology, alpha).leaves_used)


class _Labels:
    """Minipod label matrix with incremental spread bookkeeping."""

    def __init__(self, labels: np.ndarray, avail: list[int], alpha: float) -> None:
        self.R, self.C = labels.shape
        self.J = len(avail)
        self.P = labels.tolist()
        self.avail = list(avail)
        self.a, self.b = weights(alpha)
        J = self.J
        self.rowcnt = [[0] * J for _ in range(self.R)]
        self.colcnt = [[0] * J for _ in range(self.C)]
        for r, row in enumerate(self.P):
            for c, j in enumerate(row):
                self.rowcnt[r][j] += 1
                self.colcnt[c][j] += 1
        self.rowsp = [sum(1 for v in cnt if v) for cnt in self.rowcnt]
        self.colsp = [sum(1 for v in cnt if v) for cnt in self.colcnt]
        self.hr = [0] * (J + 2)
        self.hc = [0] * (J + 2)
        for s in self.rowsp:
            self.hr[s] += 1
        for s in self.colsp:
            self.hc[s] += 1
        self.maxr = max(self.rowsp)
        self.maxc = max(self.colsp)
        self.sumr = sum(self.rowsp)
        self.sumc = sum(self.colsp)

    def key(self) -> tuple[int, int, int]:
        return (self.a * self.maxc + self.b * self.maxr, self.a * self.hc[self.maxc] + self.b * self.hr[self.maxr],
                self.a * self.sumc + self.b * self.sumr, self.sumc + self.sumr)

    def set(self, r: int, c: int, new: int) -> None:
        old = self.P[r][c]
        if old == new:
            return
        self.P[r][c] = new
        # row r
        cnt = self.rowcnt[r]
        cnt[old] -= 1
        if cnt[old] == 0:
            s = self.rowsp[r]
            self.hr[s] -= 1
            self.hr[s - 1] += 1
            self.rowsp[r] = s - 1
            self.sumr -= 1
            if s == self.maxr and self.hr[s] == 0:
                self.maxr = s - 1
        if cnt[new] == 0:
            s = self.rowsp[r]
            self.hr[s] -= 1
            self.hr[s + 1] += 1
            self.rowsp[r] = s + 1
            self.sumr += 1
            self.maxr = max(self.maxr, s + 1)
        cnt[new] += 1
        # column c
        cnt = self.colcnt[c]
        cnt[old] -= 1
        if cnt[old] == 0:
            s = self.colsp[c]
            self.hc[s] -= 1
            self.hc[s - 1] += 1
            self.colsp[c] = s - 1
            self.sumc -= 1
            if s == self.maxc and self.hc[s] == 0:
                self.maxc = s - 1
        if cnt[new] == 0:
            s = self.colsp[c]
            self.hc[s] -= 1
            self.hc[s + 1] += 1
            self.colsp[c] = s + 1
            self.sumc += 1
            self.maxc = max(self.maxc, s + 1)
        cnt[new] += 1

    # ---------------------------------------------------------------- moves
    def try_relabel(self, r: int, c: int, new: int, best: tuple) -> bool:
        old = self.P[r][c]
        self.set(r, c, new)
        if self.key() < best:
            self.avail[old] += 1
            self.avail[new] -= 1
            return True
        self.set(r, c, old)
        return False

    def try_swap(self, r1: int, c1: int, r2: int, c2: int, best: tuple) -> bool:
        x, y = self.P[r1][c1], self.P[r2][c2]
        self.set(r1, c1, y)
        self.set(r2, c2, x)
        if self.key() < best:
            return True
        self.set(r2, c2, y)
        self.set(r1, c1, x)
        return False


def improve_labels(labels: np.ndarray, avail: list[int], alpha: float, *, max_evals: int = 200_000,
                   time_limit_s: float = 0.25, max_far_swaps: int = 48) -> tuple[np.ndarray, list[int]]:
    """First-improvement hill climbing on the label matrix (see module doc)."""
    st = _Labels(labels, avail, alpha)
    deadline = time.perf_counter() + time_limit_s
    evals = 0
    R, C = st.R, st.C

    def cells_of(kind: str, g: int) -> list[tuple[int, int]]:
        return [(g, c) for c in range(C)] if kind == "r" else [(r, g) for r in range(R)]

    improved = True
    while improved and evals < max_evals and time.perf_counter() < deadline:
        improved = False
        best = st.key()
        groups = [(-(st.b * s), -s, 0, i) for i, s in enumerate(st.rowsp) if s > 1]
        groups += [(-(st.a * s), -s, 1, i) for i, s in enumerate(st.colsp) if s > 1]
        groups.sort()
        for _, _, kind_id, g in groups:
            kind = "r" if kind_id == 0 else "c"
            cnt = st.rowcnt[g] if kind == "r" else st.colcnt[g]
            present = sorted((j for j in range(st.J) if cnt[j]), key=lambda j: (cnt[j], j))
            targets = present[::-1]
            cells = cells_of(kind, g)
            for a_lab in present[:-1]:
                for r, c in cells:
                    if st.P[r][c] != a_lab:
                        continue
                    for b_lab in targets:
                        if b_lab == a_lab:
                            continue
                        evals += 1
                        if st.avail[b_lab] > 0 and st.try_relabel(r, c, b_lab, best):
                            improved = True
                            break
                        # swap along the orthogonal group first (keeps it unchanged)
                        line = ([(r2, c) for r2 in range(R) if r2 != r] if kind == "r"
                                else [(r, c2) for c2 in range(C) if c2 != c])
                        for r2, c2 in line:
                            if st.P[r2][c2] == b_lab:
                                evals += 1
                                if st.try_swap(r, c, r2, c2, best):
                                    improved = True
                                    break
                        if improved:
                            break
                        far = 0
                        for r2 in range(R):
                            if far >= max_far_swaps or improved:
                                break
                            if kind == "r" and r2 == r:
                                continue
                            row = st.P[r2]
                            for c2 in range(C):
                                if (kind == "c" and c2 == c) or row[c2] != b_lab:
                                    continue
                                far += 1
                                evals += 1
                                if st.try_swap(r, c, r2, c2, best):
                                    improved = True
                                    break
                                if far >= max_far_swaps:
                                    break
                        if improved:
                            break
                    if improved or evals >= max_evals:
                        break
                if improved or evals >= max_evals:
                    break
            if improved or evals >= max_evals or time.perf_counter() >= deadline:
                break
    return np.asarray(st.P, dtype=np.int64), st.avail


def assign_nodes(labels: np.ndarray, topology: Topology, free: np.ndarray, rows_first: bool) -> np.ndarray:
    """Concrete free nodes for a minipod label matrix, leaf-aligned.

    Inside each minipod: take the leaves with the most free nodes first (fewest
    leaves used), order the chosen nodes by leaf then name, and fill that
    minipod's cells group by group (row-major when rows — PP groups — are the
    primary unit, column-major otherwise), so each group's nodes in a minipod are
    consecutive under as few leaves as possible.
    """
    pods = minipod_of(topology)
    leaf = topology.switch_of[topology.leaf_tier]
    by_pod: dict[int, list[int]] = defaultdict(list)
    for n in sorted((int(x) for x in free), key=lambda n: topology.node_names[n]):
        by_pod[int(pods[n])].append(n)
    R, C = labels.shape
    order = [(r, c) for r in range(R) for c in range(C)] if rows_first else \
            [(r, c) for c in range(C) for r in range(R)]
    cells: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r, c in order:
        cells[int(labels[r, c])].append((r, c))
    grid = np.empty((R, C), dtype=np.int64)
    for j, cl in cells.items():
        pool = by_pod[j]
        if len(pool) < len(cl):
            raise ValueError(f"minipod {j} has {len(pool)} free nodes, the placement needs {len(cl)}")
        by_leaf: dict[int, list[int]] = defaultdict(list)
        for n in pool:
            by_leaf[int(leaf[n])].append(n)
        need = len(cl)
        remaining = sorted(by_leaf, key=lambda lf: (-len(by_leaf[lf]), lf))
        chosen: list[tuple[int, list[int]]] = []
        while need > 0:
            fitting = [lf for lf in remaining if len(by_leaf[lf]) >= need]
            if fitting:  # best fit for the remainder: one more leaf, the tightest
                lf = min(fitting, key=lambda x: (len(by_leaf[x]), x))
            else:  # otherwise the largest leaf, whole
                lf = remaining[0]
            take = by_leaf[lf][:need]
            chosen.append((lf, take))
            remaining.remove(lf)
            need -= len(take)
        chosen.sort(key=lambda t: t[0])
        nodes = [n for _, ns in chosen for n in ns]
        for (r, c), n in zip(cl, nodes):
            grid[r, c] = n
    return grid


def refine_leaves(grid: np.ndarray, topology: Topology, free: np.ndarray, alpha: float) -> np.ndarray:
    """Re-choose nodes inside each minipod for leaf alignment; keeps every
    group's minipod set (labels unchanged). Returns the better of the two."""
    labels = minipod_of(topology)[grid]
    out = assign_nodes(labels, topology, free, rows_first=(1.0 - alpha) >= alpha)
    return out if grid_key(out, topology, alpha) <= grid_key(grid, topology, alpha) else grid


def improve(grid: np.ndarray, topology: Topology, free: np.ndarray, alpha: float, *,
            time_limit_s: float = 0.25, max_evals: int = 200_000) -> np.ndarray:
    """Local search on Eq. 2 from `grid` over the free nodes `free` (which must
    include the grid's nodes); never returns a worse grid (by `grid_key`)."""
    pods = minipod_of(topology)
    free = np.asarray(free, dtype=np.int64)
    J = int(pods.max()) + 1
    avail = np.bincount(pods[free], minlength=J) - np.bincount(pods[grid.ravel()], minlength=J)
    labels0 = pods[grid].astype(np.int64)
    labels, _ = improve_labels(labels0, avail.tolist(), alpha, time_limit_s=time_limit_s, max_evals=max_evals)
    candidates = [grid]
    if not np.array_equal(labels, labels0):
        candidates.append(assign_nodes(labels, topology, free, rows_first=(1.0 - alpha) >= alpha))
    candidates.append(refine_leaves(candidates[-1], topology, free, alpha))
    return min(candidates, key=lambda g: grid_key(g, topology, alpha))
