"""Exact Eq. 2 placement with CP-SAT (small jobs; the optimality-gap reference).

Unlike `solver.arnold_place`, which solves the bin-packing proxy (Eq. 4–10),
this model minimises Eq. 2 itself: x[r, c, j] = cell (r, c) in minipod j,
u_row[r, j] / u_col[c, j] = the group uses minipod j, P ≥ every row's count of
minipods (max PP spread), D ≥ every column's (max DP spread), objective
α·D + β·P (integer-scaled). Its size grows as cells × minipods, so it is meant
for jobs of tens of nodes (Arnold Table 1, setting (i)).
"""

from __future__ import annotations

import time

import numpy as np

from loom.hardware.topology import Topology
from loom.placement.arnold.local_search import assign_nodes
from loom.placement.arnold.problem import JobShape, score
from loom.placement.arnold.solver import SCALE, ArnoldResult, prepare


def exact_place(shape: JobShape, topology: Topology, free: np.ndarray, alpha: float, *,
                time_limit_s: float = 30.0, seed: int = 0) -> ArnoldResult:
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    alpha, free, cap = prepare(shape, topology, free, alpha)
    a = round(alpha * SCALE)
    b = SCALE - a
    pods = [j for j in range(len(cap)) if cap[j] > 0]
    J, R, C = len(pods), shape.rows, shape.cols
    m = cp_model.CpModel()
    x = [[[m.NewBoolVar(f"x{r}_{c}_{k}") for k in range(J)] for c in range(C)] for r in range(R)]
    ur = [[m.NewBoolVar(f"ur{r}_{k}") for k in range(J)] for r in range(R)]
    uc = [[m.NewBoolVar(f"uc{c}_{k}") for k in range(J)] for c in range(C)]
    D = m.NewIntVar(1, min(J, R), "D")
    P = m.NewIntVar(1, min(J, C), "P")
    for r in range(R):
        for c in range(C):
            m.AddExactlyOne(x[r][c])
            for k in range(J):
                m.AddImplication(x[r][c][k], ur[r][k])
                m.AddImplication(x[r][c][k], uc[c][k])
    for k, j in enumerate(pods):
        m.Add(sum(x[r][c][k] for r in range(R) for c in range(C)) <= int(cap[j]))
        # u means "uses" (keeps the model tight; any optimum has this form anyway)
        for r in range(R):
            m.Add(ur[r][k] <= sum(x[r][c][k] for c in range(C)))
        for c in range(C):
            m.Add(uc[c][k] <= sum(x[r][c][k] for r in range(R)))
    for r in range(R):
        m.Add(sum(ur[r]) <= P)
    for c in range(C):
        m.Add(sum(uc[c]) <= D)
    # No symmetry breaking: rows and columns are interchangeable, but combining
    # row and column orderings safely needs care; the reference favours clarity.
    m.Minimize(a * D + b * P)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = 2
    solver.parameters.random_seed = int(seed)
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"exact placement found no solution within {time_limit_s} s "
                           f"({solver.StatusName(status)})")
    labels = np.empty((R, C), dtype=np.int64)
    for r in range(R):
        for c in range(C):
            labels[r, c] = next(pods[k] for k in range(J) if solver.Value(x[r][c][k]))
    grid = assign_nodes(labels, topology, free, rows_first=(1.0 - alpha) >= alpha)
    optimal = status == cp_model.OPTIMAL
    return ArnoldResult(grid=grid, score=score(grid, topology, alpha), unit="pp" if 1.0 - alpha >= alpha else "dp",
                        alpha=alpha, optimal=optimal, status="optimal" if optimal else "time limit: best incumbent",
                        solve_s=time.perf_counter() - t0, mip_objective=solver.ObjectiveValue() / SCALE)
