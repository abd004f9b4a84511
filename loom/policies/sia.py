"""Sia (Jayaram Subramanya et al., SOSP'23): heterogeneity-aware, goodput-based
elastic allocation, re-solved every round.

Rules as built here
-------------------
* **Rounds.** The policy acts at round boundaries only, every `round_s`
  seconds, kept going with `Timer` decisions while any job is queued or
  running; a job arriving between rounds waits for the next one (at an idle
  cluster the first arrival opens a round at once).
* **Goodput = throughput.** Sia multiplies throughput by a statistical
  efficiency learned online; Loom has no such model, so goodput is the DP-only
  throughput estimate, normalised to the job's request:
  `Throughputs.normalised(spec, type, g, dp_only=True)` (1.0 = its request).
* **Configurations.** Every GPU type the job may use (`spec.gpu_types` when
  given, otherwise all types: Sia chooses the type and ignores
  `spec.gpu_type`), and power-of-two counts from request ÷ `max_scale` to
  request × `max_scale` (plus the request), within the type's capacity.
* **Objective.** Maximise Σ_j u(goodput_j) with u(x) = x^p / p (p < 0: fairness
  — every job gets something before any grows; p = 0: log). A running job's
  goodput in a configuration other than its current one is discounted by
  `1 − pause_s / round_s` (Sia's restart penalty). Per-type capacity is the
  healthy GPUs of that type.
* **Solver.** Greedy (not Sia's ILP). Phase 1: jobs in order of decreasing
  request (hardest to fit first) each take the free configuration of at most
  their request with the highest utility. Phase 2: repeatedly apply the
  configuration change with the highest utility gain per added GPU that fits
  the remaining capacity (same-type growth, or a move to another type),
  until no change gains. A lazy heap keeps this near O(moves · log jobs).
* **Applying.** Changed running jobs get `Resize` (other count) or `Migrate`
  (same count, other type), both carrying `pause_s`; jobs without a
  configuration are preempted; a running job whose new shape cannot be placed
  keeps its GPUs this round.

* **Profiling.** Sia profiles a new job before it first runs: one single-GPU
  profile per GPU type, types in parallel (Sia §4: a few batch sizes on one GPU
  of each type bootstrap its goodput model), so a job joins the rounds
  `profiling_s` after it arrives — one Crius Cell's profile, where Crius
  profiles every Cell of every type (issue 23: every policy that profiles pays
  for it). An idle cluster opens a round as soon as a job is profiled. With
  `reuse_profiles` (the rule Crius follows too) a job whose (model, batch)
  was profiled for an earlier job is ready when that profile is.

Parameters: `round_s` (in [1, 3600], default 120), `p` (< 1, default −0.5),
`pause_s` (≥ 0, default 30), `max_scale` (integer ≥ 1, default 4),
`profiling_s` (≥ 0, default 20), `reuse_profiles` (default true).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Timer
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.policies import params
from loom.policies.elastic_common import (
    Target,
    apply_targets,
    healthy_capacity,
    power_sizes,
    type_of,
)
from loom.policies.throughput import Throughputs, with_dp_plans

EPSILON = 1e-3  # goodput of "no GPUs" in the utility (x^p is infinite at 0 for p < 0)


@POLICIES.register("sia")
class Sia:
    name = "sia"

    def __init__(self, round_s: float = 120.0, p: float = -0.5, pause_s: float = 30.0, max_scale: int = 4,
                 profiling_s: float = 20.0, reuse_profiles: bool = True) -> None:
        self.round_s = params.number(round_s, "round_s", low=1, high=3600)
        self.p = params.number(p, "p", high=1, high_open=True)
        self.pause_s = params.number(pause_s, "pause_s", low=0)
        self.max_scale = params.integer(max_scale, "max_scale", low=1)
        self.profiling_s = params.number(profiling_s, "profiling_s", low=0)
        self.reuse_profiles = params.boolean(reuse_profiles, "reuse_profiles")
        self.profiled_at: dict[object, float] = {}  # (model, batch) or job id → when its profile is ready
        self.next_round = -math.inf
        self.rounds_solved = 0
        self._tp: Throughputs | None = None
        self._keep = 1.0 - min(1.0, self.pause_s / self.round_s)  # a reconfigured job loses its pause
        self._curves: dict[tuple[str, str], list[tuple[int, float, float, float]]] = {}

    def utility(self, x: float) -> float:
        x = max(x, EPSILON)
        return math.log(x) if self.p == 0 else x ** self.p / self.p

    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if not ctx.pending and not ctx.running:
            self.next_round = -math.inf  # idle: the next arrival opens a round at once
            return []
        if ctx.now < self.next_round:
            return []  # between rounds (a Timer for the next one is outstanding)
        profiling = {j.job_id: ready for j in ctx.pending.values()
                     if j.first_start is None and ctx.now < (ready := self._profiled(j)) - 1e-9}
        if not ctx.running and len(profiling) == len(ctx.pending):  # idle: a round once a job is profiled
            self.next_round = min(profiling.values())
            return [Timer(self.next_round, f"sia: {len(profiling)} job(s) profiling until then")]
        self.next_round = ctx.now + self.round_s
        if self._tp is None or self._tp.topology is not ctx.topology:
            self._tp = Throughputs(ctx.topology)
            self._curves.clear()
        live = ctx.running.keys() | ctx.pending.keys()
        for gone in [key for key in self._curves if key[0] not in live]:
            del self._curves[gone]
        targets = self._solve(ctx, profiling.keys())
        self.rounds_solved += 1
        plan = RoundPlan(ctx)

        def reason(job: Job, target: Target | None) -> str:
            if target is None:
                return "sia: preempted, no configuration this round"
            return (f"sia: round at {ctx.now:.0f}s gives {target[1]} × {target[0]} "
                    f"(normalised goodput {self._tp.normalised(job.spec, target[0], target[1], True):.2f}, p={self.p})")

        apply_targets(plan, targets, self.pause_s, reason)
        plan.decisions.append(Timer(self.next_round, f"sia: next round in {self.round_s:.0f}s"))
        return with_dp_plans(plan.decisions, ctx, self._tp)

    def _profiled(self, job: Job) -> float:
        """When `job`'s profile is ready: its own, or with `reuse_profiles` the first of its shape."""
        spec = job.spec
        key = (spec.model, spec.batch_size) if self.reuse_profiles and spec.model else job.job_id
        ready = self.profiled_at.get(key)
        if ready is None:
            ready = self.profiled_at[key] = spec.submit_time + self.profiling_s
        return ready

    def _curve(self, job: Job, gpu_type: str) -> list[tuple[int, float, float, float]]:
        """(GPUs, normalised goodput, its utility, utility after the restart discount) per
        configuration size on a type, smallest first: fixed for a job, so kept across rounds."""
        key = (job.job_id, gpu_type)
        curve = self._curves.get(key)
        if curve is None:
            tp, spec = self._tp, job.spec
            assert tp is not None
            low = max(1, spec.gpus // self.max_scale)
            curve = []
            for g in power_sizes(spec.gpus, low, spec.gpus * self.max_scale):
                x = tp.normalised(spec, gpu_type, g, dp_only=True)
                curve.append((g, x, self.utility(x), self.utility(x * self._keep)))
            self._curves[key] = curve
        return curve

    def _solve(self, ctx: SchedulingContext, profiling: Collection[str] = ()) -> dict[str, Target]:
        """Targets for the running jobs and the pending ones already profiled."""
        topo, state = ctx.topology, ctx.state
        free = {t: healthy_capacity(state, t) for t in topo.gpu_types}
        jobs = sorted([*ctx.running.values(), *(j for j in ctx.pending.values() if j.job_id not in profiling)],
                      key=lambda j: j.key)
        options: dict[str, dict[str, list[tuple[int, float]]]] = {}  # job → type → [(gpus, utility)]
        current: dict[str, Target | None] = {}
        for job in jobs:
            spec = job.spec
            types = spec.gpu_types or topo.gpu_types
            now_at = (type_of(topo, job.allocation), job.allocation.total) if job.allocation is not None else None
            per_type = {}
            for t in types:
                if t not in free or free[t] <= 0:
                    continue
                row = []
                for g, x, u_plain, u_kept in self._curve(job, t):
                    if g > free[t]:
                        break
                    if now_at is not None and (t, g) != now_at:
                        if x * self._keep > 0:
                            row.append((g, u_kept))
                    elif x > 0:
                        row.append((g, u_plain))
                if row:
                    per_type[t] = row
            options[job.job_id] = per_type
            current[job.job_id] = None
        by_id = {j.job_id: j for j in jobs}
        utility_at = {jid: {(t, g): u for t, row in per.items() for g, u in row} for jid, per in options.items()}
        version = dict.fromkeys(by_id, 0)
        base = self.utility(0.0)

        def best_move(jid: str) -> tuple[float, str, int, int] | None:
            """(gain per added GPU, type, gpus, GPUs needed) of the best feasible change."""
            cur = current[jid]
            u_cur = base if cur is None else utility_at[jid][cur]
            cur_type, cur_gpus = cur if cur is not None else (None, 0)
            best = None
            for t, row in options[jid].items():
                have = cur_gpus if t == cur_type else 0
                room = free[t] + have
                for g, u in row:  # sizes ascending
                    if g > room:
                        break
                    if g <= have or u <= u_cur:
                        continue
                    gain = (u - u_cur) / (g - have)
                    if best is None or gain > best[0]:
                        best = (gain, t, g, g - have)
            return best

        heap: list[tuple[float, int, str, int]] = []

        def push(jid: str) -> None:
            move = best_move(jid)
            if move is not None:
                heapq.heappush(heap, (-move[0], by_id[jid].key, jid, version[jid]))

        # phase 1: every job one configuration of at most its request, largest requests first
        # (hardest to fit), each taking the best utility still free
        for job in sorted(jobs, key=lambda j: (-j.spec.gpus, j.key)):
            choices = [(u, -g, t, g) for t, row in options[job.job_id].items() for g, u in row
                       if g <= job.spec.gpus and g <= free[t]]
            if choices:
                _, _, t, g = max(choices)
                current[job.job_id] = (t, g)
                free[t] -= g
        # phase 2: growth and moves by utility gain per added GPU
        for jid in by_id:
            push(jid)
        while heap:
            _, _, jid, ver = heapq.heappop(heap)
            if ver != version[jid]:
                continue
            move = best_move(jid)  # capacity may have shrunk since it was pushed
            if move is None:
                continue
            if -heap[0][0] > move[0] if heap else False:
                heapq.heappush(heap, (-move[0], by_id[jid].key, jid, ver))
                continue
            _, t, g, need = move
            cur = current[jid]
            if cur is not None and cur[0] != t:
                free[cur[0]] += cur[1]  # moved off its old type: others may now use it
                for other in by_id:
                    if other != jid:
                        version[other] += 1
                        push(other)
            free[t] -= need
            current[jid] = (t, g)
            version[jid] += 1
            push(jid)
        return {jid: cfg for jid, cfg in current.items() if cfg is not None}
