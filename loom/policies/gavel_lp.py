"""Gavel's linear program (the formulation is documented in `loom.policies.gavel`):
X[j, t] time fractions from a job × GPU-type throughput matrix, per class of identical
jobs, solved with the HiGHS core scipy ships (what `linprog(method="highs")` runs),
building the constraint matrix once per problem; `linprog` when that core is absent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from loom.policies import params

OBJECTIVES = ("max-sum-throughput", "max-min-fairness")


def equal_share(thr: np.ndarray, gpus: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Each job's throughput under an equal time share of the cluster (Gavel's X^equal)."""
    thr, gpus, capacity = np.asarray(thr, float), np.asarray(gpus, float), np.asarray(capacity, float)
    allowed = (thr > 0) & (gpus[:, None] <= capacity[None, :])
    share = min(1.0, capacity.sum() / gpus.sum()) if gpus.sum() > 0 else 1.0
    cap_allowed = (allowed * capacity[None, :]).sum(axis=1)
    weights = np.divide(allowed * capacity[None, :], cap_allowed[:, None],
                        out=np.zeros_like(thr), where=cap_allowed[:, None] > 0)
    return share * (weights * thr).sum(axis=1)


def _feasible(x: np.ndarray, upper: np.ndarray, slack: np.ndarray) -> bool:
    """linprog's acceptance test of an optimal HiGHS answer (`scipy.optimize._linprog_util._check_result`)."""
    tol = math.sqrt(1e-9) * 10
    return not (np.isnan(x).any() or np.isnan(slack).any()) and bool(
        ((x >= -tol) & (x <= upper + tol)).all() and (slack >= -tol).all())


def _lp(start: np.ndarray, index: np.ndarray, value: np.ndarray, rows: int
        ) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray | None]:
    """A solver of min c·x s.t. A·x ≤ rhs, 0 ≤ x ≤ upper for a fixed A (CSC: start, index, value)
    with `rows` rows, as `linprog(method="highs")` solves it: `solve(c, rhs, upper)` gives x, or
    None where linprog's status would not be 0.

    It runs the same HiGHS (scipy's bundled binding) with linprog's options on the same
    arrays, minus linprog's per-call validation and result packaging, so x is identical
    (`tests/test_gavel_gandiva.py` checks it); without that binding it calls linprog."""
    cols = len(start) - 1
    h = _highs_core()
    if h is None:
        from scipy.optimize import linprog
        from scipy.sparse import csc_matrix

        a_ub = csc_matrix((value, index, start), shape=(rows, cols))

        def by_linprog(c: np.ndarray, rhs: np.ndarray, upper: np.ndarray) -> np.ndarray | None:
            res = linprog(c, A_ub=a_ub, b_ub=rhs, bounds=np.column_stack([np.zeros(cols), upper]), method="highs")
            return res.x if res.status == 0 else None
        return by_linprog
    lp = h.HighsLp()
    lp.num_col_ = lp.a_matrix_.num_col_ = cols
    lp.num_row_ = lp.a_matrix_.num_row_ = rows
    lp.a_matrix_.format_ = h.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start.tolist()
    lp.a_matrix_.index_ = index.tolist()
    lp.a_matrix_.value_ = value
    lp.col_lower_ = np.zeros(cols)
    lp.row_lower_ = np.full(rows, -h.kHighsInf)

    def solve(c: np.ndarray, rhs: np.ndarray, upper: np.ndarray) -> np.ndarray | None:
        lp.col_cost_ = c
        lp.col_upper_ = np.where(np.isinf(upper), h.kHighsInf, upper)
        lp.row_upper_ = rhs
        solver = h._Highs()
        if solver.passOptions(_HIGHS_OPTIONS) == h.HighsStatus.kError or solver.passModel(lp) == h.HighsStatus.kError \
                or solver.run() == h.HighsStatus.kError or solver.getModelStatus() != h.HighsModelStatus.kOptimal:
            return None
        sol = solver.getSolution()
        x = np.array(sol.col_value)
        return x if _feasible(x, upper, rhs - np.array(sol.row_value)) else None
    return solve


def _highs_options() -> Any:
    options = _HIGHS.HighsOptions()  # type: ignore[union-attr]
    # what linprog(method="highs") sets (its other options are left at HiGHS's defaults)
    options.presolve = "on"
    options.log_to_console = False
    options.output_flag = False
    options.highs_debug_level = 0
    options.simplex_strategy = 1  # dual simplex
    return options


_UNLOADED = object()
_HIGHS: Any = _UNLOADED  # scipy's HiGHS core, loaded on the first solve: importing scipy.optimize takes ~0.5 s
_HIGHS_OPTIONS: Any = None


def _highs_core() -> Any:
    """scipy's own HiGHS binding, the one linprog(method="highs") runs (None: use linprog)."""
    global _HIGHS, _HIGHS_OPTIONS
    if _HIGHS is _UNLOADED:
        try:
            from scipy.optimize._highspy import _core  # type: ignore[import-not-found]
            _HIGHS = _core
            _HIGHS_OPTIONS = _highs_options()
        except (ImportError, AttributeError, TypeError, ValueError):  # pragma: no cover - another scipy
            _HIGHS = None
    return _HIGHS


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`np.unique(a, axis=0, return_inverse=True, return_counts=True)` (rows sorted lexicographically)
    for a float matrix without NaNs, faster."""
    order = np.lexsort(a.T[::-1])
    s = a[order]
    new = np.ones(len(s), dtype=bool)
    new[1:] = (s[1:] != s[:-1]).any(axis=1)
    member = np.empty(len(a), dtype=np.intp)
    member[order] = np.cumsum(new) - 1
    return s[new], member, np.diff(np.append(np.flatnonzero(new), len(s)))


def solve_allocation(thr: np.ndarray, gpus: np.ndarray, capacity: np.ndarray,
                     objective: str = "max-min-fairness", reference: np.ndarray | None = None,
                     memo: dict | None = None) -> np.ndarray:
    """Gavel's LP: X[j, t] (time fractions), as documented in the module.

    `thr` is n × T (0 = cannot run there), `gpus` the n requested GPU counts,
    `capacity` the T GPU counts per type; `reference` (max-sum only) the
    per-job normaliser, by default each job's best throughput. `memo` (a dict the
    caller keeps) remembers the last per-class LP and its solution: an identical LP
    (same classes, class sizes, capacities) is not solved again.
    """
    params.choice(objective, "objective", OBJECTIVES)
    thr = np.asarray(thr, dtype=float)
    gpus = np.asarray(gpus, dtype=float)
    capacity = np.asarray(capacity, dtype=float)
    n, types = thr.shape
    out = np.zeros((n, types))
    if n == 0:
        return out
    usable = (thr > 0) & (gpus[:, None] <= capacity[None, :])
    if objective == "max-sum-throughput":
        ref = thr.max(axis=1) if reference is None else np.asarray(reference, float)
    else:
        ref = equal_share(thr, gpus, capacity)
    live = usable.any(axis=1) & (ref > 0)
    if not live.any():
        return out
    idx = np.flatnonzero(live)
    # identical jobs (same throughputs, GPUs and normaliser) form one class: the LP is symmetric
    # in them, so it has an optimum giving them the same X; solving per class finds that one.
    # Classes are ordered by content, so the LP does not depend on the order of the jobs.
    rows, member, count = _unique_rows(np.column_stack([thr[idx], gpus[idx], ref[idx]]))
    key = (objective, rows.shape, rows.tobytes(), count.tobytes(), capacity.tobytes())
    if memo is not None and memo.get("key") == key:
        sol = memo["sol"]
    else:
        sol = _solve_classes(rows[:, :types], rows[:, types], rows[:, types + 1], count, capacity, objective)
        if memo is not None:
            memo["key"], memo["sol"] = key, sol
    out[idx] = sol[member]
    return out


def _solve_classes(thr: np.ndarray, gpus: np.ndarray, ref: np.ndarray, count: np.ndarray, capacity: np.ndarray,
                   objective: str) -> np.ndarray:
    """The LP over job classes (one row of `thr`, `gpus`, `ref` each; `count` jobs per class)."""
    m, types = thr.shape
    usable = (thr > 0) & (gpus[:, None] <= capacity[None, :])
    # one variable per usable (class, type) pair (the others are fixed at 0), plus z (max-min)
    pj, pt = np.nonzero(usable)
    nv = len(pj)
    flat = thr[pj, pt] / ref[pj]
    weight = count[pj].astype(float)
    # rows: m "one type at a time", T capacities, then (max-min) m fairness rows z − Σ_t X·thr/eq ≤ 0;
    # A column by column (CSC, rows ascending): variable v has 1 in row pj, weight·gpus in row m + pt
    # (and −thr/eq in row m + T + pj), z has 1 in every fairness row
    per = 2 if objective == "max-sum-throughput" else 3
    index = np.empty((nv, per), dtype=np.intp)
    value = np.empty((nv, per))
    index[:, 0], index[:, 1] = pj, m + pt
    value[:, 0], value[:, 1] = 1.0, weight * gpus[pj]
    b_ub = np.concatenate([np.ones(m), capacity])
    if objective == "max-sum-throughput":
        x = _lp(np.arange(0, per * nv + 1, per), index.ravel(), value.ravel(), m + types)(-weight * flat, b_ub,
                                                                                           np.ones(nv))
        if x is None:
            x = np.zeros(nv)
    else:
        index[:, 2], value[:, 2] = m + types + pj, -flat
        solve = _lp(np.append(np.arange(0, per * nv + 1, per), per * nv + m),
                    np.concatenate([index.ravel(), np.arange(m + types, 2 * m + types)]),
                    np.concatenate([value.ravel(), np.ones(m)]), 2 * m + types)
        upper = np.ones(nv + 1)
        upper[nv] = np.inf
        c = np.zeros(nv + 1)
        c[nv] = -1.0
        # stage 1: maximise z with z ≤ Σ_t X·thr/eq for every job
        x1 = solve(c, np.concatenate([b_ub, np.zeros(m)]), upper)
        if x1 is None:
            return np.zeros((m, types))
        z = float(x1[-1])
        # stage 2: keep everyone at the fair level, use the rest for total throughput
        # (same matrix with z fixed at 0: the fairness rows become −Σ_t X·thr/eq ≤ −z·(1 − 1e-6))
        upper[nv] = 0.0
        c[:nv] = -weight * flat
        c[nv] = 0.0
        x2 = solve(c, np.concatenate([b_ub, np.full(m, -z * (1 - 1e-6))]), upper)
        x = (x2 if x2 is not None else x1)[:nv]
    sol = np.zeros((m, types))
    sol[pj, pt] = np.clip(x, 0.0, 1.0)
    return sol
