"""ElasticFlow (Gu et al., ASPLOS'23): elastic training with deadlines.

Rules as built here
-------------------
* **Not heterogeneity-aware.** A job only ever runs on the GPU type it asked
  for (`spec.gpu_type`; an untyped job on any one type, its pool being the
  whole cluster). Each type is a separate capacity pool.
* **Speed belief.** The policy decides from DP-only scaling estimates,
  `Throughputs.normalised(spec, type, g, dp_only=True)` (1.0 = the requested
  size); the time left at `g` GPUs is `remaining / normalised(g)` (+
  `pause_s` when `g` differs from the running size). Jobs then run with the
  best plan the speed model finds for what they get (Crius §7).
* **Sizes.** Powers of two from 1 up to `max_scale` × the request (capped by
  the pool), plus the requested size itself.
* **Admission control.** When a job with a deadline first appears, its
  *minimum satisfactory share* is the smallest size that finishes it by
  `deadline − margin × (deadline − now)` at a constant allocation. It is
  admitted when that share plus the shares of the already admitted jobs of
  its pool (recomputed from their progress) fits in the pool. This is the
  constant-share simplification of ElasticFlow's time-slotted progressive
  filling: it never over-admits but can reject a job the paper would admit.
  Otherwise the job is **dropped**: Loom has no "reject" decision a policy can
  return, so with `on_miss="best-effort"` (default) a dropped job stays queued
  and runs on GPUs left over after admitted jobs (like jobs without a
  deadline), and with `on_miss="hold"` it is never started (left pending and
  reported unfinished). Either way the reason is kept in `self.dropped`
  (job id → reason) and quoted in the job's later decisions.
* **Elastic scaling.** Every round (arrivals and completions — the engine
  calls the policy on each event) admitted jobs get their minimum share in
  deadline order (EDF); leftover GPUs of each pool go, one power-of-two step
  at a time, to the job with the highest marginal gain in normalised
  throughput per added GPU (best-effort jobs start from 0). A running job
  whose size changes gets a `Resize` carrying `pause_s` (checkpoint-restart);
  a growth is skipped when the pause would outweigh the speed-up.
  Best-effort jobs that get no share are preempted (progress kept).
* Follow-up rounds at the same instant with the same jobs decide nothing
  (every change is made in one round).
* Caching (decisions unchanged): a job's normalised throughput at each size is
  a pure function of its spec, type and size, so it is memoised per job (with
  its ladder of candidate sizes per pool capacity) instead of re-derived on
  every call; entries of finished jobs are dropped.

Parameters: `pause_s` (≥ 0, default 30 s), `max_scale` (integer ≥ 1, default
4), `margin` (in [0, 1), default 0.05: share of the time to the deadline kept
as slack), `on_miss` ("best-effort" or "hold").
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Migrate, Resize
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.errors import LoomInputError
from loom.hardware.state import Allocation, ClusterState
from loom.hardware.topology import Topology
from loom.policies.throughput import Throughputs

FIELD = "policy.params"
ON_MISS = ("best-effort", "hold")

Target = tuple[str | None, int]  # (GPU type or None = any, GPU count)


# ----------------------------------------------------------------- shared helpers (also used by Sia)
def check_number(value: Any, name: str, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, integer: bool = False) -> float:
    field = f"{FIELD}.{name}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise LoomInputError(f"must be a{'n integer' if integer else ' number'}, got {value!r}", field=field)
    if not math.isfinite(value):
        raise LoomInputError(f"must be finite, got {value!r}", field=field)
    if low is not None and (value < low or (low_open and value == low)):
        raise LoomInputError(f"must be {'>' if low_open else '≥'} {low}, got {value!r}", field=field)
    if high is not None and (value > high or (high_open and value == high)):
        raise LoomInputError(f"must be {'<' if high_open else '≤'} {high}, got {value!r}", field=field)
    return value


def type_of(topology: Topology, alloc: Allocation) -> str:
    return topology.gpu_types[int(topology.node_type[alloc.nodes[0]])]


def healthy_capacity(state: ClusterState, gpu_type: str | None) -> int:
    topo = state.topology
    ok = ~state.failed
    if gpu_type is not None:
        ok = ok & (topo.node_type == topo.type_id(gpu_type))
    return int(topo.node_gpus[ok].sum())


def power_sizes(request: int, low: int, high: int) -> list[int]:
    sizes = {request} if low <= request <= high else set()
    g = 1
    while g <= high:
        if g >= low:
            sizes.add(g)
        g *= 2
    return sorted(sizes)


def place_on(plan: RoundPlan, job: Job, gpus: int, gpu_type: str | None,
             within: tuple[int, ...] | None = None) -> Allocation | None:
    """Place `gpus` GPUs for `job` on `gpu_type` (None: the job's own type rule), optionally
    only on the nodes `within`."""
    state = plan.view
    if gpus > state.free_total:
        return None
    spec = job.spec
    res = plan.ctx.reservation_for(job.job_id) if plan.ctx.reservations else None
    if gpu_type is None:
        allowed = state.usable_mask(res, spec.gpu_type, spec.gpu_types)
    else:
        allowed = state.usable_mask(res, gpu_type, None)
    if within is not None:
        inside = np.zeros(len(state.free), dtype=bool)
        inside[list(within)] = True
        allowed = inside if allowed is None else (allowed & inside)
    return plan.placer.place(spec, gpus, state, allowed)


def apply_targets(plan: RoundPlan, targets: dict[str, Target], pause_s: float,
                  reason: Callable[[Job, Target | None], str]) -> None:
    """Turn per-job targets into decisions on `plan`, in an order the backend can apply:
    preemptions, then resizes/moves of running jobs (shrinks first), then starts
    (largest first). A running job whose new size cannot be placed keeps its GPUs."""
    ctx = plan.ctx
    topo = ctx.topology
    changes: list[tuple[Job, str | None, int]] = []
    for job in list(ctx.running.values()):
        want = targets.get(job.job_id)
        if want is None:
            plan.preempt(job, reason(job, None))
            continue
        gpu_type, gpus = want
        alloc = job.allocation
        assert alloc is not None
        if gpus == alloc.total and (gpu_type is None or gpu_type == type_of(topo, alloc)):
            continue
        changes.append((job, gpu_type, gpus))
    changes.sort(key=lambda c: (c[2] - c[0].allocation.total, c[0].key))  # type: ignore[union-attr]
    for job, gpu_type, gpus in changes:
        old = job.allocation
        assert old is not None
        old_type = type_of(topo, old)
        state = plan.state
        state.release(old)
        new = None
        if gpus <= old.total and gpu_type in (None, old_type):  # shrink in place when possible
            new = place_on(plan, job, gpus, old_type, within=old.nodes)
        if new is None:
            new = place_on(plan, job, gpus, gpu_type or old_type)
        if new is None:
            state.allocate(old)  # it was just released, so it is still free
            continue
        state.allocate(new)
        why = reason(job, (gpu_type or old_type, gpus))
        if new.total == old.total:
            plan.decisions.append(Migrate(job.job_id, new, why, pause_s))
        else:
            plan.decisions.append(Resize(job.job_id, new, why, None, pause_s))
    starts = [(job, targets[job.job_id]) for job in ctx.pending.values() if job.job_id in targets]
    starts.sort(key=lambda s: (-s[1][1], s[0].key))
    for job, (gpu_type, gpus) in starts:
        alloc = place_on(plan, job, gpus, gpu_type)
        if alloc is not None:
            plan.start(job, alloc, reason(job, (gpu_type, gpus)))


def round_key(ctx: SchedulingContext) -> tuple:
    return (ctx.now, frozenset(ctx.pending), frozenset(ctx.running))


# ----------------------------------------------------------------- the policy
@POLICIES.register("elasticflow")
class ElasticFlow:
    name = "elasticflow"

    def __init__(self, pause_s: float = 30.0, max_scale: int = 4, margin: float = 0.05,
                 on_miss: str = "best-effort") -> None:
        self.pause_s = float(check_number(pause_s, "pause_s", low=0))
        self.max_scale = int(check_number(max_scale, "max_scale", low=1, integer=True))
        self.margin = float(check_number(margin, "margin", low=0, high=1, high_open=True))
        if on_miss not in ON_MISS:
            raise LoomInputError(f"must be one of {', '.join(ON_MISS)}, got {on_miss!r}", field=f"{FIELD}.on_miss")
        self.on_miss = on_miss
        self.admitted: dict[str, float] = {}  # job id → deadline
        self.dropped: dict[str, str] = {}  # job id → reason
        self._tp: Throughputs | None = None
        self._norms: dict[tuple[str, str | None, int], float] = {}  # (job, type, GPUs) → `_norm`
        self._ladders: dict[tuple[str, str | None, int], tuple[list[int], list[float]]] = {}
        self._last: tuple | None = None

    # -- beliefs ---------------------------------------------------------------
    def _norm(self, job: Job, gpu_type: str | None, gpus: int) -> float:
        """DP-only normalised throughput; a pure function of (spec, type, GPUs), memoised per job."""
        key = (job.job_id, gpu_type, gpus)
        value = self._norms.get(key)
        if value is None:
            assert self._tp is not None
            spec = job.spec
            if gpus <= 0:
                value = 0.0
            else:
                kind = gpu_type or spec.gpu_type or self._tp.best_type(spec, spec.gpus, True)
                value = self._tp.normalised(spec, kind, gpus, dp_only=True)
            self._norms[key] = value
        return value

    def _ladder(self, job: Job, gpu_type: str | None, capacity: int) -> tuple[list[int], list[float]]:
        """The job's candidate sizes in a pool of `capacity` GPUs and `_norm` at each (memoised)."""
        high = min(capacity, job.spec.gpus * self.max_scale)
        key = (job.job_id, gpu_type, high)
        ladder = self._ladders.get(key)
        if ladder is None:
            sizes = power_sizes(job.spec.gpus, 1, high)
            ladder = self._ladders[key] = (sizes, [self._norm(job, gpu_type, g) for g in sizes])
        return ladder

    def _time_at(self, ctx: SchedulingContext, job: Job, gpu_type: str | None, gpus: int) -> float:
        rate = self._norm(job, gpu_type, gpus)
        if rate <= 0:
            return math.inf
        pause = 0.0 if job.allocation is not None and job.allocation.total == gpus else self.pause_s
        return pause + job.remaining_at(ctx.now) / rate

    def _min_share(self, ctx: SchedulingContext, job: Job, gpu_type: str | None, sizes: list[int]) -> int | None:
        deadline = job.spec.deadline
        assert deadline is not None
        budget = (deadline - ctx.now) * (1.0 - self.margin)
        for g in sizes:
            if self._time_at(ctx, job, gpu_type, g) <= budget:
                return g
        return None

    # -- the round ---------------------------------------------------------------
    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if not ctx.pending and not ctx.running:
            return []
        key = round_key(ctx)
        if key == self._last:
            return []
        self._last = key
        if self._tp is None or self._tp.topology is not ctx.topology:
            self._tp = Throughputs(ctx.topology)
            self._norms.clear()
            self._ladders.clear()
        if len(self._norms) > 64 * (len(ctx.pending) + len(ctx.running)) + 4096:  # forget finished jobs
            live = ctx.pending.keys() | ctx.running.keys()
            self._norms = {k: v for k, v in self._norms.items() if k[0] in live}
            self._ladders = {k: v for k, v in self._ladders.items() if k[0] in live}
        state = ctx.state
        jobs = [*ctx.running.values(), *ctx.pending.values()]
        jobs.sort(key=lambda j: j.key)
        pools: dict[str | None, list[Job]] = {}
        kind: dict[str, str | None] = {}
        for job in jobs:
            if self.on_miss == "hold" and job.job_id in self.dropped:
                continue
            kind[job.job_id] = job.spec.gpu_type
            pools.setdefault(job.spec.gpu_type, []).append(job)
        targets: dict[str, Target] = {}
        notes: dict[str, str] = {}
        for pool, members in pools.items():
            capacity = healthy_capacity(state, pool)
            ladders = {j.job_id: self._ladder(j, pool, capacity) for j in members}
            sizes = {jid: ladder[0] for jid, ladder in ladders.items()}
            share: dict[str, int] = {}
            # admitted jobs: minimum satisfactory share, earliest deadline first
            admitted = sorted((j for j in members if j.job_id in self.admitted),
                              key=lambda j: (self.admitted[j.job_id], j.key))
            committed = 0
            for job in admitted:
                need = self._min_share(ctx, job, pool, sizes[job.job_id])
                if need is None:  # behind schedule: as much as it can use
                    need = sizes[job.job_id][-1] if sizes[job.job_id] else 0
                    notes[job.job_id] = "admitted, now behind its deadline"
                fit = [g for g in sizes[job.job_id] if g <= min(need, capacity - committed)]
                if fit:
                    share[job.job_id] = fit[-1]
                    committed += fit[-1]
            # admission control for newcomers with a deadline
            for job in members:
                jid = job.job_id
                if job.spec.deadline is None or jid in self.admitted or jid in self.dropped:
                    continue
                need = self._min_share(ctx, job, pool, sizes[jid])
                if need is None:
                    self.dropped[jid] = (f"deadline cannot be met: even {sizes[jid][-1] if sizes[jid] else 0} "
                                         f"{pool or 'any'} GPUs would finish after {job.spec.deadline:.0f}")
                elif committed + need > capacity:
                    self.dropped[jid] = (f"deadline cannot be met with current commitments: needs {need} "
                                         f"{pool or 'any'} GPUs, {capacity - committed} not committed")
                else:
                    self.admitted[jid] = job.spec.deadline
                    share[jid] = need
                    committed += need
                    notes[jid] = f"admitted with minimum share {need}"
                    continue
                if self.on_miss == "hold":
                    members = [m for m in members if m.job_id != jid]
            # leftover GPUs: highest marginal normalised throughput per GPU, power-of-two steps.
            # Heap entries are (−gain, key, job, index of the next step in the job's ladder).
            free = capacity - committed
            heap: list[tuple[float, int, str, int]] = []
            by_id = {j.job_id: j for j in members}
            for job in members:
                jid = job.job_id
                steps, norms = ladders[jid]
                cur = share.get(jid, 0)
                at = bisect_right(steps, cur)  # steps[at] is the next size up
                if at == len(steps):
                    continue
                now_norm = norms[at - 1] if at and steps[at - 1] == cur else self._norm(job, pool, cur)
                gain = (norms[at] - now_norm) / (steps[at] - cur)
                if gain > 1e-12:
                    heap.append((-gain, job.key, jid, at))
            heapq.heapify(heap)
            while heap and free > 0:
                _, key, jid, at = heapq.heappop(heap)
                steps, norms = ladders[jid]
                nxt = steps[at]
                cur = share.get(jid, 0)
                if nxt - cur > free:
                    continue  # this step does not fit; a smaller job's may
                job = by_id[jid]
                if job.allocation is not None:
                    running = job.allocation.total
                    if cur >= running and self._time_at(ctx, job, pool, nxt) >= self._time_at(ctx, job, pool, running):
                        continue  # growing would not pay for its pause
                share[jid] = nxt
                free -= nxt - cur
                at += 1
                if at < len(steps):
                    gain = (norms[at] - norms[at - 1]) / (steps[at] - nxt)
                    if gain > 1e-12:
                        heapq.heappush(heap, (-gain, key, jid, at))
            for jid, g in share.items():
                if g > 0:
                    targets[jid] = (kind[jid], g)

        def reason(job: Job, target: Target | None) -> str:
            jid = job.job_id
            if target is None:
                what = "preempted: no share left for best-effort job"
            else:
                what = f"{target[1]} GPUs"
            if jid in self.dropped:
                status = f"best-effort (dropped: {self.dropped[jid]})"
            elif jid in self.admitted:
                status = notes.get(jid, "admitted") + f", deadline {self.admitted[jid]:.0f}"
            else:
                status = "best-effort (no deadline)"
            return f"elasticflow: {what}; {status}"

        plan = RoundPlan(ctx)
        apply_targets(plan, targets, self.pause_s, reason)
        return plan.decisions


