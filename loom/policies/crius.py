"""Crius (seed 002, patent seed 003): Cell-based, heterogeneity- and elasticity-aware scheduling.

Cells. Each job gets its candidate Cells once (`loom.perf.cells.build_cells`:
counts N/2, N, 2N × pipeline stages × GPU types of the cluster, N = requested
GPUs), cached per job. A (GPU type, count) option is worth its best Cell's
throughput divided by the job's throughput *as requested* (best Cell on its
requested type and N GPUs; the best N-GPU Cell of any type when it asked for no
type or that does not fit in memory): 1.0 = as requested. Cluster throughput is
the sum of these values over running jobs (a pending job counts 0). A job
without a `loom.perf` preset has one option per allowed type, N GPUs, worth 1.0.

Profiling delay. Crius profiles every Cell's stages on single devices, GPU
types in parallel: a job may start no earlier than
``submit + max over types (that type's candidate Cells × profiling_s_per_cell)``
(`profiling_delay_s[job_id]`, quoted in the start reason); a `Timer` wakes the
scheduler when the next job becomes ready.

One round (on every arrival / completion / timer), in this order:

1. *Opportunistic preemption (patent claim 5).* If the job holding GPUs (below)
   can now start on its held type using free GPUs plus those of the
   opportunistic jobs running there, those jobs are preempted (most recently
   started first, only as many as needed) and it starts.
2. *Resume first.* Ready pending jobs are ordered: starved jobs (waited
   > `starvation_s`) first, then previously started (preempted) jobs, then new
   jobs, each in arrival order; only the first `max_candidates` are considered.
   Running jobs scaled below their request are restored to N on their type
   (Resize) before any new job starts.
3. *Start pass.* Each candidate in order starts in its best-valued fitting option
   with at most N GPUs (ties: fewer GPUs), placed by the context's placer on
   that type's nodes, with that Cell's plan. Free GPUs held for a blocked job
   are off limits, except that with `opportunistic` a job of at most half the
   held job's size may run there and is marked opportunistic.
4. *Greedy search, `search_depth` steps.* Candidate actions that change running
   jobs, each scored by Δ cluster throughput:
   (a) scale a running job down to its N/2 Cell (2N → N first) so that the first
       blocked pending job fits: Δ = v(new job) + v(shrunk) − v(before);
   (b) scale a running job up to its 2N Cell on free, unheld GPUs of its type;
   (c) switch a running job to another GPU type (Migrate at the same count,
       Resize otherwise).
   Only the `max_candidates` largest running jobs are considered; (b) and (c)
   must gain at least `min_gain` and the job must have at least
   `min_remaining_factor × restart_delay_s` left (the checkpoint-restart cost,
   charged as `pause_s` on every Resize/Migrate). The best action with Δ > 0 is
   applied, the start pass reruns, and the loop repeats until `search_depth`
   actions were taken or none improves. A job changes at most once per round.
5. *Hold.* If the first pending candidate still cannot start, it holds its best
   N-GPU option's type: up to N free GPUs of that type are held for it (step 3).

Anti-starvation. A pending job that has waited more than `starvation_s` goes to
the front (step 2), and while it is blocked: no other job may start or grow on
the type it targets (its best N-GPU option whose type can hold N), and running
jobs there are shrunk (never below N/2 of their request, largest GPU release
first, outside the search depth) until it fits; opportunistic jobs there are
preempted. As running jobs on that type finish and nothing else may take their
GPUs, it eventually starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Migrate, Resize, Timer
from loom.core.jobs import Job
from loom.core.plan import ParallelPlan
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.errors import LoomInputError
from loom.hardware.state import Allocation
from loom.perf.cells import build_cells
from loom.perf.inputs import Hardware, TrainingJob
from loom.perf.presets import preset, preset_names
from loom.policies.throughput import Throughputs

DEFAULT_BATCH = 256


@dataclass(frozen=True, slots=True)
class Option:
    """A job on `gpus` GPUs of `gpu_type` with the best Cell's plan there."""

    gpu_type: str
    gpus: int
    value: float  # throughput relative to the job as requested
    stages: int
    plan: ParallelPlan | None


@dataclass(slots=True)
class JobCells:
    options: dict[tuple[str, int], Option]
    delay_s: float
    requested: int


def _check(name: str, value: float, ok: bool, rule: str) -> None:
    if not ok:
        raise LoomInputError(f"must be {rule}, got {value!r}", field=f"policy.params.{name}")


@POLICIES.register("crius")
class Crius:
    name = "crius"

    def __init__(self, search_depth: int = 3, restart_delay_s: float = 30.0, profiling_s_per_cell: float = 20.0,
                 starvation_s: float = 3600.0, opportunistic: bool = True, max_candidates: int = 16,
                 min_gain: float = 0.1, min_remaining_factor: float = 20.0) -> None:
        _check("search_depth", search_depth, isinstance(search_depth, int) and not isinstance(search_depth, bool)
               and search_depth >= 0, "a whole number ≥ 0")
        for name, v in (("restart_delay_s", restart_delay_s), ("profiling_s_per_cell", profiling_s_per_cell),
                        ("min_gain", min_gain), ("min_remaining_factor", min_remaining_factor)):
            _check(name, v, isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                   "a finite number ≥ 0")
        _check("starvation_s", starvation_s, isinstance(starvation_s, (int, float)) and not isinstance(
            starvation_s, bool) and starvation_s > 0, "a number > 0")
        _check("opportunistic", opportunistic, isinstance(opportunistic, bool), "true or false")
        _check("max_candidates", max_candidates, isinstance(max_candidates, int) and not isinstance(
            max_candidates, bool) and max_candidates >= 1, "a whole number ≥ 1")
        self.search_depth = search_depth
        self.restart_delay_s = float(restart_delay_s)
        self.profiling_s_per_cell = float(profiling_s_per_cell)
        self.starvation_s = float(starvation_s)
        self.opportunistic = opportunistic
        self.max_candidates = max_candidates
        self.min_gain = float(min_gain)
        self.min_remaining_factor = float(min_remaining_factor)
        self.profiling_delay_s: dict[str, float] = {}
        self.held: tuple[str, str, int] | None = None  # (job id, GPU type, GPUs) held for a blocked head
        self.opportunistic_jobs: dict[str, str] = {}  # job id → the job whose held GPUs it runs on
        self.stats = {"starts": 0, "resizes": 0, "migrations": 0, "opportunistic_starts": 0,
                      "opportunistic_preemptions": 0, "starved_shrinks": 0}
        self._cells: dict[str, JobCells] = {}
        self._timers: set[float] = set()
        self._topo_key: int | None = None
        self._hardware: dict[str, Hardware] = {}
        self._type_masks: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------ Cells
    def _setup(self, ctx: SchedulingContext) -> None:
        if self._topo_key == id(ctx.topology):
            return
        topo = ctx.topology
        self._topo_key = id(topo)
        self._hardware = {}
        self._type_masks = {}
        for tid, t in enumerate(topo.gpu_types):
            mask = topo.node_type == tid
            self._type_masks[t] = mask
            self._hardware[t] = Hardware(t, gpus_per_node=int(topo.node_gpus[mask].max()))
        self._capacity = {t: int(topo.node_gpus[m].sum()) for t, m in self._type_masks.items()}
        self._throughputs = Throughputs(topo)

    def cells_of(self, job: Job) -> JobCells:
        cached = self._cells.get(job.job_id)
        if cached is not None:
            return cached
        spec, n = job.spec, job.gpus
        allowed = [t for t in self._hardware if (spec.gpu_types is None or t in spec.gpu_types)]
        options: dict[tuple[str, int], Option] = {}
        per_type: dict[str, int] = {}
        if spec.model and spec.model in preset_names():
            batch = spec.batch_size or DEFAULT_BATCH
            tj = TrainingJob(preset(spec.model), -(-batch // (2 * n)) * (2 * n))
            estimates = build_cells(tj, n, {t: self._hardware[t] for t in allowed})
            best: dict[tuple[str, int], object] = {}
            for ce in estimates:
                per_type[ce.cell.gpu_type] = per_type.get(ce.cell.gpu_type, 0) + 1
                key = (ce.cell.gpu_type, ce.cell.gpus)
                if ce.estimate is not None and (key not in best or ce.tokens_per_s > best[key].tokens_per_s):
                    best[key] = ce
            ref = best[(spec.gpu_type, n)].tokens_per_s if (spec.gpu_type, n) in best else 0.0
            if ref <= 0:
                ref = max((ce.tokens_per_s for (t, c), ce in best.items() if c == n), default=0.0)
            if ref <= 0:
                ref = max((ce.tokens_per_s for ce in best.values()), default=0.0)
            for key, ce in best.items():
                if ref > 0 and key[1] <= self._capacity[key[0]]:
                    plan = ce.estimate.plan
                    options[key] = Option(key[0], key[1], ce.tokens_per_s / ref, ce.cell.stages,
                                          plan if plan.world_size == key[1] else None)
        if not options and spec.model and spec.model in preset_names():
            # No Cell fits in memory (e.g. a large Wide-ResNet: the estimator has no
            # offload or expert parallelism): value options by the throughput the
            # speed model charges anyway (fastest plan ignoring memory), so such jobs
            # can still move to faster GPUs or scale.
            ref = self._throughputs.of(spec, spec.gpu_type or allowed[0], n, dp_only=True)
            for t in allowed:
                for count in {max(1, n // 2), n, 2 * n}:
                    thr = self._throughputs.of(spec, t, count, dp_only=True)
                    if ref > 0 and thr > 0 and count <= self._capacity[t]:
                        options[(t, count)] = Option(t, count, thr / ref, 1, None)
        if not options:  # no preset: the request as given
            types = [spec.gpu_type] if spec.gpu_type in self._hardware else allowed
            for t in types:
                if n <= self._capacity[t]:
                    options[(t, n)] = Option(t, n, 1.0, 1, None)
                per_type[t] = 1
        delay = max(per_type.values(), default=0) * self.profiling_s_per_cell
        cells = JobCells(options, delay, n)
        self._cells[job.job_id] = cells
        self.profiling_delay_s[job.job_id] = delay
        return cells

    def value(self, job: Job, gpu_type: str, gpus: int) -> float:
        opt = self.cells_of(job).options.get((gpu_type, gpus))
        return opt.value if opt else 0.0

    # ------------------------------------------------------------ round
    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        self._setup(ctx)
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
        # forget state about jobs that are gone
        p = policy
        p.opportunistic_jobs = {j: h for j, h in p.opportunistic_jobs.items() if j in ctx.running}
        if p.held is not None and p.held[0] not in ctx.pending:
            p.held = None
        self.starved_type: str | None = None

    # -- helpers ---------------------------------------------------------------
    def free_of(self, gpu_type: str) -> int:
        return int(self.plan.view.free[self.p._type_masks[gpu_type]].sum())

    def held_free(self, gpu_type: str) -> int:
        """Free GPUs of `gpu_type` held for the blocked head (0 if none there)."""
        held = self.p.held
        if held is None or held[1] != gpu_type:
            return 0
        return min(self.free_of(gpu_type), held[2])

    def place(self, job: Job, gpu_type: str, gpus: int) -> Allocation | None:
        state = self.plan.view
        mask = state.usable_mask(None, gpu_type)
        if gpus > state.free_total:
            return None
        return self.plan.placer.place(job.spec, gpus, state, mask)

    def remaining_s(self, job: Job) -> float:
        return job.expected_end(self.now) - self.now

    def describe(self, opt: Option) -> str:
        return (f"{opt.gpus}×{opt.gpu_type}, {opt.stages} stage{'s' if opt.stages > 1 else ''} "
                f"(cell throughput {opt.value:.2f}× requested)")

    def ready(self, job: Job) -> bool:
        cells = self.p.cells_of(job)
        return self.now >= job.spec.submit_time + cells.delay_s - 1e-9

    def current_value(self, job: Job) -> float:
        alloc, t = self.cur[job.job_id]
        return self.p.value(job, t, alloc.total)

    # -- actions ---------------------------------------------------------------
    def start(self, job: Job, opt: Option, why: str, opportunistic_for: str | None = None) -> bool:
        alloc = self.place(job, opt.gpu_type, opt.gpus)
        if alloc is None:
            return False
        delay = self.p.profiling_delay_s[job.job_id]
        verb = "resume" if job.first_start is not None else "start"
        reason = f"crius: {verb} {job.job_id} on {self.describe(opt)}; {why}; profiled {delay:.0f}s"
        if opportunistic_for is not None:
            reason += f"; opportunistic on GPUs held for {opportunistic_for}"
            self.p.opportunistic_jobs[job.job_id] = opportunistic_for
            self.p.stats["opportunistic_starts"] += 1
        self.plan.start(job, alloc, reason, opt.plan)
        self.touched.add(job.job_id)
        self.p.stats["starts"] += 1
        return True

    def rescale(self, job: Job, opt: Option, why: str) -> bool:
        """Resize (count changes) or Migrate (same count, other type) `job` to `opt`."""
        old, old_type = self.cur[job.job_id]
        state = self.plan.state
        state.release(old)
        if opt.gpu_type == old_type and opt.gpus < old.total:  # shrink in place
            nodes, gpus, left = [], [], opt.gpus
            for node, g in zip(old.nodes, old.gpus):
                if left <= 0:
                    break
                take = min(g, left)
                nodes.append(node)
                gpus.append(take)
                left -= take
            alloc: Allocation | None = Allocation(tuple(nodes), tuple(gpus))
        else:
            alloc = self.place(job, opt.gpu_type, opt.gpus)
        if alloc is None:
            state.allocate(old)
            return False
        state.allocate(alloc)
        pause = self.p.restart_delay_s
        if opt.gpus == old.total and opt.gpu_type != old_type:
            reason = (f"crius: migrate {job.job_id} {old.total}×{old_type} → {self.describe(opt)}; {why}; "
                      f"restart {pause:.0f}s")
            self.plan.decisions.append(Migrate(job.job_id, alloc, reason, pause))
            self.p.stats["migrations"] += 1
        else:
            reason = (f"crius: resize {job.job_id} {old.total}×{old_type} → {self.describe(opt)}; {why}; "
                      f"restart {pause:.0f}s")
            self.plan.decisions.append(Resize(job.job_id, alloc, reason, opt.plan, pause))
            self.p.stats["resizes"] += 1
        self.cur[job.job_id] = (alloc, opt.gpu_type)
        self.touched.add(job.job_id)
        return True

    # -- steps -----------------------------------------------------------------
    def run(self) -> None:
        ctx, p = self.ctx, self.p
        pending = [j for j in ctx.pending.values()]
        for job in pending:
            p.cells_of(job)
        waiting = [j for j in pending if not self.ready(j)]
        if waiting:
            at = min(j.spec.submit_time + p.profiling_delay_s[j.job_id] for j in waiting)
            if at not in p._timers and at >= self.now:
                p._timers.add(at)
                self.extra.append(Timer(at, f"crius: {len([j for j in waiting])} job(s) profiling until then"))
        ready = [j for j in pending if self.ready(j) and p.cells_of(j).options]
        starved = {j.job_id for j in ready if self.now - j.spec.submit_time > p.starvation_s}
        ready.sort(key=lambda j: (j.job_id not in starved, j.first_start is None, j.key))
        queue = ready[: p.max_candidates]
        self.queue = queue
        self.starved = starved
        self.step_opportunistic()
        self.restore_scaled_down()
        self.start_pass()
        self.anti_starvation()
        for _ in range(p.search_depth):
            if not self.search_step():
                break
            self.start_pass()
        self.update_hold()

    def remaining_queue(self) -> list[Job]:
        return [j for j in self.queue if j.job_id not in self.touched]

    def target(self, job: Job) -> Option | None:
        """The N-GPU option a blocked job waits for: best value on a type that can hold it."""
        opts = [o for o in self.p.cells_of(job).options.values() if o.gpus == job.gpus]
        if not opts:
            opts = list(self.p.cells_of(job).options.values())
        return max(opts, key=lambda o: (o.value, -o.gpus), default=None)

    def step_opportunistic(self) -> None:
        p = self.p
        if p.held is None:
            return
        head_id, t, n = p.held
        head = self.ctx.pending.get(head_id)
        if head is None:
            p.held = None
            return
        guests = [self.ctx.running[j] for j, h in p.opportunistic_jobs.items()
                  if h == head_id and j in self.ctx.running and self.cur[j][1] == t]
        opt = p.cells_of(head).options.get((t, n))
        if opt is None:
            p.held = None
            return
        tag = "starved: priority, " if head_id in self.starved else ""
        if self.start(head, opt, f"{tag}held GPUs now free"):
            p.held = None
            return
        if not guests:
            return
        guests.sort(key=lambda g: -(g.last_start or 0.0))
        trial = self.plan.fork()
        chosen = []
        for g in guests:
            trial.state.release(self.cur[g.job_id][0])
            chosen.append(g)
            if self._fits(trial, head, t, n):
                for v in chosen:
                    self.plan.preempt(v, f"crius: opportunistic job {v.job_id} preempted: {head_id} can start "
                                         f"on its held {t} GPUs")
                    p.opportunistic_jobs.pop(v.job_id, None)
                    self.touched.add(v.job_id)
                    p.stats["opportunistic_preemptions"] += 1
                if self.start(head, opt, f"{tag}preempted {len(chosen)} opportunistic job(s)"):
                    p.held = None
                return

    def _fits(self, trial: RoundPlan, job: Job, t: str, n: int) -> bool:
        state = trial.view
        return self.plan.placer.place(job.spec, n, state, state.usable_mask(None, t)) is not None

    def restore_scaled_down(self) -> None:
        for jid, (alloc, t) in list(self.cur.items()):
            job = self.ctx.running[jid]
            if jid in self.touched or jid in self.p.opportunistic_jobs or alloc.total >= job.gpus:
                continue
            opt = self.p.cells_of(job).options.get((t, job.gpus))
            if opt is None or t == self.starved_type:
                continue
            if self.free_of(t) - self.held_free(t) >= job.gpus - alloc.total:
                self.rescale(job, opt, f"restored to its request ({alloc.total} → {job.gpus} GPUs)")

    def usable(self, job: Job, opt: Option) -> tuple[bool, bool]:
        """(may start there, opportunistically) given held / starved GPUs."""
        t = opt.gpu_type
        held = self.p.held
        if self.starved_type == t and held is not None and held[0] != job.job_id:
            return False, False
        free = self.free_of(t)
        if held is None or held[0] == job.job_id or held[1] != t:
            return free >= opt.gpus, False
        h = min(free, held[2])
        if free - h >= opt.gpus:
            return True, False
        if (self.p.opportunistic and free >= opt.gpus and opt.gpus * 2 <= held[2]
                and held[0] not in self.starved):
            return True, True
        return False, False

    def start_pass(self) -> None:
        queue = list(self.remaining_queue())
        for position, job in enumerate(queue):
            # Nobody waits behind it: start in the 2N Cell at once when that is
            # better (no restart cost later); otherwise at most its request.
            limit = job.gpus * 2 if position == len(queue) - 1 else job.gpus
            opts = sorted((o for o in self.p.cells_of(job).options.values() if o.gpus <= limit),
                          key=lambda o: (-o.value, o.gpus))
            for opt in opts:
                ok, opp = self.usable(job, opt)
                if not ok:
                    continue
                why = "starved: priority" if job.job_id in self.starved else "queue order"
                if self.start(job, opt, why, self.p.held[0] if opp and self.p.held else None):
                    break

    def anti_starvation(self) -> None:
        blocked = [j for j in self.remaining_queue() if j.job_id in self.starved]
        if not blocked:
            return
        job = blocked[0]
        opt = self.target(job)
        if opt is None:
            return
        t = opt.gpu_type
        self.p.held = (job.job_id, t, opt.gpus)
        self.starved_type = t
        # preempt opportunistic guests on its type, shrink elastic jobs there (never below N/2)
        for gid, h in list(self.p.opportunistic_jobs.items()):
            if gid in self.ctx.running and self.cur[gid][1] == t and gid not in self.touched:
                self.plan.preempt(self.ctx.running[gid], f"crius: opportunistic job {gid} preempted for starved "
                                                         f"{job.job_id}")
                self.p.opportunistic_jobs.pop(gid, None)
                self.touched.add(gid)
                self.p.stats["opportunistic_preemptions"] += 1
        if self.start(job, opt, "starved: priority"):
            self.p.held = None
            return
        shrinkable = []
        for jid, (alloc, jt) in self.cur.items():
            r = self.ctx.running[jid]
            if jt != t or jid in self.touched:
                continue
            half = r.gpus // 2 if r.gpus % 2 == 0 else r.gpus
            target = r.gpus if alloc.total > r.gpus else half
            o = self.p.cells_of(r).options.get((t, target))
            if o is not None and target < alloc.total:
                shrinkable.append((alloc.total - target, r, o))
        shrinkable.sort(key=lambda x: -x[0])
        for _, r, o in shrinkable:
            if self.rescale(r, o, f"shrunk for starved job {job.job_id} (waited "
                                  f"{self.now - job.spec.submit_time:.0f}s)"):
                self.p.stats["starved_shrinks"] += 1
                if self.start(job, opt, "starved: priority, after shrinking running jobs"):
                    self.p.held = None
                    return

    def search_step(self) -> bool:
        """One greedy step: apply the running-job change with the largest Δ throughput."""
        p = self.p
        running = [self.ctx.running[j] for j in self.cur if j not in self.touched and j not in p.opportunistic_jobs]
        running.sort(key=lambda j: -self.cur[j.job_id][0].total)
        running = running[: p.max_candidates]
        best: tuple[float, object] | None = None
        blocked = self.remaining_queue()
        # (a) shrink a running job so the first blocked job fits
        if blocked:
            job = blocked[0]
            for r in running:
                alloc, t = self.cur[r.job_id]
                target = r.gpus if alloc.total > r.gpus else (r.gpus // 2 if r.gpus % 2 == 0 else 0)
                shrunk = p.cells_of(r).options.get((t, target))
                if not target or shrunk is None or target >= alloc.total:
                    continue
                freed = alloc.total - target
                for opt in p.cells_of(job).options.values():
                    if opt.gpu_type != t or opt.gpus > job.gpus or t == self.starved_type:
                        continue
                    if self.free_of(t) - self.held_free(t) + freed < opt.gpus:
                        continue
                    delta = opt.value + shrunk.value - self.current_value(r)
                    if delta > 0 and (best is None or delta > best[0]):
                        best = (delta, ("shrink", r, shrunk, job, opt))
        for r in running:
            alloc, t = self.cur[r.job_id]
            if self.remaining_s(r) < p.min_remaining_factor * p.restart_delay_s:
                continue
            now_v = self.current_value(r)
            for opt in p.cells_of(r).options.values():
                if opt.gpu_type == self.starved_type:
                    continue
                if opt.gpu_type == t:  # (b) scale up on free, unheld GPUs
                    if opt.gpus <= alloc.total or blocked:
                        continue
                    if self.free_of(t) - self.held_free(t) < opt.gpus - alloc.total:
                        continue
                else:  # (c) switch GPU type, at most the GPUs it has now
                    if opt.gpus > max(alloc.total, r.gpus):
                        continue
                    if self.free_of(opt.gpu_type) - self.held_free(opt.gpu_type) < opt.gpus:
                        continue
                delta = opt.value - now_v
                if delta >= p.min_gain and (best is None or delta > best[0]):
                    best = (delta, ("move", r, opt))
        if best is None:
            return False
        delta, action = best
        if action[0] == "shrink":
            _, r, shrunk, job, opt = action
            if not self.rescale(r, shrunk, f"scaled down to make room for {job.job_id} (Δ throughput "
                                           f"{delta:+.2f})"):
                return False
            self.start(job, opt, f"after scaling {r.job_id} down")
            return True
        _, r, opt = action
        _, t = self.cur[r.job_id]
        kind = "scaled up on idle GPUs" if opt.gpu_type == t else "moved to a better GPU type"
        return self.rescale(r, opt, f"{kind} (Δ throughput {delta:+.2f})")

    def update_hold(self) -> None:
        p = self.p
        blocked = self.remaining_queue()
        if not blocked:
            p.held = None
            return
        head = blocked[0]
        if p.held is not None and p.held[0] == head.job_id:
            return
        if p.held is not None and p.held[0] in self.starved and p.held[0] in self.ctx.pending:
            return
        opt = self.target(head)
        p.held = None if opt is None else (head.job_id, opt.gpu_type, opt.gpus)


__all__ = ["Crius", "Option"]
