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
* Caching and fast routes (decisions unchanged): a job's normalised throughput
  at each size is a pure function of its spec, type and size, so it is memoised
  per job, with its ladder of candidate sizes per pool capacity (gains per GPU
  and where each climb stops precomputed); entries of finished jobs are dropped.
  A pool's ladders, its leftover filling and the sorted steps of that filling
  are kept from the last round and reused while their inputs repeat, and the
  filling skips the step-by-step heap when every job's climb fits or by
  scanning the steps in the heap's order (see `ElasticFlow._fill`).

Parameters: `pause_s` (≥ 0, default 30 s), `max_scale` (integer ≥ 1, default
4), `margin` (in [0, 1), default 0.05: share of the time to the deadline kept
as slack), `on_miss` ("best-effort" or "hold").
"""

from __future__ import annotations

import math
from bisect import bisect_right
from operator import attrgetter

import numpy as np

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.policies import params
from loom.policies.elastic_common import (
    Target,
    apply_targets,
    healthy_capacities,
    power_sizes,
)
from loom.policies.throughput import Throughputs, with_dp_plans

ON_MISS = ("best-effort", "hold")

GAIN_EPS = 1e-12  # smallest gain per GPU worth a step


class Ladder:
    """A job's candidate sizes in a pool, `_norm` at each, and what the filling reads of them:
    gains[at], the gain per GPU of the step up to sizes[at] (from sizes[at-1], or from 0);
    ends[at], the index after the last step a climb taking step `at` goes on to take (it
    stops before the first later gain ≤ GAIN_EPS, or NaN, as the heap does)."""

    __slots__ = ("climbs", "ends", "gains", "norms", "sizes")

    def __init__(self, sizes: list[int], norms: list[float]) -> None:
        self.sizes, self.norms = sizes, norms
        gains: list[float] = []
        below, last = 0, 0.0  # `_norm` is 0 at 0 GPUs
        for g, n in zip(sizes, norms):
            gains.append((n - last) / (g - below))
            below, last = g, n
        count = len(sizes)
        ends = [count] * count
        end = count
        for at in range(count - 1, -1, -1):
            ends[at] = end
            if not gains[at] > GAIN_EPS:
                end = at
        self.gains, self.ends = gains, ends
        self.climbs: dict[int, Climb] = {}

    def climb(self, at: int) -> Climb:
        """`climb_steps` from the size below sizes[at] (or 0), memoised."""
        steps = self.climbs.get(at)
        if steps is None:
            steps = self.climbs[at] = climb_steps(self, self.sizes[at - 1] if at else 0, at, self.gains[at])
        return steps


# A climb's steps: (−effective gain, step index, GPUs added, GPUs before) per step.
Climb = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def climb_steps(ladder: Ladder, cur: int, at: int, gain: float) -> Climb:
    """The steps of a climb from `cur` GPUs whose first step (to sizes[at]) gains `gain` per
    GPU; a step's effective gain is the least gain of the climb up to it."""
    steps, gains = ladder.sizes, ladder.gains
    negs, indices, sizes, belows = [], [], [], []
    prev, least = cur, gain
    for k in range(at, ladder.ends[at]):
        if k > at:
            least = min(least, gains[k])
        negs.append(-least)
        indices.append(k)
        sizes.append(steps[k] - prev)
        belows.append(prev)
        prev = steps[k]
    return (np.array(negs, dtype=np.float64), np.array(indices, dtype=np.int64),
            np.array(sizes, dtype=np.int64), np.array(belows, dtype=np.int64))


# (job, share so far, index of its next step, its ladder, gain per GPU of that step)
Start = tuple[Job, int, int, Ladder, float]


# ----------------------------------------------------------------- the round
def round_key(ctx: SchedulingContext) -> tuple:
    return (ctx.now, frozenset(ctx.pending), frozenset(ctx.running))


# ----------------------------------------------------------------- the policy
@POLICIES.register("elasticflow")
class ElasticFlow:
    name = "elasticflow"

    def __init__(self, pause_s: float = 30.0, max_scale: int = 4, margin: float = 0.05,
                 on_miss: str = "best-effort") -> None:
        self.pause_s = params.number(pause_s, "pause_s", low=0)
        self.max_scale = params.integer(max_scale, "max_scale", low=1)
        self.margin = params.number(margin, "margin", low=0, high=1, high_open=True)
        self.on_miss = params.choice(on_miss, "on_miss", ON_MISS)
        self.admitted: dict[str, float] = {}  # job id → deadline
        self.dropped: dict[str, str] = {}  # job id → reason
        self._tp: Throughputs | None = None
        self._norms: dict[tuple[str, str | None, int], float] = {}  # (job, type, GPUs) → `_norm`
        self._ladders: dict[tuple[str, str | None, int], Ladder] = {}
        self._last: tuple | None = None
        self._timed = 0  # `_time_at` calls so far (tells whether a filling read the clock)
        # pool → (inputs, share changes) of its last filling (see `_fill`)
        self._fills: dict[str | None, tuple[tuple, list[tuple[str, int]]]] = {}
        self._orders: dict[str | None, tuple] = {}  # pool → its last sorted steps (see `_fill_sorted`)
        self._pool_ladders: dict[str | None, tuple] = {}  # pool → (capacity, member ids, ladders, sizes)

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

    def _ladder(self, job: Job, gpu_type: str | None, capacity: int) -> Ladder:
        """The job's candidate sizes in a pool of `capacity` GPUs and `_norm` at each (memoised)."""
        high = min(capacity, job.spec.gpus * self.max_scale)
        key = (job.job_id, gpu_type, high)
        ladder = self._ladders.get(key)
        if ladder is None:
            sizes = power_sizes(job.spec.gpus, 1, high)
            ladder = self._ladders[key] = Ladder(sizes, [self._norm(job, gpu_type, g) for g in sizes])
        return ladder

    def _time_at(self, ctx: SchedulingContext, job: Job, gpu_type: str | None, gpus: int) -> float:
        self._timed += 1
        rate = self._norm(job, gpu_type, gpus)
        if rate <= 0:
            return math.inf
        pause = 0.0 if job.allocation is not None and job.allocation.total == gpus else self.pause_s
        return pause + ctx.remaining_work(job) / rate

    def _min_share(self, ctx: SchedulingContext, job: Job, ladder: Ladder) -> int | None:
        """The smallest size of the ladder whose `_time_at` meets the deadline (less the margin)."""
        deadline = job.spec.deadline
        assert deadline is not None
        budget = (deadline - ctx.now) * (1.0 - self.margin)
        remaining = ctx.remaining_work(job)
        running = None if job.allocation is None else job.allocation.total
        for g, rate in zip(ladder.sizes, ladder.norms):  # `_time_at`, inlined
            if (math.inf if rate <= 0 else (0.0 if g == running else self.pause_s) + remaining / rate) <= budget:
                return g
        return None

    def _pays(self, ctx: SchedulingContext, job: Job, pool: str | None, nxt: int, running: int) -> bool:
        """Whether growing a running job past its size to `nxt` GPUs pays for its pause."""
        return not self._time_at(ctx, job, pool, nxt) >= self._time_at(ctx, job, pool, running)

    # -- leftover GPUs -------------------------------------------------------------
    def _fill(self, ctx: SchedulingContext, pool: str | None, capacity: int, members: list[Job], ids: list[str],
              ladders: dict[str, Ladder], share: dict[str, int], free: int) -> None:
        """Hand out `free` GPUs of a pool one ladder step at a time, updating `share`.

        The rule: a heap holds each job's next step as (−gain per GPU, job key, job id, step
        index); pop the best, take it and push the job's following step (if its gain is
        > GAIN_EPS), until the heap is empty or no GPU is left. A step that does not fit
        drops the job from the filling (a smaller job's step may fit); so does a growth of a
        running job past its size that would not pay for its pause. The routes below give
        the same shares faster (tests check them against the heap).

        * Memo: the outcome is a function of the pool's capacity (the ladders), `free`,
          each member's (id, share so far) and the pause checks, whose conditions read the
          running sizes and whose outcomes the clock and progress. A pool's last outcome is
          kept when no pause check was made, with each member's reach (the largest size it
          was considered for growing from; −1: none), and reused when the inputs repeat and
          every running member's size is still above its reach (so again no check is made
          and every step goes the same way).
        * Room for all (`_climb_all`): a job's climb — the steps it takes if every step
          fits — does not depend on the other jobs, so when all climbs fit in `free`
          together, every job ends where its climb ends, whatever the order.
        * Otherwise (`_fill_sorted`), a scan of all climb steps sorted by (−effective gain,
          key, step index), skipping dropped jobs, where a step's effective gain is the least
          gain of its climb so far. A pushed step whose gain is at most the effective gain of
          the step just popped ranks after it, so the heap pops steps in sorted order; one
          whose gain is higher ranks before every entry left and is popped next, just where
          the effective gain puts it."""
        inputs = (capacity, free, ids, [share.get(jid, 0) for jid in ids] if share else None)
        last = self._fills.get(pool)
        if last is not None and last[0] == inputs and all(
                job.allocation is None or job.allocation.total > reach for job, reach in zip(members, last[2])):
            share.update(last[1])
            return
        before = dict(share)
        timed = self._timed
        starts: list[Start] = []
        demand = 0  # the GPUs all climbs would take (pause checks aside)
        for job in members:
            jid = job.job_id
            ladder = ladders[jid]
            steps = ladder.sizes
            cur = share.get(jid, 0)
            at = bisect_right(steps, cur)  # steps[at] is the next size up
            if at == len(steps):
                continue
            if (steps[at - 1] == cur) if at else (cur == 0):
                gain = ladder.gains[at]
            else:
                gain = (ladder.norms[at] - self._norm(job, pool, cur)) / (steps[at] - cur)
            if not gain > GAIN_EPS:
                continue
            starts.append((job, cur, at, ladder, gain))
            demand += steps[ladder.ends[at] - 1] - cur
        if demand <= free:
            reach = self._climb_all(ctx, pool, starts, share)
        else:
            reach = self._fill_sorted(ctx, pool, capacity, starts, share, free)
        if self._timed == timed:
            self._fills[pool] = (inputs, [(jid, g) for jid, g in share.items() if before.get(jid) != g],
                                 [reach.get(jid, -1) for jid in ids])
        else:
            self._fills.pop(pool, None)

    def _climb_all(self, ctx: SchedulingContext, pool: str | None, starts: list[Start],
                   share: dict[str, int]) -> dict[str, int]:
        """Every job climbs as far as its gains (and pause checks) let it: there is room.
        Returns each job's reach (see `_fill`) when no pause check was made."""
        reach: dict[str, int] = {}
        for job, cur, at, ladder, _ in starts:
            steps = ladder.sizes
            end = ladder.ends[at]  # the climb takes steps at .. end-1 unless a pause check stops it
            alloc = job.allocation
            below = reach[job.job_id] = steps[end - 2] if end - 2 >= at else cur  # its last step's start
            if alloc is not None and below >= alloc.total:
                running = alloc.total
                top, k = cur, at
                while k < end and (top < running or self._pays(ctx, job, pool, steps[k], running)):
                    top = steps[k]
                    k += 1
            else:
                top = steps[end - 1]
            share[job.job_id] = top
        return reach

    def _fill_sorted(self, ctx: SchedulingContext, pool: str | None, capacity: int, starts: list[Start],
                     share: dict[str, int], free: int) -> dict[str, int]:
        """The heap's filling (see `_fill`) as a scan of all climb steps in heap order.
        Returns each job's reach (see `_fill`) when no pause check was made."""
        key = (capacity, [(s[0].job_id, s[1]) for s in starts])
        order = self._orders.get(pool)
        if order is None or order[0] != key:
            parts = [ladder.climb(at) if ((ladder.sizes[at - 1] == cur) if at else (cur == 0))
                     else climb_steps(ladder, cur, at, gain) for _, cur, at, ladder, gain in starts]
            lengths = [len(part[0]) for part in parts]
            rank = np.repeat(np.array([s[0].key for s in starts], dtype=np.int64), lengths)
            who = np.repeat(np.arange(len(starts), dtype=np.int64), lengths)
            neg, index, size, below = (np.concatenate([part[c] for part in parts]) for c in range(4))
            sort = np.lexsort((index, rank, neg))  # heap order: (−effective gain, key, step index)
            size = size[sort]
            order = (key, who[sort], index[sort], size, below[sort], np.cumsum(size))
            self._orders[pool] = order
        _, who, index, size, below, taken = order
        # Up to the first step that does not fit or needs a pause check, every step is taken.
        fit = int(np.searchsorted(taken, free, side="right"))
        running = np.array([math.inf if s[0].allocation is None else s[0].allocation.total for s in starts])
        checks = np.flatnonzero(below[:fit] >= running[who[:fit]])
        done = int(checks[0]) if len(checks) else fit
        reach = [-1] * len(starts)
        if done:
            free -= int(taken[done - 1])
            counts = np.bincount(who[:done], minlength=len(starts)).tolist()
            for j, ((job, cur, at, ladder, _), n) in enumerate(zip(starts, counts)):
                if n:
                    share[job.job_id] = ladder.sizes[at + n - 1]
                    reach[j] = ladder.sizes[at + n - 2] if n > 1 else cur  # its last step's start
        if done < len(who) and free > 0:
            self._scan(ctx, pool, starts, share, free, order, done, reach)
        return {start[0].job_id: r for start, r in zip(starts, reach)}

    def _scan(self, ctx: SchedulingContext, pool: str | None, starts: list[Start], share: dict[str, int],
              free: int, order: tuple, done: int, reach: list[int]) -> None:
        """The heap's filling from sorted step `done` on, one step at a time."""
        _, who, index, size, below, _ = order
        dropped = [False] * len(starts)
        for j, k, step, cur in zip(who[done:].tolist(), index[done:].tolist(), size[done:].tolist(),
                                   below[done:].tolist()):
            if dropped[j]:
                continue
            if free <= 0:
                break
            if step > free:
                dropped[j] = True  # this step does not fit; a smaller job's may
                continue
            job, _, _, ladder, _ = starts[j]
            alloc = job.allocation
            nxt = ladder.sizes[k]
            reach[j] = cur
            if alloc is not None and cur >= alloc.total and not self._pays(ctx, job, pool, nxt, alloc.total):
                dropped[j] = True  # growing would not pay for its pause
                continue
            share[job.job_id] = nxt
            free -= step

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
            self._fills.clear()
            self._orders.clear()
            self._pool_ladders.clear()
        if len(self._norms) > 64 * (len(ctx.pending) + len(ctx.running)) + 4096:  # forget finished jobs
            live = ctx.pending.keys() | ctx.running.keys()
            self._norms = {k: v for k, v in self._norms.items() if k[0] in live}
            self._ladders = {k: v for k, v in self._ladders.items() if k[0] in live}
        state = ctx.state
        jobs = [*ctx.running.values(), *ctx.pending.values()]
        jobs.sort(key=attrgetter("key"))
        pools: dict[str | None, list[Job]] = {}
        with_deadline: dict[str | None, list[Job]] = {}  # the members with a deadline, in order
        kind: dict[str, str | None] = {}
        hold = self.on_miss == "hold"
        for job in jobs:
            if hold and job.job_id in self.dropped:
                continue
            spec = job.spec
            kind[job.job_id] = spec.gpu_type
            pools.setdefault(spec.gpu_type, []).append(job)
            if spec.deadline is not None:
                with_deadline.setdefault(spec.gpu_type, []).append(job)
        capacities = healthy_capacities(state)
        targets: dict[str, Target] = {}
        notes: dict[str, str] = {}
        for pool, members in pools.items():
            capacity = capacities.get(pool, 0)
            ids = [j.job_id for j in members]
            known = self._pool_ladders.get(pool)
            if known is not None and known[0] == capacity and known[1] == ids:
                ladders, sizes = known[2], known[3]
            else:
                ladders = {j.job_id: self._ladder(j, pool, capacity) for j in members}
                sizes = {jid: ladder.sizes for jid, ladder in ladders.items()}
                self._pool_ladders[pool] = (capacity, ids, ladders, sizes)
            share: dict[str, int] = {}
            deadlined = with_deadline.get(pool, [])  # (only jobs with a deadline are ever admitted)
            # admitted jobs: minimum satisfactory share, earliest deadline first
            admitted = sorted((j for j in deadlined if j.job_id in self.admitted),
                              key=lambda j: (self.admitted[j.job_id], j.key))
            committed = 0
            for job in admitted:
                need = self._min_share(ctx, job, ladders[job.job_id])
                steps = sizes[job.job_id]
                if need is None:  # behind schedule: as much as it can use
                    need = steps[-1] if steps else 0
                    notes[job.job_id] = "admitted, now behind its deadline"
                fit = bisect_right(steps, min(need, capacity - committed))  # steps[fit - 1]: the largest that fits
                if fit:
                    share[job.job_id] = steps[fit - 1]
                    committed += steps[fit - 1]
            # admission control for newcomers with a deadline
            for job in deadlined:
                jid = job.job_id
                if jid in self.admitted or jid in self.dropped:
                    continue
                need = self._min_share(ctx, job, ladders[jid])
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
            if len(ids) != len(members):  # a newcomer was dropped and is held
                ids = [j.job_id for j in members]
            self._fill(ctx, pool, capacity, members, ids, ladders, share, capacity - committed)
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
        return with_dp_plans(plan.decisions, ctx, self._tp)


