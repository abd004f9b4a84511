"""SLA tiers (Singularity, seed 004; DESIGN.md §6): every job is preemptible and
resizable, and a job's tier says how much of its request it is guaranteed.

Rules as built here
-------------------
* **Tiers and sizes** (`premium`, `standard`, `basic`, `tier_by`, `tiers_map`,
  `default_tier`): the workload's entitlements, defined in `loom.workload.tiers`
  (shared with the SLA-attainment report): each tier guarantees a fraction of
  the request, rounded up to a valid size (multiples of the job's minimum
  device count, plus the request); resizing keeps the logical world size
  (fewer GPUs = time-slicing, proportionally slower).
* **Step 1, guarantees.** Pending jobs in tier order (premium → standard →
  basic), FIFO within a tier, start at their request if it fits, else at the
  largest valid size ≥ their guarantee that fits. A job with a guarantee that
  still does not fit takes GPUs from running jobs of *strictly lower* tiers
  only, in this order, youngest first within each: shrink basic jobs (down to
  their minimum size), preempt basic jobs, shrink standard jobs (down to their
  guarantee), preempt standard jobs — one victim at a time, each shrunk only as
  far as needed, until the job places. If even all of that would not make room,
  nobody is touched. Premium jobs are never shrunk or preempted.
* **Step 2, growth.** Leftover GPUs go, in tier order and FIFO, to running jobs
  below their request (Resize up to the largest valid size that places) and to
  pending jobs (request if it fits, else the largest valid size ≥ their
  minimum start size).
* **Anti-thrashing.** A job is grown at most once per `min_resize_interval_s`
  after its last start or resize (a `Timer` brings the next round); shrinking
  for a higher tier is never delayed.

Parameters: `premium`, `standard`, `basic` (fractions in [0, 1]), `tier_by`,
`tiers_map`, `default_tier`, `min_resize_interval_s` (≥ 0, default 300),
`pause_s` (≥ 0, default 0: the resize pause when the engine prices no
interruptions), `elastic` (default true; false: the tiers only order the queue —
jobs start at their full request, nothing is shrunk or preempted — the "no
preemption, no elasticity" control of the same policy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Preempt, Resize, Timer
from loom.core.jobs import Job
from loom.core.plan import ParallelPlan
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.hardware.state import Allocation
from loom.policies import params
from loom.policies.elastic_common import place_on
from loom.workload.job import JobSpec
from loom.workload.tiers import TIERS, TierRule, min_devices, tier_rule, valid_sizes

TIME_EPS = 1e-6  # a deferred growth is due at its time despite float rounding (else: a Timer at `now`)


class _Facts:
    """A job's fixed facts under a policy (its spec never changes; recomputed if its plan does)."""

    __slots__ = ("floor", "guarantee", "minimum", "plan", "rank", "sizes", "spec", "tier")

    def __init__(self, rule: TierRule, spec: JobSpec, plan: ParallelPlan | None) -> None:
        self.spec = spec
        self.plan = plan
        self.tier = rule.tier(spec)
        self.rank = TIERS.index(self.tier)
        self.minimum = min_devices(spec, plan)
        self.sizes = valid_sizes(spec, plan)
        self.guarantee = rule.guarantee(spec, plan)
        self.floor = max(self.guarantee, self.minimum)


@POLICIES.register("sla")
class SlaTiers:
    name = "sla"

    def __init__(self, premium: float = 1.0, standard: float = 0.5, basic: float = 0.0,
                 tier_by: str = "priority", tiers_map: Mapping[Any, str] | None = None,
                 default_tier: str = "basic", min_resize_interval_s: float = 300.0, pause_s: float = 0.0,
                 elastic: bool = True) -> None:
        self.rule = tier_rule({"premium": premium, "standard": standard, "basic": basic, "tier_by": tier_by,
                               "tiers_map": tiers_map, "default_tier": default_tier})
        self.min_resize_interval_s = params.number(min_resize_interval_s, "min_resize_interval_s", low=0)
        self.pause_s = params.number(pause_s, "pause_s", low=0)
        # False: tiers only order the queue; jobs start at full size and are never shrunk or preempted
        self.elastic = params.boolean(elastic, "elastic")
        self.last_change: dict[str, float] = {}  # job → time of its last start/resume/resize by this policy
        self._timers: set[float] = set()
        self._facts: dict[str, _Facts] = {}  # job → its memoised tier, sizes and guarantee

    def facts(self, job: Job) -> _Facts:
        f = self._facts.get(job.job_id)
        if f is None or f.spec is not job.spec or f.plan is not job.plan:
            f = self._facts[job.job_id] = _Facts(self.rule, job.spec, job.plan)
        return f

    # -- per-job facts ----------------------------------------------------------------
    def tier(self, job: Job) -> str:
        return self.facts(job).tier

    def guarantee(self, job: Job) -> int:
        return self.facts(job).guarantee

    def floor(self, job: Job) -> int:
        """The smallest size a running job may be shrunk to (its guarantee, at least its minimum)."""
        return self.facts(job).floor

    def _order(self, jobs: Iterable[Job]) -> list[Job]:
        facts = self.facts
        return sorted(jobs, key=lambda j: (facts(j).rank, j.key))

    # -- the round ----------------------------------------------------------------------
    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        self._timers = {t for t in self._timers if t > ctx.now}
        live = ctx.running.keys() | ctx.pending.keys()
        for gone in [jid for jid in self.last_change if jid not in live]:
            del self.last_change[gone]
        if len(self._facts) > 2 * len(live) + 64:
            self._facts = {jid: f for jid, f in self._facts.items() if jid in live}
        # A running job at its request that step 1 leaves alone keeps its allocation: step 2 cannot
        # grow it (and one step 1 touched is skipped anyway), so only the others need trying.
        below = [j for j in ctx.running.values() if j.allocation.total < j.gpus]  # type: ignore[union-attr]
        if not ctx.pending and (not below or ctx.state.free_total == 0):  # nothing to start, nothing can grow
            return []
        r = _Round(self, ctx)
        for job in self._order(ctx.pending.values()):
            r.start_guaranteed(job)
        plan = r.plan
        if plan.view.free_total > 0:  # step 2 only ever uses free GPUs
            for job in self._order([*below, *ctx.pending.values()]):
                r.grow(job)
                if plan.view.free_total == 0:
                    break  # step 2 never frees GPUs: nothing more can change
        for jid in r.touched:
            self.last_change[jid] = ctx.now
        wake = min(r.deferred, default=None)
        if wake is not None and wake not in self._timers:
            self._timers.add(wake)
            r.plan.decisions.append(Timer(wake, "sla: a shrunk job may grow again then"))
        return r.plan.decisions


class _Round:
    """One scheduling call: the RoundPlan plus which job holds what so far."""

    def __init__(self, policy: SlaTiers, ctx: SchedulingContext) -> None:
        self.p = policy
        self.ctx = ctx
        self.plan = RoundPlan(ctx)
        self.held: dict[str, Allocation] = {j.job_id: j.allocation for j in ctx.running.values()}  # type: ignore[misc]
        self.touched: set[str] = set()
        self.deferred: list[float] = []
        self._segments: dict[int, tuple[list[tuple[Job, int, int]], int]] | None = None  # tier → victims
        self._gives: dict[int, int] = {}  # tier → `_gives_below`, with `_segments`

    def _tier_segments(self) -> dict[int, tuple[list[tuple[Job, int, int]], int]]:
        """Per tier rank: (victims in taking order, GPUs they free in all); valid until `held` changes."""
        if self._segments is None:
            self._gives = {}
            facts, held = self.p.facts, self.held
            by_rank: dict[int, list[Job]] = {}
            for v in self.ctx.running.values():
                if v.job_id in held:
                    by_rank.setdefault(facts(v).rank, []).append(v)
            self._segments = {}
            for rank, running in by_rank.items():
                running.sort(key=lambda v: (-(v.last_start or 0.0), -v.key))  # youngest first
                out: list[tuple[Job, int, int]] = []
                for v in running:
                    have, low = held[v.job_id].total, facts(v).floor
                    if have > low:
                        out.append((v, low, have - low))
                out.extend((v, 0, min(held[v.job_id].total, facts(v).floor)) for v in running)
                self._segments[rank] = (out, sum(give for _, _, give in out))
        return self._segments

    # -- step 1 -------------------------------------------------------------------------
    def start_guaranteed(self, job: Job) -> None:
        facts = self.p.facts(job)
        g = facts.guarantee
        if g == 0:
            return  # best effort: step 2
        if not self.p.elastic:
            self._start_fitting(self.plan, job, job.gpus, job.gpus)
            return
        if self._start_fitting(self.plan, job, g, job.gpus):
            return
        if self.plan.view.free_total + self._gives_below(facts.rank) < g:
            return  # even taking everything allowed would not make room: touch nobody
        victims = self._victims(job)
        trial = self.plan.fork()
        moves: dict[str, Allocation | None] = {}
        for victim, to, _ in victims:
            if not self._take(trial, victim, to, g, moves):
                continue
            if self._start_fitting(trial, job, g, job.gpus, moves):
                self._adopt(trial, moves)
                return

    def _victims(self, job: Job) -> list[tuple[Job, int, int]]:
        """(victim, size it goes to, GPUs freed) in taking order; only strictly lower tiers."""
        rank = self.p.facts(job).rank
        segments = self._tier_segments()
        out: list[tuple[Job, int, int]] = []
        for lower in range(len(TIERS) - 1, rank, -1):  # basic first, then standard
            seg = segments.get(lower)
            if seg is not None:
                out.extend(seg[0])
        return out

    def _gives_below(self, rank: int) -> int:
        """GPUs that taking every victim of a job of tier `rank` would free (sum over `_victims`)."""
        segments = self._tier_segments()
        gives = self._gives.get(rank)
        if gives is None:
            gives = self._gives[rank] = sum(seg[1] for lower, seg in segments.items() if lower > rank)
        return gives

    def _take(self, trial: RoundPlan, victim: Job, to: int, g: int, moves: dict[str, Allocation | None]) -> bool:
        """Shrink (`to` > 0, only as far as needed) or preempt a victim on the trial plan."""
        old = moves.get(victim.job_id, self.held[victim.job_id])
        if old is None:
            return False
        who = f"{self.p.tier(victim)} job {victim.job_id}"
        if to == 0:  # a shrink of the same victim in this trial is dropped: it goes at once
            trial.decisions = [d for d in trial.decisions if not (isinstance(d, Resize) and d.job_id == victim.job_id)]
            trial.state.release(old)
            trial.decisions.append(Preempt(victim.job_id, f"sla: preempt {who} ({self.held[victim.job_id].total} "
                                                          f"GPUs) to keep a higher tier's guarantee"))
            moves[victim.job_id] = None
            return True
        need = g - trial.view.free_total
        sizes = [s for s in self.p.facts(victim).sizes if to <= s < old.total]
        size = max((s for s in sizes if old.total - s >= need), default=to)
        new = self._resize_alloc(trial, victim, old, size)
        if new is None:
            return False
        trial.decisions.append(Resize(victim.job_id, new, f"sla: shrink {who} {old.total}→{new.total} GPUs to "
                                      f"keep a higher tier's guarantee", None, self.p.pause_s))
        moves[victim.job_id] = new
        return True

    def _adopt(self, trial: RoundPlan, moves: dict[str, Allocation | None]) -> None:
        """Keep the trial's changes: its state, its decisions (with the beneficiary named)."""
        job, alloc = trial.started[-1]
        who = f"{self.p.tier(job)} job {job.job_id}'s guarantee ({self.p.guarantee(job)} GPUs)"
        for d in trial.decisions:
            reason = d.reason.replace("a higher tier's guarantee", who)  # type: ignore[union-attr]
            self.plan.decisions.append(replace(d, reason=reason))  # type: ignore[type-var]
        self.plan._state = trial.state  # adopt the fork of this very plan
        self.plan.started.extend(trial.started)
        self._segments = None  # `held` changes below
        for jid, new in moves.items():
            if new is None:
                self.held.pop(jid, None)
            else:
                self.held[jid] = new
            self.touched.add(jid)
        self.held[job.job_id] = alloc
        self.touched.add(job.job_id)

    # -- step 2 -------------------------------------------------------------------------
    def grow(self, job: Job) -> None:
        if job.job_id in self.touched:
            return
        old = self.held.get(job.job_id)
        if old is None:
            if job.job_id in self.ctx.pending:
                low = self.p.facts(job).floor if self.p.elastic else job.gpus
                if self._start_fitting(self.plan, job, low, job.gpus):
                    self.touched.add(job.job_id)
            return
        if old.total >= job.gpus:
            return
        room = self.plan.view.free_total + old.total
        sizes = [s for s in self.p.facts(job).sizes if old.total < s <= room]
        since = self.p.last_change.get(job.job_id)
        if sizes and since is not None and self.ctx.now < since + self.p.min_resize_interval_s - TIME_EPS:
            self.deferred.append(since + self.p.min_resize_interval_s)
            return
        for size in reversed(sizes):
            new = self._resize_alloc(self.plan, job, old, size)
            if new is not None:
                self.plan.decisions.append(Resize(
                    job.job_id, new, f"sla: grow {self.p.tier(job)} job {job.job_id} {old.total}→{size} GPUs "
                    f"(request {job.gpus}) with leftover GPUs", None, self.p.pause_s))
                self.held[job.job_id] = new
                self.touched.add(job.job_id)
                return

    # -- placement helpers -----------------------------------------------------------------
    def _start_fitting(self, plan: RoundPlan, job: Job, low: int, high: int,
                       moves: dict[str, Allocation | None] | None = None) -> bool:
        """Start `job` at the largest valid size in [low, high] that places."""
        free = plan.view.free_total
        top = min(high, free)
        if low > top:
            return False
        for size in reversed([s for s in self.p.facts(job).sizes if low <= s <= top]):
            alloc = place_on(plan, job, size, None)
            if alloc is not None:
                g = self.p.guarantee(job)
                plan.start(job, alloc, f"sla: start {self.p.tier(job)} job {job.job_id} at {size}/{job.gpus} GPUs "
                                       f"(guarantee {g})")
                if moves is None:
                    self.held[job.job_id] = alloc
                    self.touched.add(job.job_id)
                return True
        return False

    @staticmethod
    def _resize_alloc(plan: RoundPlan, job: Job, old: Allocation, size: int) -> Allocation | None:
        """A shrink keeps a subset of the GPUs it holds (never needs anyone else's, so the order
        of this round's decisions cannot matter); a growth releases `old` and places `size`
        GPUs, restoring `old` on failure."""
        state = plan.state
        if size < old.total:
            new = shrink_in_place(old, size)
            state.release(old)
            state.allocate(new)
            return new
        state.release(old)
        new = place_on(plan, job, size, None)
        state.allocate(new or old)
        return new


def shrink_in_place(old: Allocation, size: int) -> Allocation:
    """`size` of the GPUs in `old`, on as few of its nodes as possible (fullest first)."""
    order = sorted(range(len(old.nodes)), key=lambda i: (-old.gpus[i], i))
    nodes, gpus, left = [], [], size
    for i in order:
        if left <= 0:
            break
        take = min(left, old.gpus[i])
        nodes.append(old.nodes[i])
        gpus.append(take)
        left -= take
    return Allocation(tuple(nodes), tuple(gpus))
