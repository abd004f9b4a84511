"""Gavel (Narayanan et al., OSDI'20): heterogeneity-aware round-based scheduling
from a linear program over the job × GPU-type throughput matrix.

Formulation
-----------
Let jobs j = 1..n be the jobs in the system (running or waiting), types t the
GPU types of the cluster, `thr[j, t]` the job's throughput (iterations/s) on
`gpus_j` GPUs of type t — its *requested* count, Gavel does not resize —
estimated with data-parallel scaling (`Throughputs.of(..., dp_only=True)`:
the baselines decide from DP estimates, while the simulator's speed model runs
every job with the best plan for what it gets), and `cap_t` the healthy GPUs of
type t. The variables are

    X[j, t] ∈ [0, 1]   fraction of (wall-clock) time job j runs on type t,

subject to

    Σ_t X[j, t] ≤ 1                    (a job runs on at most one type at a time)
    Σ_j X[j, t] · gpus_j ≤ cap_t       (time-averaged capacity of each type)
    X[j, t] = 0 when thr[j, t] = 0, gpus_j > cap_t, or t is not one of the
    job's allowed types (`spec.gpu_types` when set).

Objectives (`objective`):

* ``max-sum-throughput``: maximise Σ_j Σ_t X[j, t] · thr[j, t] / ref[j], with
  ref[j] the job's throughput on its requested GPU type (`spec.gpu_type`, or
  its fastest type when it named none): total normalised throughput.
* ``max-min-fairness`` (default; Gavel's heterogeneity-aware LAS): maximise z
  subject to z ≤ Σ_t X[j, t] · thr[j, t] / eq[j] for every job, where eq[j] is
  the job's throughput under an equal time share of the cluster,
  X_eq[j, t] = min(1, Σ_t cap_t / Σ_k gpus_k) · cap_t / Σ_{t allowed} cap_t.
  A second LP then keeps every job at ≥ (1 − 1e-6)·z* and maximises the sum of
  the same normalised throughputs, so capacity the bottleneck jobs cannot use
  is not left idle (Gavel's water-filling, in one step).

Both are solved with `scipy.optimize.linprog` (HiGHS) — `solve_allocation`.
Identical jobs (same throughput row, GPU count and normaliser) are solved as
one class: the LP is symmetric in them, so an optimum giving them equal X
exists, and solving per class (capacity rows weighted by the class size)
finds it with a far smaller, less degenerate LP. The optimal objective is
the same; among several optima the symmetric one is returned.

Caching (none changes a decision): a job's throughput row is computed once
(its spec and GPU count never change under Gavel); the LP is solved with the
jobs in a canonical order (by id) and its last solution is reused while the
job set and the per-type capacities are unchanged (its inputs are then
identical), e.g. at a round right after a between-rounds call or in a
follow-up call at the same instant; placement is not attempted on a type
with fewer free GPUs than the job needs (no placer could succeed there).

Rounds
------
Every `round_s` seconds (the policy asks for the next round with a `Timer`
while jobs exist) the LP is re-solved and the round allocated as in Gavel:
each (job, type) pair gets priority X[j, t] / (f[j, t] + ε), where f[j, t] is
the fraction of the job's time in the system it has so far received on type
t. Pairs are taken in priority order (ties: larger X), each job at most once,
while the type still has `gpus_j` GPUs left (counting all of them, as if
nothing ran); GPUs left over go to further jobs by normalised throughput (work
conservation). Then:

* a selected running job on its selected type keeps its GPUs;
* a selected job is placed with the context's placer restricted to its
  type's nodes; a running job selected for another type is moved there with
  `Migrate` (pause `migration_pause_s`, its GPU count is unchanged) — or, if
  moves would have to swap GPUs in a cycle, with Preempt + Resume;
* a running job not selected (or whose move could not be placed) is
  preempted only if its GPUs were needed; otherwise it keeps running.

Between rounds (arrivals, completions) the policy only starts waiting jobs on
free GPUs, by the same priorities; it never preempts there. GPU types: a
job's `spec.gpu_type` is its *preference* (the reference for normalisation);
Gavel is free to run it on any type (the speed model charges the type's
speed); `spec.gpu_types` is a hard constraint.

`round_latencies` records (time, seconds, "round" | "fill") per call.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Migrate, Preempt, Resume, Start, Timer
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.errors import LoomInputError
from loom.hardware.state import Allocation, ClusterState
from loom.policies.throughput import Throughputs

OBJECTIVES = ("max-sum-throughput", "max-min-fairness")
FIELD = "policy.params"
EPS = 1e-3
TINY = 1e-9


def _positive(value: Any, name: str, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
            value < 0 if allow_zero else value <= 0):
        kind = "≥ 0" if allow_zero else "> 0"
        raise LoomInputError(f"must be a finite number {kind}, got {value!r}", field=f"{FIELD}.{name}")
    return float(value)


def equal_share(thr: np.ndarray, gpus: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Each job's throughput under an equal time share of the cluster (Gavel's X^equal)."""
    thr, gpus, capacity = np.asarray(thr, float), np.asarray(gpus, float), np.asarray(capacity, float)
    allowed = (thr > 0) & (gpus[:, None] <= capacity[None, :])
    share = min(1.0, capacity.sum() / gpus.sum()) if gpus.sum() > 0 else 1.0
    cap_allowed = (allowed * capacity[None, :]).sum(axis=1)
    weights = np.divide(allowed * capacity[None, :], cap_allowed[:, None],
                        out=np.zeros_like(thr), where=cap_allowed[:, None] > 0)
    return share * (weights * thr).sum(axis=1)


def solve_allocation(thr: np.ndarray, gpus: np.ndarray, capacity: np.ndarray,
                     objective: str = "max-min-fairness", reference: np.ndarray | None = None) -> np.ndarray:
    """Gavel's LP: X[j, t] (time fractions), as documented in the module.

    `thr` is n × T (0 = cannot run there), `gpus` the n requested GPU counts,
    `capacity` the T GPU counts per type; `reference` (max-sum only) the
    per-job normaliser, by default each job's best throughput.
    """
    if objective not in OBJECTIVES:
        raise LoomInputError(f"unknown objective {objective!r} (known: {', '.join(OBJECTIVES)})",
                             field=f"{FIELD}.objective")
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
    # in them, so it has an optimum giving them the same X; solving per class finds that one
    _, member, count = np.unique(np.column_stack([thr[idx], gpus[idx], ref[idx]]), axis=0,
                                       return_inverse=True, return_counts=True)
    member = member.ravel()
    first = idx[np.unique(member, return_index=True)[1]]  # a representative job per class
    m = len(first)
    # one variable per usable (class, type) pair (the others are fixed at 0), plus z (max-min)
    pj, pt = np.nonzero(usable[first])
    nv = len(pj)
    flat = thr[first[pj], pt] / ref[first[pj]]
    weight = count[pj].astype(float)
    cols = np.arange(nv)
    # rows: m "one type at a time", T capacities, then (max-min) m fairness rows z − Σ_t X·thr/eq ≤ 0
    rows = [pj, m + pt]
    data = [np.ones(nv), weight * gpus[first[pj]]]
    b_ub = np.concatenate([np.ones(m), capacity])
    if objective == "max-sum-throughput":
        A = csr_matrix((np.concatenate(data), (np.concatenate(rows), np.tile(cols, 2))), shape=(m + types, nv))
        res = linprog(-weight * flat, A_ub=A, b_ub=b_ub, bounds=(0.0, 1.0), method="highs")
        x = res.x if res.status == 0 else np.zeros(nv)
    else:
        fair = m + types + np.arange(m)
        A = csr_matrix((np.concatenate(data + [-flat, np.ones(m)]),
                        (np.concatenate(rows + [m + types + pj, fair]),
                         np.concatenate([cols, cols, cols, np.full(m, nv)]))), shape=(2 * m + types, nv + 1))
        bounds = np.zeros((nv + 1, 2))
        bounds[:nv, 1] = 1.0
        bounds[nv, 1] = np.inf
        c = np.zeros(nv + 1)
        c[nv] = -1.0
        # stage 1: maximise z with z ≤ Σ_t X·thr/eq for every job
        res = linprog(c, A_ub=A, b_ub=np.concatenate([b_ub, np.zeros(m)]), bounds=bounds, method="highs")
        if res.status != 0:
            return out
        z = float(res.x[-1])
        # stage 2: keep everyone at the fair level, use the rest for total throughput
        # (same matrix with z fixed at 0: the fairness rows become −Σ_t X·thr/eq ≤ −z·(1 − 1e-6))
        bounds[nv, 1] = 0.0
        c[:nv] = -weight * flat
        c[nv] = 0.0
        res2 = linprog(c, A_ub=A, b_ub=np.concatenate([b_ub, np.full(m, -z * (1 - 1e-6))]), bounds=bounds,
                       method="highs")
        x = (res2.x if res2.status == 0 else res.x)[:nv]
    sol = np.zeros((m, types))
    sol[pj, pt] = np.clip(x, 0.0, 1.0)
    out[idx] = sol[member]
    return out


@POLICIES.register("gavel")
class Gavel:
    name = "gavel"

    def __init__(self, objective: str = "max-min-fairness", round_s: float = 360.0,
                 migration_pause_s: float = 30.0) -> None:
        if objective not in OBJECTIVES:
            raise LoomInputError(f"unknown objective {objective!r} (known: {', '.join(OBJECTIVES)})",
                                 field=f"{FIELD}.objective")
        self.objective = objective
        self.round_s = _positive(round_s, "round_s")
        self.migration_pause_s = _positive(migration_pause_s, "migration_pause_s", allow_zero=True)
        self._thr: Throughputs | None = None
        self._rows: dict[str, tuple[int, np.ndarray, float]] = {}  # job → (GPUs, throughput row, normaliser)
        self._type_masks: dict[int, np.ndarray | None] = {}  # type index → its nodes (no reservations)
        self._lp: tuple[tuple, np.ndarray] | None = None  # (LP inputs key, X by job id order) of the last solve
        self._received: dict[str, np.ndarray] = {}  # job → seconds run per type
        self._last_now: float | None = None
        self._next_round = -math.inf
        self._preempted_now: tuple[float, set[str]] = (-math.inf, set())
        self.round_latencies: list[tuple[float, float, str]] = []
        self.last_allocation: dict[str, dict[str, float]] = {}

    # ------------------------------------------------------------ inputs
    def _throughputs(self, ctx: SchedulingContext) -> Throughputs:
        if self._thr is None or self._thr.topology is not ctx.topology:
            self._thr = Throughputs(ctx.topology)
            self._rows.clear()
            self._type_masks.clear()
            self._lp = None
        return self._thr

    def _matrix(self, ctx: SchedulingContext, jobs: list[Job]) -> tuple[np.ndarray, np.ndarray]:
        """Throughput matrix (n × T) and each job's normaliser (throughput on its requested type).

        A job's row depends only on its spec and GPU count (Gavel never resizes), so it
        is computed once per job and reused every round."""
        thr_of = self._throughputs(ctx)
        types = ctx.topology.gpu_types
        rows = self._rows
        thr = np.empty((len(jobs), len(types)))
        ref = np.empty(len(jobs))
        for i, job in enumerate(jobs):
            cached = rows.get(job.job_id)
            if cached is None or cached[0] != job.gpus:
                spec = job.spec
                allowed = spec.gpu_types
                row = np.array([0.0 if allowed and t not in allowed else thr_of.of(spec, t, job.gpus, dp_only=True)
                                for t in types])
                r = float(row[types.index(spec.gpu_type)]) if spec.gpu_type in types else 0.0
                cached = rows[job.job_id] = (job.gpus, row, r if r > 0 else float(row.max()))
            thr[i] = cached[1]
            ref[i] = cached[2]
        return thr, ref

    @staticmethod
    def _capacity(ctx: SchedulingContext) -> np.ndarray:
        topo = ctx.topology
        healthy = np.where(ctx.state.failed, 0, topo.node_gpus)
        return np.bincount(topo.node_type, weights=healthy, minlength=len(topo.gpu_types)).astype(float)

    def _account(self, ctx: SchedulingContext) -> None:
        """Credit running jobs with the time since the last call on their current type."""
        now = ctx.now
        if self._last_now is not None and now > self._last_now:
            dt = now - self._last_now
            types = len(ctx.topology.gpu_types)
            for job in ctx.running.values():
                got = self._received.setdefault(job.job_id, np.zeros(types))
                got[int(ctx.topology.node_type[job.allocation.nodes[0]])] += dt  # type: ignore[union-attr]
        self._last_now = now
        live = ctx.running.keys() | ctx.pending.keys()
        for cache in (self._received, self._rows):
            for gone in [j for j in cache if j not in live]:
                del cache[gone]

    def _solve(self, jobs: list[Job], thr: np.ndarray, gpus: np.ndarray, capacity: np.ndarray,
               ref: np.ndarray) -> np.ndarray:
        """`solve_allocation` over the jobs in a canonical order (by job id), reusing the
        last solution when the job set and the capacities are unchanged: the LP's inputs
        are then identical, so is its solution."""
        ids = [j.job_id for j in jobs]
        order = sorted(range(len(jobs)), key=ids.__getitem__)
        key = (tuple(ids[i] for i in order), capacity.tobytes())
        if self._lp is not None and self._lp[0] == key:
            x_sorted = self._lp[1]
        else:
            x_sorted = solve_allocation(thr[order], gpus[order], capacity, self.objective, ref[order])
            self._lp = (key, x_sorted)
        x = np.empty_like(x_sorted)
        x[order] = x_sorted
        return x

    # ------------------------------------------------------------ round
    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        clock = time.perf_counter()
        self._account(ctx)
        jobs = list(ctx.running.values()) + list(ctx.pending.values())
        if not jobs:
            return []
        now = ctx.now
        full = now >= self._next_round - TINY
        if not full and not ctx.pending:
            return []
        types = ctx.topology.gpu_types
        thr, ref = self._matrix(ctx, jobs)
        capacity = self._capacity(ctx)
        gpus = np.array([j.gpus for j in jobs], dtype=float)
        x = self._solve(jobs, thr, gpus, capacity, ref)
        rows, cols = np.nonzero(x > 1e-9)
        self.last_allocation = {j.job_id: {} for j in jobs}
        for i, k in zip(rows.tolist(), cols.tolist()):
            self.last_allocation[jobs[i].job_id][types[k]] = float(x[i, k])
        norm = np.divide(thr, ref[:, None], out=np.zeros_like(thr), where=ref[:, None] > 0)
        fits = (thr > 0) & (gpus[:, None] <= capacity[None, :])
        in_system = np.maximum(now - np.array([j.spec.submit_time for j in jobs]), self.round_s)
        got = np.zeros_like(x)
        for i, job in enumerate(jobs):
            received = self._received.get(job.job_id)
            if received is not None:
                got[i] = received
        prio = x / (got / in_system[:, None] + EPS)
        # pairs (i, k) by (x > 1e-6, prio, x, norm) descending, then job key, then type order
        keys = np.array([j.key for j in jobs])
        fi, fk = np.nonzero(fits)
        xs = x[fi, fk]
        rank = np.lexsort((keys[fi], -norm[fi, fk], -xs, -prio[fi, fk], -(xs > 1e-6).astype(float)))
        pairs = list(zip(fi[rank].tolist(), fk[rank].tolist()))
        decisions = self._round(ctx, jobs, pairs, x, norm, fits) if full else self._fill(ctx, jobs, pairs, x)
        if full:
            self._next_round = now + self.round_s
            decisions.append(Timer(self._next_round, f"gavel: next {self.round_s:.0f}s round"))
        self.round_latencies.append((now, time.perf_counter() - clock, "round" if full else "fill"))
        return decisions

    @staticmethod
    def _type_free(ctx: SchedulingContext, state: ClusterState) -> np.ndarray:
        """Free GPUs per type: a placement of g GPUs on type t needs g ≤ this (failed nodes have none free)."""
        topo = ctx.topology
        return np.bincount(topo.node_type, weights=state.free, minlength=len(topo.gpu_types))

    def _place(self, ctx: SchedulingContext, job: Job, k: int, state: ClusterState,
               type_free: np.ndarray) -> Allocation | None:
        """Place `job` on type `k` of `state`, keeping `type_free` (see `_type_free`) up to date;
        jobs larger than the type's free GPUs are skipped without asking the placer."""
        if job.gpus > state.free_total or job.gpus > type_free[k]:
            return None
        if ctx.reservations:
            mask = state.usable_mask(ctx.reservation_for(job.job_id), ctx.topology.gpu_types[k])
        else:  # the type's nodes: fixed for the topology
            if k not in self._type_masks:
                self._type_masks[k] = state.usable_mask(None, ctx.topology.gpu_types[k])
            mask = self._type_masks[k]
        alloc = ctx.placer.place(job.spec, job.gpus, state, mask)
        if alloc is not None:
            state.allocate(alloc)
            type_free[k] -= alloc.total
        return alloc

    def _start_kind(self, ctx: SchedulingContext, job: Job, alloc: Allocation, reason: str) -> Decision:
        plan_for = getattr(ctx.placer, "plan_for", None)
        plan = plan_for(job.spec, alloc) if plan_for is not None else None
        kind = Resume if job.first_start is not None else Start
        return kind(job.job_id, alloc, f"{reason}; {ctx.placer.name} on {len(alloc.nodes)} node(s)", plan)

    def _fill(self, ctx: SchedulingContext, jobs: list[Job], pairs: list[tuple[int, int]],
              x: np.ndarray) -> list[Decision]:
        """Between rounds: start waiting jobs on free GPUs, by round priority; never preempt."""
        at, skip = self._preempted_now
        skip = skip if at == ctx.now else set()
        state = ctx.state.copy()
        type_free = self._type_free(ctx, state)
        types = ctx.topology.gpu_types
        out: list[Decision] = []
        done: set[int] = set()
        for i, k in pairs:
            job = jobs[i]
            if i in done or job.job_id not in ctx.pending or job.job_id in skip:
                continue
            if state.free_total == 0:
                break
            alloc = self._place(ctx, job, k, state, type_free)
            if alloc is None:
                continue
            done.add(i)
            out.append(self._start_kind(ctx, job, alloc, f"gavel: free {types[k]} GPUs between rounds "
                                                         f"(X={x[i, k]:.2f})"))
        return out

    def _round(self, ctx: SchedulingContext, jobs: list[Job], pairs: list[tuple[int, int]], x: np.ndarray,
               norm: np.ndarray, fits: np.ndarray) -> list[Decision]:
        topo = ctx.topology
        types = topo.gpu_types
        left = self._capacity(ctx)
        chosen: dict[int, int] = {}
        for i, k in pairs:  # Gavel's greedy by priority, counting GPUs per type
            if x[i, k] > 1e-6 and i not in chosen and jobs[i].gpus <= left[k]:
                chosen[i] = k
                left[k] -= jobs[i].gpus
        rest = fits.copy()
        rest[list(chosen)] = False
        li, lk = np.nonzero(rest)
        keys = np.array([j.key for j in jobs])
        by_norm = np.lexsort((keys[li], -norm[li, lk]))  # normalised throughput descending, then job key
        for i, k in zip(li[by_norm].tolist(), lk[by_norm].tolist()):  # work conservation on GPUs the LP leaves unused
            if i not in chosen and jobs[i].gpus <= left[k]:
                chosen[i] = k
                left[k] -= jobs[i].gpus

        cur = {i: int(topo.node_type[j.allocation.nodes[0]]) for i, j in enumerate(jobs)  # type: ignore[union-attr]
               if j.job_id in ctx.running}
        vacate = [i for i in cur if chosen.get(i) != cur[i]]
        trial = ctx.state.copy()
        for i in vacate:
            trial.release(jobs[i].allocation)  # type: ignore[arg-type]
        rank = {i: r for r, i in enumerate(chosen)}  # selection order: priority, then leftovers
        order = sorted((i for i in chosen if cur.get(i) != chosen[i]), key=rank.__getitem__)
        placed: dict[int, Allocation] = {}
        type_free = self._type_free(ctx, trial)
        for i in order:
            alloc = self._place(ctx, jobs[i], chosen[i], trial, type_free)
            if alloc is not None:
                placed[i] = alloc
        preempt: list[int] = []
        for i in vacate:
            if i in placed:
                continue
            old = jobs[i].allocation
            if all(trial.free.item(n) >= g for n, g in zip(old.nodes, old.gpus)):  # type: ignore[union-attr]
                trial.allocate(old)  # type: ignore[arg-type]  # not needed elsewhere: keeps running
            else:
                preempt.append(i)

        out: list[Decision] = []
        sim = ctx.state.copy()
        for i in preempt:
            why = ("not selected this round" if i not in chosen else
                   f"its GPUs are needed and no {types[chosen[i]]} placement was found")
            out.append(Preempt(jobs[i].job_id, f"gavel: preempt ({why})"))
            sim.release(jobs[i].allocation)  # type: ignore[arg-type]
        moves = [i for i in placed if i in cur]
        while moves:
            progressed = False
            for i in list(moves):
                new = placed[i]
                if all(sim.free.item(n) >= g for n, g in zip(new.nodes, new.gpus)):
                    sim.release(jobs[i].allocation)  # type: ignore[arg-type]
                    sim.allocate(new)
                    out.append(Migrate(jobs[i].job_id, new,
                                       f"gavel: move {types[cur[i]]} → {types[chosen[i]]} "
                                       f"(X={x[i, chosen[i]]:.2f}, normalised speed {norm[i, cur[i]]:.2f} → "
                                       f"{norm[i, chosen[i]]:.2f})", self.migration_pause_s))
                    moves.remove(i)
                    progressed = True
            if not progressed:  # a cycle of swaps: break it with suspend/resume
                for i in moves:
                    out.append(Preempt(jobs[i].job_id, f"gavel: suspend to move to {types[chosen[i]]}"))
                    sim.release(jobs[i].allocation)  # type: ignore[arg-type]
                for i in moves:
                    sim.allocate(placed[i])
                    out.append(Resume(jobs[i].job_id, placed[i], f"gavel: resume on {types[chosen[i]]}"))
                moves = []
        for i in order:
            if i in placed and i not in cur:
                sim.allocate(placed[i])
                out.append(self._start_kind(ctx, jobs[i], placed[i],
                                            f"gavel: round allocation on {types[chosen[i]]} "
                                            f"(X={x[i, chosen[i]]:.2f})"))
        self._preempted_now = (ctx.now, {jobs[i].job_id for i in preempt})
        return out
