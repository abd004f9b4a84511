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

Both are solved with HiGHS as `scipy.optimize.linprog(method="highs")` runs it
(`loom.policies.gavel_lp.solve_allocation`; `_lp` calls scipy's bundled HiGHS binding directly, with
linprog's options and acceptance test, skipping only linprog's per-call
validation, so the solution is bit-identical; without that binding it calls
linprog). Identical jobs (same throughput row, GPU count and normaliser) are
solved as one class: the LP is symmetric in them, so an optimum giving them
equal X exists, and solving per class (capacity rows weighted by the class
size) finds it with a far smaller, less degenerate LP. The optimal objective
is the same; among several optima the symmetric one is returned.

Caching (none changes a decision): a job's throughput row, normaliser, GPU
count and submit time are kept per job (its spec and GPU count never change
under Gavel) in a row of Gavel's own arrays (`_Rows`: rows by job id, reused
once a job leaves the system); classes are ordered by content, so the LP does
not depend on the order of the jobs, and its last solution is reused while
the classes, class sizes and per-type capacities are unchanged (the LP is then
identical); a between-rounds call in which no waiting job fits the free GPUs
of any of its types skips the LP (it could start nothing; `last_allocation`
solves it on demand); placement is not attempted on a type with fewer free
GPUs than the job needs (no placer could succeed there).

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

import numpy as np

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Migrate, Preempt, Resume, Start, Timer
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.hardware.state import Allocation, ClusterState
from loom.policies import params
from loom.policies.gavel_lp import OBJECTIVES, solve_allocation
from loom.policies.throughput import Throughputs, with_dp_plans

EPS = 1e-3
TINY = 1e-9


class _Rows:
    """Gavel's per-job arrays: one row per job in the system, allocated by job id.

    A long-running service submits jobs without end, so rows cannot be indexed by
    a submission number (arrays would grow with every job ever seen). A job gets a
    row when Gavel first sees it; when it leaves the running and waiting jobs its
    row goes to a free list (its time received is forgotten, as Gavel forgets it)
    and the next new job reuses it. The arrays double when full, so they follow
    the peak number of jobs in the system. Which row a job gets never changes a
    decision: rows only index, ties are broken by submission order (`Job.key`).
    """

    __slots__ = ("free", "gpus", "made", "recv", "ref", "row", "submit", "thr", "types", "used")

    def __init__(self, types: int = 0) -> None:
        self.types = types
        self.row: dict[str, int] = {}  # job id → its row
        self.made: dict[str, tuple[Job, int]] = {}  # job id → (the job, its GPUs) its row was computed for
        self.free: list[int] = []  # rows of jobs that left the system, to reuse
        self.used = 0  # rows ever handed out (the free ones included)
        self.thr, self.recv = np.zeros((0, types)), np.zeros((0, types))  # throughput, seconds run, per type
        self.ref, self.gpus, self.submit = np.zeros(0), np.zeros(0), np.zeros(0)

    def of(self, job_id: str) -> int:
        """The job's row, handing out a free one (or a new one) the first time it is seen."""
        r = self.row.get(job_id)
        if r is None:
            if self.free:
                r = self.free.pop()
            else:
                r = self.used
                self.used += 1
                if r >= len(self.ref):
                    self._grow(max(64, 2 * len(self.ref)))
            self.row[job_id] = r
        return r

    def rows(self, jobs: list[Job]) -> np.ndarray:
        of = self.of
        return np.fromiter((of(j.job_id) for j in jobs), np.intp, len(jobs))

    def release(self, job_ids: set[str]) -> None:
        """Rows of jobs no longer in the system go back to the free list, their history cleared."""
        for job_id in job_ids:
            r = self.row.pop(job_id)
            self.made.pop(job_id, None)
            self.recv[r] = 0.0
            self.free.append(r)

    def _grow(self, size: int) -> None:
        have = len(self.ref)
        pad = [(0, size - have), (0, 0)]
        self.thr, self.recv = np.pad(self.thr, pad), np.pad(self.recv, pad)
        self.ref, self.gpus, self.submit = (np.pad(a, (0, size - have)) for a in (self.ref, self.gpus, self.submit))


@POLICIES.register("gavel")
class Gavel:
    name = "gavel"

    def __init__(self, objective: str = "max-min-fairness", round_s: float = 360.0,
                 migration_pause_s: float = 30.0) -> None:
        self.objective = params.choice(objective, "objective", OBJECTIVES)
        self.round_s = params.number(round_s, "round_s", low=0, low_open=True)
        self.migration_pause_s = params.number(migration_pause_s, "migration_pause_s", low=0)
        self._thr: Throughputs | None = None
        # per job in the system: its throughput row, normaliser, GPUs, submit time (computed once: they
        # depend only on the job's spec and GPU count, which Gavel never changes) and seconds run per type
        self._rows = _Rows()
        self._type_masks: dict[int, np.ndarray | None] = {}  # type index → its nodes (no reservations)
        self._lp: dict = {}  # `solve_allocation`'s memo: the last per-class LP and its solution
        self._last_now: float | None = None
        self._next_round = -math.inf
        self._preempted_now: tuple[float, set[str]] = (-math.inf, set())
        self.round_latencies: list[tuple[float, float, str]] = []
        self._last: tuple | None = None  # the last call's LP inputs (jobs, types, thr, gpus, capacity, ref, X)

    # ------------------------------------------------------------ inputs
    def _throughputs(self, ctx: SchedulingContext) -> Throughputs:
        if self._thr is None or self._thr.topology is not ctx.topology:
            self._thr = Throughputs(ctx.topology)
            self._rows.made.clear()  # recompute the rows
            types = len(ctx.topology.gpu_types)
            if types != self._rows.types:  # other columns: what jobs received per type no longer applies
                self._rows = _Rows(types)
            self._type_masks.clear()
            self._lp = {}
        return self._thr

    def _matrix(self, ctx: SchedulingContext, jobs: list[Job], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Throughput matrix (n × T) and each job's normaliser (throughput on its requested type).

        A job's row depends only on its spec and GPU count (Gavel never resizes), so it
        is computed once per job (`rows`: the jobs' rows) and reused every round."""
        thr_of = self._throughputs(ctx)
        types = ctx.topology.gpu_types
        store = self._rows
        made = store.made
        for job, r in zip(jobs, rows.tolist()):
            c = made.get(job.job_id)
            if c is not None and c[0] is job and c[1] == job.gpus:
                continue
            spec = job.spec
            allowed = spec.gpu_types
            row = np.array([0.0 if allowed and t not in allowed else thr_of.of(spec, t, job.gpus, dp_only=True)
                            for t in types])
            ref = float(row[types.index(spec.gpu_type)]) if spec.gpu_type in types else 0.0
            store.thr[r], store.ref[r], store.gpus[r], store.submit[r] = (
                row, ref if ref > 0 else float(row.max()), job.gpus, spec.submit_time)
            made[job.job_id] = (job, job.gpus)
        return store.thr[rows], store.ref[rows]

    @staticmethod
    def _capacity(ctx: SchedulingContext) -> np.ndarray:
        topo = ctx.topology
        healthy = np.where(ctx.state.failed, 0, topo.node_gpus)
        return np.bincount(topo.node_type, weights=healthy, minlength=len(topo.gpu_types)).astype(float)

    def _account(self, ctx: SchedulingContext) -> None:
        """Credit running jobs with the time since the last call on their current type; forget
        what jobs no longer in the system received."""
        now = ctx.now
        running = list(ctx.running.values())
        self._throughputs(ctx)  # the rows' columns are the topology's GPU types
        store = self._rows
        if self._last_now is not None and now > self._last_now and running:
            rows = store.rows(running)
            first = np.fromiter((j.allocation.nodes[0] for j in running), np.intp,  # type: ignore[union-attr]
                                len(running))
            store.recv[rows, ctx.topology.node_type[first]] += now - self._last_now
        self._last_now = now
        pending, running_ids = ctx.pending, ctx.running
        # a job launching, stopping or recovering is still in the system: it keeps its history
        gone = {jid for jid in store.row if jid not in running_ids and jid not in pending
                and jid not in ctx.starting and jid not in ctx.stopping and jid not in ctx.held}
        if gone:
            store.release(gone)

    @property
    def last_allocation(self) -> dict[str, dict[str, float]]:
        """X of the last call's LP: job → {type: time fraction > 1e-9} (solved now if that call
        could do without it)."""
        if self._last is None:
            return {}
        jobs, types, thr, gpus, capacity, ref, x = self._last
        ids = [j.job_id for j in jobs]
        if x is None:
            x = solve_allocation(thr, gpus, capacity, self.objective, ref, self._lp)
            self._last = self._last[:-1] + (x,)
        out: dict[str, dict[str, float]] = {j: {} for j in ids}
        for i, k in zip(*np.nonzero(x > 1e-9)):
            out[ids[i]][types[k]] = float(x[i, k])
        return out

    def _can_start(self, ctx: SchedulingContext, jobs: list[Job], gpus: np.ndarray, fits: np.ndarray) -> bool:
        """Whether `_fill` could start anything: some waiting job (not preempted at this instant)
        has a type it fits with at least its GPU count free — `_place` asks the placer only then."""
        at, skip = self._preempted_now
        waiting = np.array([i for i in range(len(ctx.running), len(jobs))
                            if at != ctx.now or jobs[i].job_id not in skip], dtype=int)
        free = np.minimum(self._type_free(ctx, ctx.state), ctx.state.free_total)
        return bool((fits[waiting] & (gpus[waiting, None] <= free[None, :])).any())

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
        order = np.fromiter((j.key for j in jobs), np.intp, len(jobs))  # submission order: ties only
        rows = self._rows.rows(jobs)
        thr, ref = self._matrix(ctx, jobs, rows)
        capacity = self._capacity(ctx)
        gpus = self._rows.gpus[rows]
        fits = (thr > 0) & (gpus[:, None] <= capacity[None, :])
        self._last = (jobs, types, thr, gpus, capacity, ref, None)
        if not full and not self._can_start(ctx, jobs, gpus, fits):  # the LP could not change that
            self.round_latencies.append((now, time.perf_counter() - clock, "fill"))
            return []
        x = solve_allocation(thr, gpus, capacity, self.objective, ref, self._lp)
        self._last = self._last[:-1] + (x,)
        norm = np.divide(thr, ref[:, None], out=np.zeros_like(thr), where=ref[:, None] > 0)
        in_system = np.maximum(now - self._rows.submit[rows], self.round_s)
        prio = x / (self._rows.recv[rows] / in_system[:, None] + EPS)
        # pairs (i, k) by (x > 1e-6, prio, x, norm) descending, then job key, then type order
        fi, fk = np.nonzero(fits)
        xs = x[fi, fk]
        rank = np.lexsort((order[fi], -norm[fi, fk], -xs, -prio[fi, fk], -(xs > 1e-6).astype(float)))
        pairs = list(zip(fi[rank].tolist(), fk[rank].tolist()))
        decisions = (self._round(ctx, jobs, order, pairs, int((xs > 1e-6).sum()), x, norm, fits) if full
                     else self._fill(ctx, jobs, pairs, x))
        if full:
            self._next_round = now + self.round_s
            decisions.append(Timer(self._next_round, f"gavel: next {self.round_s:.0f}s round"))
        self.round_latencies.append((now, time.perf_counter() - clock, "round" if full else "fill"))
        return with_dp_plans(decisions, ctx, self._throughputs(ctx))

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

    def _round(self, ctx: SchedulingContext, jobs: list[Job], order: np.ndarray, pairs: list[tuple[int, int]],
               positive: int, x: np.ndarray, norm: np.ndarray, fits: np.ndarray) -> list[Decision]:
        """A full round; `pairs[:positive]` are the pairs with X > 1e-6 (they sort first)."""
        topo = ctx.topology
        types = topo.gpu_types
        left = self._capacity(ctx).tolist()
        gpus = [j.gpus for j in jobs]
        chosen: dict[int, int] = {}
        for i, k in pairs[:positive]:  # Gavel's greedy by priority, counting GPUs per type
            if i not in chosen and gpus[i] <= left[k]:
                chosen[i] = k
                left[k] -= gpus[i]
        rest = fits.copy()
        rest[list(chosen)] = False
        li, lk = np.nonzero(rest)
        by_norm = np.lexsort((order[li], -norm[li, lk]))  # normalised throughput descending, then submission
        smallest = min(gpus)
        for i, k in zip(li[by_norm].tolist(), lk[by_norm].tolist()):  # work conservation on GPUs the LP leaves unused
            if i not in chosen and gpus[i] <= left[k]:
                chosen[i] = k
                left[k] -= gpus[i]
                if max(left) < smallest:
                    break

        running = len(ctx.running)  # `jobs` lists the running jobs first
        cur = dict(enumerate(topo.node_type[[j.allocation.nodes[0] for j in jobs[:running]]].tolist()))  # type: ignore[union-attr]
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
        free = trial.free.tolist()  # GPUs left after the placements (plain ints: only checked from here on)
        for i in vacate:
            if i in placed:
                continue
            old = jobs[i].allocation
            if all(free[n] >= g for n, g in zip(old.nodes, old.gpus)):  # type: ignore[union-attr]
                for n, g in zip(old.nodes, old.gpus):  # type: ignore[union-attr]
                    free[n] -= g  # not needed elsewhere: keeps running
            else:
                preempt.append(i)

        out: list[Decision] = []
        moves = [i for i in placed if i in cur]
        sim = ctx.state.free.tolist() if moves else None  # free GPUs as the decisions so far leave them

        def shift(alloc: Allocation, sign: int) -> None:  # release (+1) or take (−1) `alloc` in `sim`
            for n, g in zip(alloc.nodes, alloc.gpus):
                sim[n] += sign * g  # type: ignore[index]
        for i in preempt:
            why = ("not selected this round" if i not in chosen else
                   f"its GPUs are needed and no {types[chosen[i]]} placement was found")
            out.append(Preempt(jobs[i].job_id, f"gavel: preempt ({why})"))
            if sim is not None:
                shift(jobs[i].allocation, 1)  # type: ignore[arg-type]
        while sim is not None and moves:
            progressed = False
            for i in list(moves):
                new = placed[i]
                if all(sim[n] >= g for n, g in zip(new.nodes, new.gpus)):
                    shift(jobs[i].allocation, 1)  # type: ignore[arg-type]
                    shift(new, -1)
                    out.append(Migrate(jobs[i].job_id, new,
                                       f"gavel: move {types[cur[i]]} → {types[chosen[i]]} "
                                       f"(X={x[i, chosen[i]]:.2f}, normalised speed {norm[i, cur[i]]:.2f} → "
                                       f"{norm[i, chosen[i]]:.2f})", self.migration_pause_s))
                    moves.remove(i)
                    progressed = True
            if not progressed:  # a cycle of swaps: break it with suspend/resume
                for i in moves:
                    out.append(Preempt(jobs[i].job_id, f"gavel: suspend to move to {types[chosen[i]]}"))
                    shift(jobs[i].allocation, 1)  # type: ignore[arg-type]
                for i in moves:
                    shift(placed[i], -1)
                    out.append(Resume(jobs[i].job_id, placed[i], f"gavel: resume on {types[chosen[i]]}"))
                moves = []
        for i in order:
            if i in placed and i not in cur:
                out.append(self._start_kind(ctx, jobs[i], placed[i],
                                            f"gavel: round allocation on {types[chosen[i]]} "
                                            f"(X={x[i, chosen[i]]:.2f})"))
        self._preempted_now = (ctx.now, {jobs[i].job_id for i in preempt})
        return out
