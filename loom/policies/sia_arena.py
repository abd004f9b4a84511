"""Sia as the Crius/Arena artifact's simulator runs it (the baseline Crius is
compared against there), rebuilt on Loom's engine — not Loom's own `sia`.

Rules as built here (Arena source in parentheses; Arena's code is not copied)
------------------------------------------------------------------------------
* **Rounds.** Decisions only on a `round_s` grid (300 s) anchored at the first
  call; an arrival or completion between grid points asks for a `Timer` at the
  next one (simulator.py `Simulator.simulate` loop, macro_def
  `SCHEDULING_INTERVAL`; scheduler.py `Scheduler._update_timer`).
* **When it solves.** Only in rounds with news: if jobs finished since the
  last round, the waiting jobs are retried first, in queue order, none blocking
  the rest; then the jobs that arrived, first come first served. Waiting jobs
  are *not* retried in rounds with only arrivals (sia_sched.py
  `SiaSched.schedule`, `_sia_optimize_running_jobs`,
  `_sia_pending_jobs_restart_trial`, `_sia_fit_new_jobs`; order: scheduler.py
  `_sort_jobs`/`_get_job_priority` = submit time).
* **Drop.** A job that cannot run at its requested size on any GPU type (best
  plan) is never started and kept in `self.dropped` (`_sia_fit_new_jobs`).
* **New job's configuration.** GPU type (any, or `spec.gpu_types`) and count
  from powers of two up to `max_gpus` (16); the request size is ignored. The
  belief is linear DP scaling: goodput = count × DP-only single-GPU
  throughput (`_init_throughput_model`, `_gen_goodput_matrix`, macro_def
  `SUPPORTED_GPU_NUM_LIST`). Of the configurations the job can really run
  (best-plan throughput > 0) that fit the free GPUs of the type, the highest
  goodput wins (ties: fewer GPUs, then type order). Arena's ILP gives the
  arriving job a +1000 bonus so it is always allocated when anything fits
  (`_optimize_global_allocation`, `not_alloc_penalty`). Only that one
  configuration is tried: if the placer cannot place it the job waits
  (`_sia_fit_one_job`, `_sia_resource_allocation`).
* **Existing jobs.** Never preempted, never resized (Arena re-places a job
  only when its GPU type changes, with its old count: `_sia_admission_control`).
  After a job is placed, up to `max_moves` (3) running jobs move, same count,
  to a type of higher single-GPU DP throughput where they can be placed, best
  utility gain first, gain = √(f·n)(√s_new − √s_old) with Arena's
  realloc factor f = max((t_run − k·cap)/(t_run + cap), 0.01), k = restarts so
  far (`_optimize_global_allocation`: `p_fairness` 0.5, `MAX_MGRT_JOB_NUM`).
  Jobs started or moved this round do not move again.
* **Restart cost.** Each start (first start included) and each move costs
  min(`restart_s_per_gpu` × GPUs, `restart_cap_s`) s (scheduler.py
  `_get_cluster_perf`, macro_def `RESCHED_OVERHEAD_WITHOUT_PRUNE`, `MAX_...`).
  Arena only pauses *progress* for whole rounds: a cost ≤ one round only
  discounts its reported throughput, a larger one skips ceil(cost/round) − 1
  rounds (`_get_cluster_perf` time debt, `_update_and_check_end`). With
  `quantise_cost=True` (default) the charge is that progress loss (150 s/GPU,
  cap 600: 0 s for 1–2 GPUs, 300 s for 4+); with False the cost itself.
  Loom's `Start` carries no pause, so a first start is charged by a `Migrate`
  to the same GPUs at the same instant (it adds one to the job's migration
  count); `first_start_cost=False` skips it.

Not reproduced: the ILP itself (greedy instead: new job first, then moves,
where Arena trades them jointly); its capacity view (total GPUs minus the
configurations it believes, which drifts from reality after failed
placements — we use the really free GPUs); its DP out-of-memory rejection of
configurations (Loom's DP estimate ignores memory); round-quantised job ends.

Versus Loom's `sia`: that one re-solves every round for all jobs, preempts,
resizes and moves any job, sizes around the request (÷/× `max_scale`) from
DP estimates, uses p < 0 fairness and a 30-s pause; this one only places
arrivals (and retries waiting jobs after completions), never takes GPUs back.

Parameters: `round_s` (in [1, 3600], default 300), `restart_s_per_gpu` (≥ 0,
150), `restart_cap_s` (≥ 0, 600), `max_gpus` (integer ≥ 1, 16), `max_moves`
(integer ≥ 0, 3), `quantise_cost` (bool, True), `first_start_cost` (bool, True).
"""

from __future__ import annotations

import math

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Migrate, Timer
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.policies import params
from loom.policies.elastic_common import place_on, power_sizes, type_of
from loom.policies.throughput import Throughputs, with_dp_plans

EPS = 1e-6
P_FAIRNESS = 0.5  # Arena's p_fairness: utility = (f · goodput) ** 0.5


class ArenaRounds:
    """Arena's scheduling rounds, shared by the Arena baselines: decisions only on a `round_s`
    grid anchored at the first call, and only in rounds with news — jobs not `seen` before, or
    jobs gone since the last round (`live`) — an arrival or completion between grid points asks
    for a `Timer` at the next one (simulator.py `Simulator.simulate`, scheduler.py `_update_timer`)."""

    def __init__(self, round_s: float, name: str) -> None:
        self.round_s, self.name = round_s, name
        self.anchor: float | None = None
        self.last_round = -math.inf
        self.timer_at = -math.inf
        self.seen: set[str] = set()
        self.live: set[str] = set()  # jobs queued or running after the last round

    def news(self, ctx: SchedulingContext) -> tuple[list[Decision] | None, list[Job], bool, set[str]]:
        """(what to return now instead of running a round — None: run one —, jobs that arrived,
        whether any left, the ids queued or running now)."""
        if self.anchor is None:
            self.anchor = ctx.now
        steps = math.ceil((ctx.now - self.anchor) / self.round_s - EPS)
        boundary = self.anchor + steps * self.round_s
        live = set(ctx.pending) | set(ctx.running)
        arrived = [j for j in ctx.pending.values() if j.job_id not in self.seen]
        departed = bool(self.live - live)
        if not arrived and not departed:
            return [], arrived, departed, live
        if ctx.now < boundary - EPS:  # between rounds: wake up at the next one
            if self.timer_at == boundary:
                return [], arrived, departed, live
            self.timer_at = boundary
            return [Timer(boundary, f"{self.name}: next {self.round_s:.0f}-s round")], arrived, departed, live
        if ctx.now == self.last_round:
            return [], arrived, departed, live
        self.last_round = ctx.now
        return None, arrived, departed, live


@POLICIES.register("sia-arena")
class SiaArena:
    name = "sia-arena"

    def __init__(self, round_s: float = 300.0, restart_s_per_gpu: float = 150.0, restart_cap_s: float = 600.0,
                 max_gpus: int = 16, max_moves: int = 3, quantise_cost: bool = True,
                 first_start_cost: bool = True) -> None:
        self.round_s = params.number(round_s, "round_s", low=1, high=3600)
        self.restart_s_per_gpu = params.number(restart_s_per_gpu, "restart_s_per_gpu", low=0)
        self.restart_cap_s = params.number(restart_cap_s, "restart_cap_s", low=0)
        self.max_gpus = params.integer(max_gpus, "max_gpus", low=1)
        self.max_moves = params.integer(max_moves, "max_moves", low=0)
        self.quantise_cost = params.boolean(quantise_cost, "quantise_cost")
        self.first_start_cost = params.boolean(first_start_cost, "first_start_cost")
        self.dropped: dict[str, str] = {}  # job id → why it is never started
        self.restarts: dict[str, int] = {}  # job id → starts + moves so far (Arena's resched count)
        self._rounds = ArenaRounds(self.round_s, self.name)
        self._tp: Throughputs | None = None
        self._speeds: dict[tuple[str, str], float] = {}  # (job, type) → `_speed`

    # -- costs and beliefs -------------------------------------------------------
    def restart_cost(self, gpus: int) -> float:
        """Arena's reallocation cost in seconds, and what it costs in progress here."""
        cost = min(self.restart_s_per_gpu * gpus, self.restart_cap_s)
        if not self.quantise_cost:
            return cost
        return self.round_s * max(0, math.ceil(cost / self.round_s - EPS) - 1)

    def _speed(self, job: Job, gpu_type: str) -> float:
        """DP-only single-GPU throughput: Arena's per-GPU goodput under linear scaling."""
        key = (job.job_id, gpu_type)
        speed = self._speeds.get(key)
        if speed is None:
            assert self._tp is not None
            speed = self._speeds[key] = self._tp.of(job.spec, gpu_type, 1, dp_only=True)
        return speed

    def _runs(self, job: Job, gpu_type: str, gpus: int) -> bool:
        assert self._tp is not None
        return self._tp.runs(job.spec, gpu_type, gpus)

    def _types(self, ctx: SchedulingContext, job: Job) -> list[str]:
        return [t for t in ctx.topology.gpu_types if not job.spec.gpu_types or t in job.spec.gpu_types]

    # -- the round ---------------------------------------------------------------
    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if self._tp is None or self._tp.topology is not ctx.topology:
            self._tp = Throughputs(ctx.topology)
            self._speeds.clear()
        wait, arrived, departed, live = self._rounds.news(ctx)
        if wait is not None:
            return wait
        plan = RoundPlan(ctx)
        touched: set[str] = set()
        if departed:  # restart trial of the waiting jobs, in queue order
            for job in [j for j in ctx.pending.values() if j.job_id in self._rounds.seen]:
                if job.job_id not in self.dropped:
                    self._fit(plan, job, touched)
        for job in sorted(arrived, key=lambda j: (j.spec.submit_time, j.key)):
            self._rounds.seen.add(job.job_id)
            if not any(self._runs(job, t, job.spec.gpus) for t in self._types(ctx, job)):
                self.dropped[job.job_id] = f"cannot run on {job.spec.gpus} GPUs of any type"
                continue
            self._fit(plan, job, touched)
        self._rounds.live = live
        return with_dp_plans(plan.decisions, ctx, self._tp)

    def _fit(self, plan: RoundPlan, job: Job, touched: set[str]) -> bool:
        config = self._best_config(plan, job)
        if config is None:
            return False
        gpu_type, gpus = config
        alloc = place_on(plan, job, gpus, gpu_type)
        if alloc is None:
            return False
        plan.start(job, alloc, f"sia-arena: {gpus} × {gpu_type}, linear DP goodput "
                               f"{gpus * self._speed(job, gpu_type):.3g} it/s (request {job.spec.gpus})")
        touched.add(job.job_id)
        self.restarts[job.job_id] = self.restarts.get(job.job_id, 0) + 1
        pause = self.restart_cost(gpus)
        if self.first_start_cost and pause > 0:
            plan.decisions.append(Migrate(job.job_id, alloc, f"sia-arena: start cost {pause:.0f} s "
                                                              f"(same GPUs; Start carries no pause)", pause))
        self._moves(plan, touched)
        return True

    def _free(self, plan: RoundPlan, gpu_type: str) -> int:
        state = plan.view
        mask = state.usable_mask(None, gpu_type, None)
        return state.free_total if mask is None else int(state.free[mask].sum())

    def _best_config(self, plan: RoundPlan, job: Job) -> tuple[str, int] | None:
        best: tuple[float, int, int, str] | None = None
        for rank, t in enumerate(self._types(plan.ctx, job)):
            free = self._free(plan, t)
            speed = self._speed(job, t)
            for g in power_sizes(1, 1, min(free, self.max_gpus)):
                if speed <= 0 or not self._runs(job, t, g):
                    continue
                key = (g * speed, -g, -rank, t)
                if best is None or key > best:
                    best = key
        return None if best is None else (best[3], -best[1])

    def _factor(self, job: Job, now: float) -> float:
        run_s = now - (job.first_start if job.first_start is not None else now)
        k = self.restarts.get(job.job_id, 0)
        return max((run_s - k * self.restart_cap_s) / (run_s + self.restart_cap_s), 0.01)

    def _moves(self, plan: RoundPlan, touched: set[str]) -> None:
        ctx = plan.ctx
        for _ in range(self.max_moves):
            best: tuple[float, int, Job, str] | None = None
            free = {t: self._free(plan, t) for t in ctx.topology.gpu_types}
            for job in ctx.running.values():
                if job.job_id in touched or job.allocation is None:
                    continue
                old = type_of(ctx.topology, job.allocation)
                n = job.allocation.total
                base = max(self._speed(job, old), 0.0) ** P_FAIRNESS
                weight = (self._factor(job, ctx.now) * n) ** P_FAIRNESS
                for t in self._types(ctx, job):
                    gain = weight * (max(self._speed(job, t), 0.0) ** P_FAIRNESS - base)
                    better = best is None or (gain, -job.key) > (best[0], -best[1])
                    if better and t != old and gain > 0 and n <= free[t] and self._runs(job, t, n):
                        best = (gain, job.key, job, t)
            if best is None or not self._move(plan, best[2], best[3], touched):
                return

    def _move(self, plan: RoundPlan, job: Job, gpu_type: str, touched: set[str]) -> bool:
        old = job.allocation
        assert old is not None
        new = place_on(plan, job, old.total, gpu_type)
        touched.add(job.job_id)
        if new is None:
            return True  # this job cannot move now; others still may
        plan.state.allocate(new)
        plan.state.release(old)
        self.restarts[job.job_id] = self.restarts.get(job.job_id, 0) + 1
        pause = self.restart_cost(old.total)
        plan.decisions.append(Migrate(job.job_id, new, f"sia-arena: moved to {old.total} × {gpu_type} "
                                                       f"(higher DP goodput), restart cost {pause:.0f} s", pause))
        return True
