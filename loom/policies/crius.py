"""Crius (seed 002, patent seed 003): Cell-based, heterogeneity- and elasticity-aware scheduling.

Each job's options and their values come from its Cells (`loom.policies.crius_cells`):
(GPU type, count N/2, N, 2N, …, max_scale·N) valued by the best Cell's
throughput relative to the job as requested. Cluster throughput is the sum of
these values over running jobs (a pending job counts 0). A job becomes ready
after its profiling delay (a `Timer` wakes the scheduler then); with
`run_while_profiling` it may run as submitted meanwhile (untouched until ready).
Values only rank: every decision carries the plan tuned for exactly the GPUs it
gives (`CellBook.tuned`, cell-guided tuning), so the job runs what was planned.

One round (on every arrival / completion / timer), in this order:

1. *Head first (patent claim 5).* The job that was first blocked last round (the
   head) starts if its target option (best N-GPU option on a type that can hold
   N) fits, counting the GPUs of the opportunistic jobs running there for it:
   those are preempted (most recently started first, only as many as needed).
2. *Anti-starvation.* A ready job that has waited more than `starvation_s` goes
   to the front; while it is blocked, no other job may start or grow on the type
   it targets (a hard hold), opportunistic jobs there are preempted and running
   jobs there are shrunk (never below their N/2 Cell, largest release first)
   until it fits. As jobs there finish and nothing else may take their GPUs, it
   eventually starts.
3. *Admission, in queue order* (starved, then arrival order). A job starts in its
   best-valued option of at most N GPUs that fits. Otherwise, for the first
   `max_candidates` blocked jobs, a bounded search (≤ `admit_depth` moves)
   makes room on one type: halve a running job there to its next lower Cell or
   move it to another type with free GPUs; moves are taken greedily by value lost
   per GPU freed (a single covering move is also tried). The best option/moves
   pair is applied if Δ cluster throughput = v(new job) − Σ loss > `admit_min_gain`
   (−0.5 by default: a waiting job costs JCT, so a small throughput loss is
   accepted — Arena admits at any loss; e.g. halving a 2N job on linear scaling
   to admit an N-GPU job is Δ = 0).
   A job that starts while an earlier job is blocked runs *opportunistically* for
   it when it lands on the head's target type (step 1 may preempt it later).
4. *Growth, `search_depth` greedy steps.* Running jobs move up: a larger Cell on
   their type using free GPUs (also restoring shrunk jobs), or any Cell of another
   type (≤ max(current, N) GPUs without `grow_other_types`). Best Δ first; a step
   must gain ≥ `min_gain`, save more time than its restart costs, with ≥
   `min_remaining_factor × restart_delay_s` left.
   A job changes at most once per round; opportunistic jobs are left alone; a job
   step 3 shrank or moved down waits `regrow_hold_s` (damps admit-then-halve /
   re-grow cycles, counted as `oscillations`).
5. *Hold.* The first still-blocked job becomes the head. With
   `opportunistic=False` (or when starved) its free GPUs are held: up to N free
   GPUs of its target type that no one else may use.

Every Resize/Migrate charges `restart_delay_s` of checkpoint-restart as `pause_s`.
`max_scale` = 4: Crius's Cells stop at 2N, Arena grows jobs by doubling up to 16
GPUs. A job started this round may start on a larger Cell instead (no restart).
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Migrate, Resize, Timer
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology
from loom.policies import params
from loom.policies.crius_cells import CellBook, JobCells, Option, TunedPlan
from loom.policies.crius_moves import greedy_cover, single_cover


@dataclass(frozen=True, slots=True)
class Hold:
    """The head of the queue: the job first blocked, its target and whether its GPUs are held."""

    job_id: str
    gpu_type: str
    gpus: int
    hard: bool


@POLICIES.register("crius")
class Crius:
    name = "crius"

    def __init__(self, search_depth: int = 8, admit_depth: int = 3, restart_delay_s: float = 30.0,
                 profiling_s_per_cell: float = 20.0, starvation_s: float = 3600.0, opportunistic: bool = True,
                 max_candidates: int = 16, min_gain: float = 0.05, min_remaining_factor: float = 2.0,
                 max_scale: int = 4, admit_min_gain: float = -0.5, tune_cells: int = 8,
                 regrow_hold_s: float = 1800.0, grow_other_types: bool = True,
                 run_while_profiling: bool = True, reuse_profiles: bool = True) -> None:
        self.search_depth = params.integer(search_depth, "search_depth", low=0)
        self.admit_depth = params.integer(admit_depth, "admit_depth", low=0)
        self.restart_delay_s = params.number(restart_delay_s, "restart_delay_s", low=0)
        self.profiling_s_per_cell = params.number(profiling_s_per_cell, "profiling_s_per_cell", low=0)
        self.starvation_s = params.number(starvation_s, "starvation_s", low=0, low_open=True)
        self.opportunistic = params.boolean(opportunistic, "opportunistic")
        self.max_candidates = params.integer(max_candidates, "max_candidates", low=1)
        self.min_gain = params.number(min_gain, "min_gain", low=0)
        self.min_remaining_factor = params.number(min_remaining_factor, "min_remaining_factor", low=0)
        self.max_scale = params.integer(max_scale, "max_scale", low=1)
        self.admit_min_gain = params.number(admit_min_gain, "admit_min_gain")
        self.tune_cells = params.integer(tune_cells, "tune_cells", low=0)
        self.regrow_hold_s = params.number(regrow_hold_s, "regrow_hold_s", low=0)
        self.grow_other_types = params.boolean(grow_other_types, "grow_other_types")
        self.run_while_profiling = params.boolean(run_while_profiling, "run_while_profiling")
        self.reuse_profiles = params.boolean(reuse_profiles, "reuse_profiles")
        self.shrunk_at: dict[str, float] = {}  # job id → when admission last shrank or moved it down
        self.profiling_delay_s: dict[str, float] = {}
        self.held: Hold | None = None
        self.opportunistic_jobs: dict[str, str] = {}  # job id → the head whose GPUs it runs on
        self.stats = {"starts": 0, "resizes": 0, "migrations": 0, "admitted_by_rescaling": 0, "grown": 0,
                      "opportunistic_starts": 0, "opportunistic_preemptions": 0, "starved_shrinks": 0,
                      "oscillations": 0, "regrowths_held": 0, "profiling_starts": 0}
        self._book: CellBook | None = None
        self._topo_key: int | None = None
        self._timers: set[float] = set()

    def book(self, ctx: SchedulingContext) -> CellBook:
        return self.book_for(ctx.topology)

    def book_for(self, topology: Topology) -> CellBook:
        """The Cells (and tuned plans) of the jobs seen on `topology`."""
        if self._book is None or self._topo_key != id(topology):
            self._book = CellBook(topology, self.max_scale, self.profiling_s_per_cell, self.tune_cells,
                                  self.reuse_profiles)
            self._topo_key = id(topology)
        return self._book

    def cells_of(self, job: Job) -> JobCells:
        assert self._book is not None, "schedule() builds the Cell book first"
        cells = self._book.of(job)
        if job.job_id not in self.profiling_delay_s:
            self.profiling_delay_s[job.job_id] = cells.delay_s
        return cells

    def value(self, job: Job, gpu_type: str, gpus: int) -> float:
        opt = self.cells_of(job).options.get((gpu_type, gpus))
        return opt.value if opt else 0.0

    def summary_stats(self) -> dict[str, float]:
        """Counters plus the profiling delay jobs waited (summary.json: ``crius_<key>``)."""
        delays = sorted(self.profiling_delay_s.values())
        median = delays[len(delays) // 2] if delays else 0.0
        return {**self.stats, "profiling_delay_s_median": median, "profiling_delay_s_max": delays[-1] if delays else 0.0}

    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        self.book(ctx)
        r = _Round(self, ctx)
        r.run()
        return r.plan.decisions + r.extra


class _Round:
    """One scheduling round's working state (see the module docstring for the steps)."""

    def __init__(self, policy: Crius, ctx: SchedulingContext) -> None:
        self.p = policy
        self.ctx = ctx
        self.plan = RoundPlan(ctx)
        self.extra: list[Decision] = []
        self.now = ctx.now
        self.topo = ctx.topology
        self.touched: set[str] = set()
        self.cur: dict[str, tuple[Allocation, str]] = {}
        for jid, job in ctx.running.items():
            alloc = job.allocation
            assert alloc is not None
            self.cur[jid] = (alloc, self.topo.gpu_types[int(self.topo.node_type[alloc.nodes[0]])])
        state = ctx.state
        self.free = {t: int(state.free[m].sum()) for t, m in policy.book(ctx).type_masks.items()}
        pending = set(ctx.pending)
        policy.opportunistic_jobs = {j: h for j, h in policy.opportunistic_jobs.items()
                                     if j in ctx.running and h in pending}
        if policy.held is not None and policy.held.job_id not in pending:
            policy.held = None
        self.starved_type: str | None = None
        self.starved: set[str] = set()
        self.queue: list[Job] = []
        self.head: Job | None = None  # first job blocked this round
        self.job_of: dict[str, Job] = dict(ctx.running)
        self.fresh: dict[str, Decision] = {}  # job started this round → its Start/Resume decision
        self.version = 0  # bumped on every change to this round's state: keys the freeing-moves cache
        self._moves: dict[str, tuple[int, list]] = {}

    # -- helpers ---------------------------------------------------------------
    def options(self, job: Job) -> dict[tuple[str, int], Option]:
        return self.p.cells_of(job).options

    def avail(self, gpu_type: str, job: Job) -> int:
        """Free GPUs of `gpu_type` that `job` may use (held GPUs and a starved type excluded)."""
        held = self.p.held
        if held is None or held.job_id == job.job_id or held.gpu_type != gpu_type:
            return self.free[gpu_type]
        if self.starved_type == gpu_type:
            return 0
        return self.free[gpu_type] - min(self.free[gpu_type], held.gpus) if held.hard else self.free[gpu_type]

    def place(self, job: Job, gpu_type: str, gpus: int) -> Allocation | None:
        if gpus > self.free[gpu_type]:
            return None
        state = self.plan.view
        return self.plan.placer.place(job.spec, gpus, state, state.usable_mask(None, gpu_type))

    def remaining_s(self, job: Job) -> float:
        return self.plan.ctx.expected_end(job) - self.now

    def tuned(self, job: Job, opt: Option) -> TunedPlan:
        """The plan tuned for exactly `opt`'s GPUs (Cell-guided tuning; `CellBook.tuned`)."""
        return self.p.book(self.ctx).tuned(job, opt.gpu_type, opt.gpus)

    def describe(self, opt: Option) -> str:
        return (f"{opt.gpus}×{opt.gpu_type}, {opt.stages} stage{'s' if opt.stages > 1 else ''} "
                f"(cell throughput {opt.value:.2f}× requested)")

    def ready(self, job: Job) -> bool:
        """Every Cell profiled: the job may grow, shrink or move."""
        return self.now >= job.spec.submit_time + self.p.cells_of(job).delay_s - 1e-9

    def known(self, job: Job) -> dict[tuple[str, int], Option]:
        """The options whose Cells are profiled by now (all of them once `ready`)."""
        cells = self.p.cells_of(job)
        if self.ready(job):
            return cells.options
        elapsed = self.now - job.spec.submit_time + 1e-9
        return {k: o for k, o in cells.options.items() if cells.ready_at.get(k, 0.0) <= elapsed}

    def admissible(self, job: Job) -> bool:
        """Its Cells of N GPUs profiled: admission may start it (on the options known)."""
        return self.now >= job.spec.submit_time + self.p.cells_of(job).admit_delay_s - 1e-9

    def current_value(self, job: Job) -> float:
        alloc, t = self.cur[job.job_id]
        return self.p.value(job, t, alloc.total)

    def target(self, job: Job) -> Option | None:
        """The N-GPU option a blocked job waits for: best value on a type that can hold it."""
        opts = [o for o in self.options(job).values() if o.gpus == job.gpus] or list(self.options(job).values())
        return max(opts, key=lambda o: (o.value, -o.gpus), default=None)

    # -- actions ---------------------------------------------------------------
    def start(self, job: Job, opt: Option, why: str, profiling: bool = False) -> bool:
        """Start `job` on `opt` with its tuned plan; `profiling`: as submitted (its data-parallel
        plan, Crius has no Cells for it yet) while its profiling runs."""
        alloc = self.place(job, opt.gpu_type, opt.gpus)
        if alloc is None:
            return False
        p = self.p
        verb = "resume" if job.first_start is not None else "start"
        reason = f"crius: {verb} {job.job_id} on {self.describe(opt)}; {why}; profiled {p.profiling_delay_s[job.job_id]:.0f}s"
        head = p.held
        if (self.head is not None and head is not None and head.job_id == self.head.job_id and p.opportunistic
                and head.gpu_type == opt.gpu_type and job.job_id != head.job_id):
            reason += f"; opportunistic while {head.job_id} waits"
            p.opportunistic_jobs[job.job_id] = head.job_id
            p.stats["opportunistic_starts"] += 1
        if profiling:
            plan = p.book(self.ctx).throughputs.dp_plan(job.spec, opt.gpu_type, opt.gpus)
            runs = f"data-parallel {plan.describe()}" if plan else "the speed model's plan"
            self.plan.start(job, alloc, f"{reason}; runs as submitted ({runs}) while profiling", plan)
        else:
            tuned = self.tuned(job, opt)
            self.plan.start(job, alloc, f"{reason}; {tuned.describe()}", tuned.plan)
        self.free[opt.gpu_type] -= opt.gpus
        self.touched.add(job.job_id)
        self.version += 1
        self.cur[job.job_id] = (alloc, opt.gpu_type)
        self.job_of[job.job_id] = job
        self.fresh[job.job_id] = self.plan.decisions[-1]
        p.stats["starts"] += 1
        return True

    def reallocate(self, job: Job, opt: Option, shrink_in_place: bool) -> Allocation | None:
        """Move `job`'s GPUs in this round's state to `opt` (or leave them, returning None)."""
        old, old_type = self.cur[job.job_id]
        state = self.plan.state
        state.release(old)
        self.free[old_type] += old.total
        if shrink_in_place and opt.gpu_type == old_type and opt.gpus < old.total:
            nodes, gpus, left = [], [], opt.gpus
            for node, g in zip(old.nodes, old.gpus):
                if left <= 0:
                    break
                nodes.append(node)
                gpus.append(min(g, left))
                left -= gpus[-1]
            alloc: Allocation | None = Allocation(tuple(nodes), tuple(gpus))
        else:
            alloc = self.place(job, opt.gpu_type, opt.gpus)
        if alloc is None:
            state.allocate(old)
            self.free[old_type] -= old.total
            return None
        state.allocate(alloc)
        self.free[opt.gpu_type] -= alloc.total
        self.cur[job.job_id] = (alloc, opt.gpu_type)
        self.version += 1
        return alloc

    def enlarge_start(self, job: Job, opt: Option, delta: float) -> bool:
        """Start a job started this round on a larger Cell instead (no restart to pay)."""
        jid = job.job_id
        alloc = self.reallocate(job, opt, shrink_in_place=False)
        if alloc is None:
            return False
        # the new start goes last: decisions made since may have freed the GPUs it now uses
        decisions = self.plan.decisions
        index = next(i for i, d in enumerate(decisions) if d is self.fresh[jid])
        kind = type(decisions.pop(index))
        verb = "resume" if job.first_start is not None else "start"
        reason = (f"crius: {verb} {jid} on {self.describe(opt)}; idle GPUs, its Cell gains most from them "
                  f"(Δ throughput {delta:+.2f}); profiled {self.p.profiling_delay_s[jid]:.0f}s; "
                  f"{self.plan.placer.name} on {len(alloc.nodes)} node(s)")
        tuned = self.tuned(job, opt)
        decisions.append(kind(jid, alloc, f"{reason}; {tuned.describe()}", tuned.plan))
        self.fresh[jid] = decisions[-1]
        self.plan.started = [(j, alloc if j.job_id == jid else a) for j, a in self.plan.started]
        return True

    def preempt(self, job: Job, why: str) -> None:
        alloc, t = self.cur.pop(job.job_id)
        self.plan.preempt(job, why)
        self.free[t] += alloc.total
        self.p.opportunistic_jobs.pop(job.job_id, None)
        self.touched.add(job.job_id)
        self.version += 1

    def rescale(self, job: Job, opt: Option, why: str) -> bool:
        """Resize (count changes) or Migrate (same count, other type) `job` to `opt`."""
        old, old_type = self.cur[job.job_id]
        alloc = self.reallocate(job, opt, shrink_in_place=True)
        if alloc is None:
            return False
        pause = self.p.restart_delay_s
        verb = "migrate" if opt.gpus == old.total and opt.gpu_type != old_type else "resize"
        tuned = self.tuned(job, opt)
        reason = (f"crius: {verb} {job.job_id} {old.total}×{old_type} → {self.describe(opt)}; {why}; "
                  f"restart {pause:.0f}s; {tuned.describe()}")
        if verb == "migrate":
            self.plan.decisions.append(Migrate(job.job_id, alloc, reason, pause, tuned.plan))
            self.p.stats["migrations"] += 1
        else:
            self.plan.decisions.append(Resize(job.job_id, alloc, reason, tuned.plan, pause))
            self.p.stats["resizes"] += 1
        self.touched.add(job.job_id)
        return True

    # -- the round -------------------------------------------------------------
    def run(self) -> None:
        ctx, p = self.ctx, self.p
        pending = list(ctx.pending.values())
        waiting = [j for j in pending if not self.ready(j)] + [j for j in ctx.running.values() if not self.ready(j)]
        if waiting:
            at = min(j.spec.submit_time + min(s for s in p.cells_of(j).ready_at.values()
                                              if j.spec.submit_time + s > self.now + 1e-9) for j in waiting)
            if at not in p._timers and at >= self.now:
                p._timers.add(at)
                self.extra.append(Timer(at, f"crius: {len(waiting)} job(s) profiling until then"))
        ready = [j for j in pending if self.admissible(j) and self.options(j)]
        self.starved = {j.job_id for j in ready if self.now - j.spec.submit_time > p.starvation_s}
        ready.sort(key=lambda j: (j.job_id not in self.starved, j.key))
        self.queue = ready
        self.head_first()
        self.anti_starvation()
        self.admit_pass()
        self.profile_pass([j for j in pending if not self.admissible(j)])
        self.grow_pass()
        self.update_hold()

    def head_first(self) -> None:
        held = self.p.held
        if held is None:
            return
        head = self.ctx.pending[held.job_id]
        opt = self.options(head).get((held.gpu_type, held.gpus))
        if opt is None or not self.admissible(head):
            self.p.held = None
            return
        tag = "starved: priority, " if head.job_id in self.starved else ""
        if self.free[held.gpu_type] >= held.gpus and self.start(head, opt, f"{tag}head of the queue"):
            self.p.held = None
            return
        guests = sorted((self.ctx.running[j] for j, h in self.p.opportunistic_jobs.items()
                         if h == head.job_id and self.cur[j][1] == held.gpu_type), key=lambda g: -(g.last_start or 0.0))
        trial = self.plan.fork()
        for i, guest in enumerate(guests):
            trial.state.release(self.cur[guest.job_id][0])
            view = trial.view
            if self.plan.placer.place(head.spec, held.gpus, view, view.usable_mask(None, held.gpu_type)) is None:
                continue
            for g in guests[: i + 1]:
                self.preempt(g, f"crius: opportunistic job {g.job_id} preempted: {head.job_id} can start on "
                                f"{held.gpu_type}")
                self.p.stats["opportunistic_preemptions"] += 1
            if self.start(head, opt, f"{tag}preempted {i + 1} opportunistic job(s)"):
                self.p.held = None
            return

    def anti_starvation(self) -> None:
        blocked = [j for j in self.queue if j.job_id in self.starved and j.job_id not in self.touched]
        if not blocked:
            return
        job = blocked[0]
        opt = self.target(job)
        if opt is None:
            return
        t = opt.gpu_type
        self.p.held = Hold(job.job_id, t, opt.gpus, hard=True)
        self.starved_type = t
        for gid in [g for g in self.p.opportunistic_jobs if self.cur[g][1] == t and g not in self.touched]:
            self.preempt(self.ctx.running[gid], f"crius: opportunistic job {gid} preempted for starved {job.job_id}")
            self.p.stats["opportunistic_preemptions"] += 1
        if self.start(job, opt, "starved: priority"):
            self.p.held = None
            return
        shrinkable = []
        for jid, (alloc, jt) in self.cur.items():
            if jt != t or jid in self.touched:
                continue
            r = self.job_of[jid]
            if not self.admissible(r):
                continue
            known = self.known(r)
            lower = [c for (tt, c) in known if tt == t and c < alloc.total and 2 * c >= r.gpus]
            if lower:
                shrinkable.append((alloc.total - min(lower), r, known[(t, min(lower))]))
        shrinkable.sort(key=lambda x: -x[0])
        for _, r, o in shrinkable:
            if self.rescale(r, o, f"shrunk for starved job {job.job_id} (waited {self.now - job.spec.submit_time:.0f}s)"):
                self.p.stats["starved_shrinks"] += 1
                if self.start(job, opt, "starved: priority, after shrinking running jobs"):
                    self.p.held = None
                    return

    def admit_pass(self) -> None:
        searched, failed = 0, set()
        for job in self.queue:
            if job.job_id in self.touched:
                continue
            why = "starved: priority" if job.job_id in self.starved else "queue order"
            opts = sorted((o for o in self.known(job).values() if o.gpus <= job.gpus),
                          key=lambda o: (-o.value, o.gpus))
            if any(self.avail(o.gpu_type, job) >= o.gpus and self.start(job, o, why) for o in opts):
                continue
            key = (job.spec.model, job.spec.batch_size, job.gpus, job.spec.gpu_types)
            if searched < self.p.max_candidates and key not in failed and self.p.admit_depth > 0:
                searched += 1
                if self.admit_by_rescaling(job, opts):
                    continue
                failed.add(key)
            if self.head is None:
                self.head = job
                held = self.p.held
                if held is None or held.job_id not in self.starved:  # a starved head keeps its hard hold
                    opt = self.target(job)
                    self.p.held = None if opt is None else Hold(job.job_id, opt.gpu_type, opt.gpus,
                                                                hard=not self.p.opportunistic)

    def profile_pass(self, profiling: list[Job]) -> None:
        """`run_while_profiling`: a job still being profiled starts as submitted (its requested
        type and count) where that fits without disturbing anyone; it is neither moved nor grown
        before its Cells are known."""
        if not self.p.run_while_profiling:
            return
        for job in profiling:
            t = job.spec.gpu_type
            if (t in self.free and self.avail(t, job) >= job.gpus and t != self.starved_type
                    and self.start(job, Option(t, job.gpus, 1.0, 1, None), "as submitted while profiling",
                                   profiling=True)):
                self.p.stats["profiling_starts"] += 1

    def freeing_moves(self, gpu_type: str) -> list[tuple[float, int, Job, Option]]:
        """Per running job on `gpu_type`, its cheapest way to free GPUs there, as
        (value lost, GPUs freed, job, new option): shrink to its next lower Cell, or
        move to another type with free GPUs at no more GPUs than it has. Cheapest
        per GPU first; cached until this round's state changes (most blocked jobs
        change nothing, so a long queue costs one scan per type)."""
        cached = self._moves.get(gpu_type)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        moves = []
        for jid, (alloc, t) in self.cur.items():
            if t != gpu_type or jid in self.touched or jid in self.p.opportunistic_jobs:
                continue
            r = self.ctx.running[jid]
            if self.remaining_s(r) < self.p.restart_delay_s or not self.admissible(r):
                continue
            now_v, options = self.current_value(r), self.known(r)
            lower = max((c for (t2, c) in options if t2 == gpu_type and c < alloc.total), default=0)
            cands = [(now_v - options[(gpu_type, lower)].value, alloc.total - lower, options[(gpu_type, lower)])
                     ] if lower else []
            cands += [(now_v - o.value, alloc.total, o) for (t2, c), o in options.items()
                      if t2 != gpu_type and c <= alloc.total and t2 != self.starved_type and self.avail(t2, r) >= c]
            if cands:
                loss, freed, o = min(cands, key=lambda m: m[0] / m[1])
                moves.append((loss, freed, r, o))
        moves.sort(key=lambda m: m[0] / m[1])
        self._moves[gpu_type] = (self.version, moves)
        return moves

    def admit_by_rescaling(self, job: Job, opts: list[Option]) -> bool:
        best: tuple[float, Option, list] | None = None
        type_of = {jid: jt for jid, (_, jt) in self.cur.items()}
        for opt in opts:
            t = opt.gpu_type
            deficit = opt.gpus - self.avail(t, job)
            if deficit <= 0 or (t == self.starved_type and job.job_id not in self.starved):
                continue
            moves = self.freeing_moves(t)
            for chosen in (greedy_cover(moves, deficit, self.free, type_of, self.p.admit_depth),
                           single_cover(moves, deficit)):
                if chosen is not None:
                    total = opt.value - sum(m[0] for m in chosen)
                    if best is None or total > best[0]:
                        best = (total, opt, chosen)
        if best is None or best[0] <= self.p.admit_min_gain:
            return False
        total, opt, chosen = best
        saved = self._save()
        for loss, _, r, new in chosen:
            if not self.rescale(r, new, f"made room for {job.job_id} (Δ throughput {-loss:+.2f})"):
                self._restore(saved)
                return False
            self.p.shrunk_at[r.job_id] = self.now
        if not self.start(job, opt, f"admitted after {len(chosen)} rescale(s), Δ cluster throughput {total:+.2f}"):
            self._restore(saved)
            return False
        self.p.stats["admitted_by_rescaling"] += 1
        return True

    def _save(self) -> tuple:
        plan = self.plan
        return (plan.state.copy(), len(plan.decisions), len(plan.started), dict(self.cur), dict(self.free),
                set(self.touched), dict(self.p.stats), dict(self.p.opportunistic_jobs), dict(self.fresh))

    def _restore(self, saved: tuple) -> None:
        state, n_dec, n_started, cur, free, touched, stats, opp, fresh = saved
        plan = self.plan
        plan._state = state
        del plan.decisions[n_dec:]
        del plan.started[n_started:]
        self.cur, self.free, self.touched, self.fresh = cur, free, touched, fresh
        self.version += 1  # never reuse a version: cached moves of the abandoned branch stay stale
        self.p.stats.clear()
        self.p.stats.update(stats)
        self.p.opportunistic_jobs = opp

    def grow_pass(self) -> None:
        p = self.p
        candidates = []
        for jid, (alloc, t) in self.cur.items():
            if (jid in self.touched and jid not in self.fresh) or jid in p.opportunistic_jobs:
                continue
            r = self.job_of[jid]
            if not self.admissible(r) or (jid not in self.fresh
                                     and self.remaining_s(r) < p.min_remaining_factor * p.restart_delay_s):
                continue
            if self.now - p.shrunk_at.get(jid, -float("inf")) < p.regrow_hold_s:
                p.stats["regrowths_held"] += 1
                continue
            now_v = self.current_value(r)
            left = self.remaining_s(r)
            for (t2, c), o in self.known(r).items():
                if (c <= alloc.total) if t2 == t else (not p.grow_other_types and c > max(alloc.total, r.gpus)):
                    continue
                # the step must gain min_gain and, unless the job starts now, save more than its restart
                pays = jid in self.fresh or left * (1.0 - now_v / o.value) > p.restart_delay_s
                if o.value - now_v >= p.min_gain and pays:
                    candidates.append((o.value - now_v, jid, o))
        candidates.sort(key=lambda x: (-x[0], x[1]))
        steps, grown = 0, set()
        for delta, jid, o in candidates:
            if steps >= p.search_depth:
                break
            if jid in self.touched and (jid not in self.fresh or jid in grown):
                continue
            r = self.job_of[jid]
            alloc, t = self.cur[jid]
            need = o.gpus - (alloc.total if o.gpu_type == t else 0)
            if o.gpu_type == self.starved_type or self.avail(o.gpu_type, r) < need:
                continue
            if jid in self.fresh:
                if self.enlarge_start(r, o, delta):
                    grown.add(jid)
                    p.stats["grown"] += 1
                    steps += 1
                continue
            kind = "grown on idle GPUs" if o.gpu_type == t else "moved to a better GPU type"
            if self.rescale(r, o, f"{kind} (Δ throughput {delta:+.2f})"):
                p.stats["grown"] += 1
                steps += 1
                if p.shrunk_at.pop(jid, None) is not None:  # made room for a job, now grown back
                    p.stats["oscillations"] += 1

    def update_hold(self) -> None:
        """Admission made the first blocked job the head; nobody blocked → no head."""
        if all(j.job_id in self.touched for j in self.queue):
            self.p.held = None


__all__ = ["Crius", "Hold", "Option"]
