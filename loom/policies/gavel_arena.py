"""Gavel as the Crius/Arena artifact's simulator runs it (the baseline Crius is
compared against there), rebuilt on Loom's engine — not Loom's own `gavel`.

Rules as built here (Arena source in parentheses; Arena's code is not copied)
------------------------------------------------------------------------------
* **Rounds.** Decisions only on a `round_s` grid (300 s) anchored at the first
  call; an arrival or completion between grid points asks for a `Timer` at the
  next one (macro_def `SCHEDULING_INTERVAL`; scheduler.py `_update_timer`).
* **When it solves.** Only in rounds with news: if jobs finished since the last
  round, the waiting jobs are retried first, in queue order; a job that fails
  blocks its *requested* GPU type (`spec.gpu_type`) for the rest of that pass
  (the default, non-revision, non-`sched_with_opt` branch). Then the jobs that
  arrived, by submit time (gavel_sched.py `GavelSched.schedule`,
  `_gavel_optimize_running_jobs`, `_gavel_pending_jobs_restart_trial`,
  `_gavel_fit_new_jobs`; order: scheduler.py `_sort_jobs`).
* **Drop.** An arrival that cannot run at its requested size on any GPU type
  (best-plan throughput 0 everywhere; this check skips the memory test below,
  as Arena's `force_opt` query does) is never started and kept in
  `self.dropped` (`_gavel_fit_new_jobs`).
* **Fitting one job** (`_gavel_fit_one_job`). Admission control is a MIP over
  the admitted (running) jobs plus the target (`_gavel_admission_control`,
  `_optimize_global_allocation`, `_gen_thr_matrix`): boolean x[j, t], one type
  per job, Σ_j x[j, t]·gpus_j ≤ *all* healthy GPUs of type t (not the free
  ones), at most `max_moves` (MAX_MGRT_JOB_NUM = 3) admitted jobs on another
  type than the MIP last gave them, maximise Σ thr[j, t]·x[j, t]. thr is the
  DP-only estimate at the requested count (`Throughputs.of(dp_only=True)`,
  Arena's `only_dp` query at best locality); where the job cannot run (best
  plan gives 0, `spec.gpu_types` excludes t, or — `dp_memory_check`, Arena's
  baseline OOM test in `query_db` — plain data parallelism, every GPU holding
  the whole model and optimizer state, does not fit t's memory by Loom's
  estimator) it is Arena's INFEASIBLE_THR (−1e9). That outweighs any
  throughput sum, so the MIP uses such an entry only when forced; the optimum
  is then negative, which Arena still admits (`if not cluster_thr` only
  rejects 0), and placement fails (`_is_alloc_feasible` refuses the type). So
  a job whose plain DP fits no type waits for ever, and each of its retries
  re-solves the MIP and shifts the beliefs below. Not admitted (job waits)
  when the MIP is infeasible or its optimum is exactly 0.
* **Placement** (`_gavel_resource_allocation`, `_place_with_best_locality`,
  `_place_with_relaxed_locality`): every admitted job whose MIP type changed
  is taken off its GPUs, then they and the target (last) are placed, GPU count
  unchanged, with the context's placer restricted to the new type. If any
  fails, the round's state is restored and the target waits — but, as in
  Arena (the MIP's allocation matrix is stored before placement), the
  *believed* types of the other jobs keep the MIP's answer, so the change
  count of later MIPs is taken against that belief (`self.believed`).
* **Restart cost.** A start and each move cost min(`restart_s_per_gpu` × GPUs,
  `restart_cap_s`), at most once per job per round (Arena counts jobs whose
  GPUs changed in the round: scheduler.py `_get_cluster_perf`,
  `_parse_crs_table_change`; macro_def `RESCHED_OVERHEAD_WITHOUT_PRUNE`,
  `MAX_...`), quantised to lost rounds as `SiaArena.restart_cost` documents
  (`quantise_cost`); a start is charged by a `Migrate` to the same GPUs.

Solver: an exact depth-first search over sets of at most `max_moves` moves
(`loom.policies.move_search`; same optimum and tie-break order as the MIP,
~6× quicker than CP-SAT here: CP-SAT's fixed cost per call dominates on these
models). An instance needing more than `search_nodes` search nodes (and every
instance when it is 0) goes to OR-Tools CP-SAT: one worker (deterministic),
presolve and probing off (faster on these small models, same optimum),
`solve_limit` deterministic seconds (default 10; the best solution found is
used if it stops early), the model written straight into CP-SAT's proto (the
`CpModel` builder's Python overhead cost more than the solve itself).
Throughputs are scaled to integers (units of 1e-4 it/s, `THR_SCALE`); an
infeasible entry is −(Σ of the jobs' best scaled throughputs + 1), the
smallest penalty that keeps −1e9's effect. Admitted jobs alike in (throughput
row, GPUs, believed type) form one class with an integer count per type (an
exact reformulation: the MIP is symmetric in them); a class's moves go to its
latest-admitted jobs. Ties between optima (which Arena leaves to CPLEX) go to
fewer type changes, then the target's earliest type. A necessary-condition
check (total GPUs; room for the target on some type once at most `max_moves`
of its jobs leave) answers "infeasible" without the solver.

Not reproduced: Arena's node choice (most idle GPUs first, best then halved
locality; here the placer decides); Arena's measured DP memory table
(`database/dp_mem.json` with its ×1.2 / 0.8 margins: Loom's estimator decides
instead, so which (model, count, type) fail differs in places); round-quantised
job ends. Swapping GPUs between moved jobs in a cycle is done
with Preempt + Resume (Loom applies decisions one by one; Arena atomically).

Versus Loom's `gavel`: that one solves Gavel's LP (time fractions, max-min
fairness or normalised throughput) every round for all jobs, time-slices,
preempts and moves any job; this one admits one job at a time with a boolean
MIP, never preempts (except to break swap cycles) and moves ≤ 3 jobs per fit.

Parameters: `round_s` (in [1, 3600], default 300), `restart_s_per_gpu` (≥ 0,
150), `restart_cap_s` (≥ 0, 600), `max_moves` (integer ≥ 0, 3),
`quantise_cost` (bool, True), `first_start_cost` (bool, True),
`solve_limit` (> 0, 10), `dp_memory_check` (bool, True), `search_nodes`
(integer ≥ 0, 20000).
"""

from __future__ import annotations

from typing import Any

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Migrate, Preempt, Resume
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.hardware.state import Allocation
from loom.perf.inputs import Hardware, estimator_job, trace_batch
from loom.perf.presets import preset_names
from loom.perf.search import Choices, search_plans
from loom.policies import params
from loom.policies.elastic_common import healthy_capacities, place_on
from loom.policies.move_search import JobGroup, NoGainProofs, SearchLimit
from loom.policies.sia_arena import ArenaRounds, SiaArena
from loom.policies.throughput import Throughputs, with_dp_plans
from loom.workload.job import JobSpec

THR_SCALE = 1e4  # MIP objective unit: 1e-4 iterations/s
Row = tuple[tuple[int, ...], tuple[float, ...]]  # per type: scaled throughput (−1 = infeasible), raw


def _linear(proto: Any, variables: list[int], coeffs: list[int], low: int, high: int) -> None:
    """Add low ≤ Σ coeffs·variables ≤ high to a CP-SAT proto."""
    linear = proto.constraints.add().linear
    linear.vars.extend(variables)
    linear.coeffs.extend(coeffs)
    linear.domain.extend([low, high])


@POLICIES.register("gavel-arena")
class GavelArena:
    name = "gavel-arena"
    restart_cost = SiaArena.restart_cost  # same parameters, same quantisation

    def __init__(self, round_s: float = 300.0, restart_s_per_gpu: float = 150.0, restart_cap_s: float = 600.0,
                 max_moves: int = 3, quantise_cost: bool = True, first_start_cost: bool = True,
                 solve_limit: float = 10.0, dp_memory_check: bool = True, search_nodes: int = 20_000) -> None:
        self.round_s = params.number(round_s, "round_s", low=1, high=3600)
        self.restart_s_per_gpu = params.number(restart_s_per_gpu, "restart_s_per_gpu", low=0)
        self.restart_cap_s = params.number(restart_cap_s, "restart_cap_s", low=0)
        self.max_moves = params.integer(max_moves, "max_moves", low=0)
        self.quantise_cost = params.boolean(quantise_cost, "quantise_cost")
        self.first_start_cost = params.boolean(first_start_cost, "first_start_cost")
        self.solve_limit = params.number(solve_limit, "solve_limit", low=0, low_open=True)
        self.dp_memory_check = params.boolean(dp_memory_check, "dp_memory_check")
        self.search_nodes = params.integer(search_nodes, "search_nodes", low=0)
        self._params: Any = None  # CP-SAT's, made on the first solve (importing OR-Tools takes ~0.5 s)
        self.dropped: dict[str, str] = {}  # job id → why it is never started
        self.restarts: dict[str, int] = {}  # job id → starts + moves so far
        self.believed: dict[str, str] = {}  # admitted job id → GPU type the last MIP gave it (admission order)
        self.solves = 0  # admission MIPs posed (also those the capacity pre-check answers)
        self.cp_sat_solves = 0  # of those, left to CP-SAT by the exact move search (node limit)
        self.proofs = NoGainProofs(self.max_moves)  # lets most admissions skip the search
        self._rounds = ArenaRounds(self.round_s, self.name)
        self._tp: Throughputs | None = None
        self._rows: dict[str, Row] = {}
        self._dp_memo: dict[tuple, bool] = {}  # (model, batch, GPUs, type) → `_dp_fits`
        # per round: admitted jobs, where they are now, who has paid a restart this round
        self._jobs: dict[str, Job] = {}
        self._where: dict[str, Allocation] = {}
        self._charged: set[str] = set()

    # -- beliefs -------------------------------------------------------------------
    def _row(self, ctx: SchedulingContext, job: Job) -> Row:
        row = self._rows.get(job.job_id)
        if row is None:
            assert self._tp is not None
            spec, ints, raw = job.spec, [], []
            for t in ctx.topology.gpu_types:
                ok = self._runs(job, t) and (not self.dp_memory_check or self._dp_fits(ctx, spec, t))
                thr = self._tp.of(spec, t, spec.gpus, dp_only=True) if ok else -1.0
                raw.append(thr)
                ints.append(round(thr * THR_SCALE) if ok else -1)
            row = self._rows[job.job_id] = (tuple(ints), tuple(raw))
        return row

    def _runs(self, job: Job, gpu_type: str) -> bool:
        """Allowed type on which the best plan at the requested count runs."""
        assert self._tp is not None
        spec = job.spec
        return (not spec.gpu_types or gpu_type in spec.gpu_types) and self._tp.runs(spec, gpu_type, spec.gpus)

    def _dp_fits(self, ctx: SchedulingContext, spec: JobSpec, gpu_type: str) -> bool:
        """Whether a plain data-parallel plan (every GPU holds the whole model and optimizer
        state: no ZeRO, no recomputation) at the requested count fits in GPU memory by Loom's
        estimator — Arena's baseline OOM check (`query_db` with `dp_mem.json`) approximated;
        set up as `Throughputs` sets up its DP-only search."""
        if not spec.model or spec.model not in preset_names():
            return True
        assert self._tp is not None
        batch = trace_batch(spec.batch_size, self._tp.default_batch)
        key = (spec.model, batch, spec.gpus, gpu_type)
        fits = self._dp_memo.get(key)
        if fits is None:
            job, _ = estimator_job(spec.model, batch, spec.gpus)
            hardware = Hardware(gpu_type, gpus_per_node=ctx.topology.gpus_per_node(gpu_type))
            plain_dp = Choices(tp=1, pp=1, vpp=1, zero=0, recompute="none")
            result = search_plans(job, hardware, spec.gpus, choices=plain_dp, top=1, estimator=self._tp.estimator)
            fits = self._dp_memo[key] = result.best is not None
        return fits

    # -- the round -----------------------------------------------------------------
    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if self._tp is None or self._tp.topology is not ctx.topology:
            self._tp = Throughputs(ctx.topology)
            self._rows.clear()
            self._dp_memo.clear()
        wait, arrived, departed, live = self._rounds.news(ctx)
        if wait is not None:
            return wait
        for jid in [j for j in self.believed if j not in ctx.running]:  # ended since the last round
            del self.believed[jid]
            self._rows.pop(jid, None)
        self._jobs = {jid: ctx.running[jid] for jid in self.believed}
        self._where = {jid: job.allocation for jid, job in self._jobs.items()}  # type: ignore[misc]
        self._charged = set()
        plan = RoundPlan(ctx)
        if departed:  # restart trial of the waiting jobs, in queue order
            blocked: set[str | None] = set()
            waiting = [j for j in ctx.pending.values() if j.job_id in self._rounds.seen and j.job_id not in self.dropped]
            for job in sorted(waiting, key=lambda j: (j.spec.submit_time, j.key)):
                if job.spec.gpu_type in blocked:
                    continue
                if not self._fit(plan, job):
                    blocked.add(job.spec.gpu_type)
        for job in sorted(arrived, key=lambda j: (j.spec.submit_time, j.key)):
            self._rounds.seen.add(job.job_id)
            if not any(self._runs(job, t) for t in ctx.topology.gpu_types):  # Arena's check skips the OOM test
                self.dropped[job.job_id] = f"cannot run on {job.spec.gpus} GPUs of any type"
                self._rows.pop(job.job_id, None)
                continue
            self._fit(plan, job)
        self._rounds.live = live
        return with_dp_plans(plan.decisions, ctx, self._tp)

    # -- admission control: the MIP -----------------------------------------------
    def _solve(self, rows: list[tuple[int, ...]], sizes: list[int], prev: list[int],
               caps: list[int]) -> list[int] | None:
        """Each job's type index maximising total throughput (the target last; None: infeasible or zero).

        Admitted jobs alike in (row, size, believed type) are one class with integer counts per
        type (the MIP is symmetric in them); a class's moves go to its latest-admitted jobs."""
        n, types = len(rows), range(len(caps))
        self.solves += 1
        if not self._may_fit(sizes, prev, caps):
            return None
        members: dict[tuple, list[int]] = {}
        for j in range(n - 1):
            members.setdefault((rows[j], sizes[j], prev[j]), []).append(j)
        classes = [*members.items(), ((rows[-1], sizes[-1], -1), [n - 1])]
        penalty = sum(max(max(row), 0) * len(js) for (row, _, _), js in classes) + 1
        worth = {row: tuple(v if v >= 0 else -penalty for v in row) for (row, _, _), _ in classes}
        value = [worth[row] for row in rows]
        groups = [JobGroup(len(js), size, p, worth[row]) for (row, size, p), js in classes[:-1]]
        try:
            found = self.proofs.solve(groups, sizes[-1], worth[rows[-1]], caps, self.search_nodes)
            counts = None if found is None else [*found.counts, [int(t == found.target_type) for t in types]]
        except SearchLimit:  # a hard instance: CP-SAT
            self.cp_sat_solves += 1
            counts = self._cp_sat(classes, value, rows, n, caps)
        if counts is None:
            return None
        choice = [-1] * n
        for c, ((_, _, p), js) in enumerate(classes):
            stay = counts[c][p] if p >= 0 else 0
            for j in js[:stay]:
                choice[j] = p
            rest = iter(js[stay:])
            for t in types:
                for _ in range(counts[c][t] if t != p else 0):
                    choice[next(rest)] = t
        if sum(value[j][choice[j]] for j in range(n)) == 0:
            return None  # Arena: `if not cluster_thr` — nothing gained, not admitted
        return choice

    def _cp_sat(self, classes: list[tuple[tuple, list[int]]], value: list[list[int]], rows: list[tuple[int, ...]],
                n: int, caps: list[int]) -> list[list[int]] | None:
        """The MIP by CP-SAT: jobs of each class per type, or None.

        The model is written straight into CP-SAT's proto (y[c][t] is variable c·T + t): the
        `CpModel` builder's per-call Python overhead cost more than the solve on these small models."""
        types, width = range(len(caps)), len(caps)
        tie = width * (n + 1)  # secondary terms stay below one unit of the primary objective
        from ortools.sat.python import cp_model, cp_model_helper

        proto = cp_model_helper.CpModelProto()
        hint = proto.solution_hint
        objective: dict[int, int] = {}
        for c, (key, js) in enumerate(classes):
            at = key[2] if key[2] >= 0 else max(types, key=lambda t: rows[-1][t])
            for t in types:
                upper = len(js) if t == key[2] or key[2] < 0 else min(len(js), self.max_moves)
                proto.variables.add().domain.extend([0, upper])
                hint.vars.append(c * width + t)  # hint: nobody moves, the target on its fastest type
                hint.values.append(len(js) if t == at else 0)
                objective[c * width + t] = tie * value[js[0]][t]
            _linear(proto, [c * width + t for t in types], [1] * width, len(js), len(js))
        for t in types:
            _linear(proto, [c * width + t for c in range(len(classes))], [key[1] for key, _ in classes], 0, caps[t])
        kept = [c * width + key[2] for c, (key, _) in enumerate(classes[:-1])]
        if n > 1:
            _linear(proto, kept, [1] * len(kept), n - 1 - self.max_moves, n - 1)
        for v in kept:
            objective[v] += width
        for t in types:
            objective[(len(classes) - 1) * width + t] -= t
        proto.objective.vars.extend(list(objective))
        proto.objective.coeffs.extend([-x for x in objective.values()])  # CP-SAT minimises: maximise −(−f)
        proto.objective.scaling_factor = -1.0
        solver = cp_model_helper.SolveWrapper()
        if self._params is None:
            self._params = cp_model.CpSolver().parameters
            self._params.num_workers = 1  # deterministic
            self._params.max_deterministic_time = self.solve_limit
            self._params.cp_model_presolve = False  # tiny models: presolve and probing cost more
            self._params.cp_model_probing_level = 0  # than they save (same optimum, ~3× faster)
        solver.set_parameters(self._params)
        response = solver.solve(proto)
        if response.status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        solution = response.solution
        return [[solution[c * width + t] for t in types] for c in range(len(classes))]

    def _may_fit(self, sizes: list[int], prev: list[int], caps: list[int]) -> bool:
        """A necessary condition for the MIP to be feasible (False: it is not): the GPUs fit in
        total, and some type has room for the target once at most `max_moves` of its jobs leave."""
        if sum(sizes) > sum(caps):
            return False
        on: list[list[int]] = [[] for _ in caps]
        for size, p in zip(sizes, prev):
            on[p].append(size)
        return any(cap - sum(s) + sum(sorted(s, reverse=True)[:self.max_moves]) >= sizes[-1]
                   for cap, s in zip(caps, on))

    # -- fitting one job -----------------------------------------------------------
    def _fit(self, plan: RoundPlan, job: Job) -> bool:
        ctx = plan.ctx
        types = ctx.topology.gpu_types
        ids = list(self.believed)
        known = self._rows
        rows = [known.get(i) or self._row(ctx, self._jobs[i]) for i in ids] + [self._row(ctx, job)]
        sizes = [self._where[i].total for i in ids] + [job.spec.gpus]
        prev = [types.index(self.believed[i]) for i in ids]
        caps = healthy_capacities(ctx.state)
        choice = self._solve([r[0] for r in rows], sizes, prev, [caps[t] for t in types])
        if choice is None:
            return False
        for i, c in zip(ids, choice):  # Arena stores the MIP's answer before placing
            self.believed[i] = types[c]
        moved = [(i, types[c]) for i, c, p in zip(ids, choice, prev) if c != p]
        target_type = types[choice[-1]]
        state = plan.state
        before = state.free.tolist()  # for ordering the moves' decisions
        for i, _ in moved:
            state.release(self._where[i])
        placed: list[tuple[str, Allocation]] = []
        alloc: Allocation | None = None
        for i, t in [*moved, (job.job_id, target_type)]:  # the target last, as in Arena
            j = self._jobs.get(i, job)
            feasible = self._row(ctx, j)[0][types.index(t)] >= 0
            alloc = place_on(plan, j, j.spec.gpus if j is job else self._where[i].total, t) if feasible else None
            if alloc is None:
                break
            if j is not job:
                state.allocate(alloc)
                placed.append((i, alloc))
        if alloc is None:  # restore the round's state; the target waits
            for _, alloc in placed:
                state.release(alloc)
            for i, _ in moved:
                state.allocate(self._where[i])
            return False
        self._emit_moves(plan, before, placed, dict(moved))
        thr = rows[-1][1][choice[-1]]
        plan.start(job, alloc, f"gavel-arena: admitted on {job.spec.gpus} × {target_type}, DP estimate "
                               f"{thr:.3g} it/s ({len(moved)} job(s) change type)")
        self.believed[job.job_id] = target_type
        self.proofs.placed()
        self._jobs[job.job_id] = job
        self._where[job.job_id] = alloc
        pause = self._pay(job.job_id, job.spec.gpus)
        if self.first_start_cost and pause > 0:
            plan.decisions.append(Migrate(job.job_id, alloc, f"gavel-arena: start cost {pause:.0f} s "
                                                              f"(same GPUs; Start carries no pause)", pause))
        return True

    def _pay(self, jid: str, gpus: int) -> float:
        """Count a restart; its cost once per job per round (Arena's per-round resched list)."""
        self.restarts[jid] = self.restarts.get(jid, 0) + 1
        if jid in self._charged:
            return 0.0
        self._charged.add(jid)
        return self.restart_cost(gpus)

    def _emit_moves(self, plan: RoundPlan, sim: list[int], placed: list[tuple[str, Allocation]],
                    to: dict[str, str]) -> None:
        """Migrate each moved job in an order the engine can apply (`sim`: free GPUs per node as the
        decisions so far leave them); a swap cycle via Preempt + Resume."""

        def shift(alloc: Allocation, sign: int) -> None:
            for n, g in zip(alloc.nodes, alloc.gpus):
                sim[n] += sign * g
        todo = [(i, self._where[i], new) for i, new in placed if new != self._where[i]]
        while todo:
            ready = [m for m in todo if all(sim[n] >= g for n, g in zip(m[2].nodes, m[2].gpus))]
            batch, cycle = (ready[:1], False) if ready else (todo, True)
            for i, old, _ in batch:
                if cycle:
                    plan.decisions.append(Preempt(i, f"gavel-arena: suspend to swap onto {to[i]}"))
                shift(old, 1)
            for i, _, new in batch:
                shift(new, -1)
                pause = self._pay(i, new.total)
                why = f"gavel-arena: moved to {new.total} × {to[i]} by the MIP, restart cost {pause:.0f} s"
                if cycle:
                    plan.decisions.append(Resume(i, new, why.replace("moved", "resumed", 1)))
                if not cycle or pause > 0:
                    plan.decisions.append(Migrate(i, new, why, pause))
                self._where[i] = new
            todo = [] if cycle else [m for m in todo if m is not batch[0]]
