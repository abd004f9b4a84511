"""Reservation for planned pretraining jobs with predicted backfill (Arnold
Algorithm 1, seed 000 §5 and appendices G/H), and its two baselines.

A planned job is announced ahead of its arrival. At announcement the policy
places it with the Arnold solver over all nodes of its type, busy or free,
preferring nodes whose current jobs are predicted to end before the arrival,
and reserves them. Other jobs then go, in FCFS order without blocking:

1. outside the reserved region when they fit there;
2. else inside it, by `mode`:
   - ``predict`` (Arnold): if their predicted completion — `ctx.runtime_estimate`,
     which should be an upper quantile of a predictor, not the mean — precedes
     the planned arrival, or if they are preemptible (preempted at arrival);
   - ``strict``: never (reserved nodes idle: strict reservation without prediction);
   - ``best-effort``: always (reserve-and-pack: the reservation is only a preference);
3. else they wait for the next round.

Before the arrival (``predict``), a reserved node whose job is now predicted
to run past the arrival is swapped for a free node (same minipod first):
Release + Reserve with the new set. When the planned job arrives, preemptible
jobs on its nodes are preempted (counted as `preempted_at_arrival`); a
reserved node still held by a non-preemptible job is a **violation** (counted
once per node) — it is swapped for a free node if one exists, else its job is
preempted (the manual preemption Arnold's operators do). The job starts on its
reserved nodes, in the solver's rank order, once they are free.
`stats` and `timeline` record what happened, for metrics and figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Release, Reserve
from loom.core.jobs import Job
from loom.core.plan import ParallelPlan
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.hardware.state import Allocation
from loom.policies import params

MODES = ("predict", "strict", "best-effort")
RESERVATION_PLACERS = ("arnold", "best-fit")


@dataclass
class Planned:
    """A reservation made for an announced job."""

    reservation_id: int
    nodes: tuple[int, ...]  # rank order
    plan: ParallelPlan
    arrival: float
    counted: bool = False  # violations/preemptions counted at arrival


@dataclass
class ReservationStats:
    violations: int = 0  # reserved nodes held by non-preemptible jobs at arrival
    preempted_at_arrival: int = 0
    start_delay_s: dict[str, float] = field(default_factory=dict)  # planned job → start − arrival
    inside_starts: int = 0  # other jobs started inside a reserved region


@POLICIES.register("reserve")
class ReservationPolicy:
    name = "reserve"

    def __init__(self, mode: str = "predict", alpha: float = 0.3, grace_s: float = 6 * 3600.0,
                 time_limit_s: float = 1.0, reservation_placer: str = "arnold") -> None:
        self.mode = params.choice(mode, "mode", MODES)
        self.reservation_placer = params.choice(reservation_placer, "reservation_placer", RESERVATION_PLACERS)
        self.alpha = params.number(alpha, "alpha", low=0, high=1)  # Arnold's DP-vs-PP weight
        self.grace_s = params.number(grace_s, "grace_s", low=0)
        self.time_limit_s = params.number(time_limit_s, "time_limit_s", low=0)
        self.planned: dict[str, Planned] = {}
        self.stats = ReservationStats()
        self.timeline: list[tuple[float, int, int, int]] = []  # (t, busy nodes, reserved nodes, reserved busy)

    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        plan = RoundPlan(ctx)
        self._plan_announced(ctx, plan)
        if self.mode == "predict":
            self._replan_at_risk(ctx, plan)
        self._start_arrived(ctx, plan)
        self._schedule_others(ctx, plan)
        self._sample(ctx, plan)
        return plan.decisions

    # -- 1. reserve for announced jobs ------------------------------------------
    def _plan_announced(self, ctx: SchedulingContext, plan: RoundPlan) -> None:
        for job in list(ctx.announced.values()):
            if job.job_id in self.planned:
                continue
            planned = self._reserve_for(ctx, plan, job)
            if planned is not None:
                self.planned[job.job_id] = planned

    def _reserve_for(self, ctx: SchedulingContext, plan: RoundPlan, job: Job) -> Planned | None:
        from loom.placement.arnold.placer import _shape_for
        from loom.placement.arnold.problem import default_grid, score
        from loom.placement.arnold.solver import arnold_place

        topo, state = ctx.topology, plan.view
        spec = job.spec
        type_id = topo.type_id(spec.gpu_type) if spec.gpu_type else int(np.bincount(topo.node_type).argmax())
        if type_id is None:
            return None
        nodes = np.flatnonzero((topo.node_type == type_id) & ~state.failed & (state.reserved_by < 0))
        per_node = int(np.bincount(topo.node_gpus[nodes]).argmax()) if len(nodes) else 0
        if not per_node or job.gpus % per_node or len(nodes) * per_node < job.gpus:
            return None
        nodes = nodes[topo.node_gpus[nodes] == per_node]
        needed = job.gpus // per_node
        ends = self._predicted_ends(ctx, plan)
        arrival = spec.submit_time
        order = sorted(nodes.tolist(), key=lambda n: (ends.get(n, ctx.now) > arrival, ends.get(n, ctx.now), n))
        ready = sum(1 for n in order if ends.get(n, ctx.now) <= arrival)
        candidates = np.asarray(order[: max(needed, ready)], dtype=np.int64)
        if len(candidates) < needed:
            return None
        shape = _shape_for(spec.model or "", job.gpus, per_node, topo.gpu_types[type_id])
        if self.reservation_placer == "arnold":
            grid = arnold_place(shape, topo, candidates, self.alpha, time_limit_s=self.time_limit_s).grid
        else:  # group-unaware: the first nodes by predicted end, ranks in name order
            grid = default_grid(shape, candidates[:needed], topo)
        result_score = score(grid, topo, self.alpha)
        chosen = tuple(int(n) for n in grid.T.ravel())  # rank order
        rid = ctx.next_reservation_id + sum(1 for d in plan.decisions if isinstance(d, Reserve))
        busy = sum(1 for n in chosen if ends.get(n, ctx.now) > ctx.now)
        plan.decisions.append(Reserve(
            rid, chosen, arrival + self.grace_s, job.job_id,
            f"reserve ({self.mode}): {len(chosen)} nodes for {job.job_id} arriving in {arrival - ctx.now:.0f}s; "
            f"{self.reservation_placer} spreads DP {result_score.dp_max_spread}, PP {result_score.pp_max_spread}; "
            f"{busy} nodes still busy now",
        ))
        plan.state.reserve(chosen, rid)
        return Planned(rid, chosen, ParallelPlan(dp=shape.dp, tp=shape.tp, pp=shape.pp), arrival)

    @staticmethod
    def _predicted_ends(ctx: SchedulingContext, plan: RoundPlan) -> dict[int, float]:
        """Latest predicted end of the jobs on each busy node."""
        ends: dict[int, float] = {}
        running = [(j, j.allocation) for j in ctx.running.values()] + list(plan.started)
        for job, alloc in running:
            if alloc is None:
                continue
            end = ctx.now + ctx.runtime_estimate(job)
            for node in alloc.nodes:
                ends[node] = max(ends.get(node, 0.0), end)
        return ends

    # -- 2. planned jobs that arrived ------------------------------------------
    def _start_arrived(self, ctx: SchedulingContext, plan: RoundPlan) -> None:
        for job_id, planned in list(self.planned.items()):
            job = ctx.pending.get(job_id)
            if job is None:
                continue
            reserved = set(planned.nodes)
            holders = [j for j in ctx.running.values() if j.allocation and reserved & set(j.allocation.nodes)]
            for other in holders:
                if other.spec.preemptible:
                    plan.preempt(other, f"reserve: preempted at the arrival of {job_id} on its reserved nodes")
                    if not planned.counted:
                        self.stats.preempted_at_arrival += 1
            stuck = {n for j in holders if not j.spec.preemptible for n in j.allocation.nodes} & reserved
            if not planned.counted:
                self.stats.violations += len(stuck)
                planned.counted = True
            if stuck:
                planned.nodes = self._substitute(ctx, plan, planned.nodes, stuck)
                still = set(planned.nodes) & stuck
                for other in holders:  # no free node can stand in: the operator's manual preemption
                    if not other.spec.preemptible and still & set(other.allocation.nodes):
                        plan.preempt(other, f"reserve: manual preemption (violation) for {job_id}")
            state = plan.view
            if all(state.free[n] == ctx.topology.node_gpus[n] for n in planned.nodes):
                gpus = tuple(int(ctx.topology.node_gpus[n]) for n in planned.nodes)
                plan.start(job, Allocation(planned.nodes, gpus),
                           f"reserve: {job_id} starts on its {len(planned.nodes)} reserved nodes", planned.plan)
                self.stats.start_delay_s[job_id] = ctx.now - planned.arrival
                del self.planned[job_id]

    def _substitute(self, ctx: SchedulingContext, plan: RoundPlan, nodes: tuple[int, ...], bad: set[int]
                    ) -> tuple[int, ...]:
        """Swap `bad` nodes for free, unreserved nodes of the same size, same
        minipod first (keeps the groups aligned); bad nodes without a stand-in stay."""
        topo, state = ctx.topology, plan.view
        pods = topo.switch_of[topo.minipod_tier]
        size = int(topo.node_gpus[nodes[0]])
        kind = topo.node_type[nodes[0]]
        spare = [int(n) for n in np.flatnonzero((state.free == topo.node_gpus) & (state.reserved_by < 0)
                                                & ~state.failed & (topo.node_type == kind) & (topo.node_gpus == size))
                 if int(n) not in nodes]
        out = list(nodes)
        for i, node in enumerate(out):
            if node not in bad or not spare:
                continue
            same = [n for n in spare if pods[n] == pods[node]]
            pick = (same or spare)[0]
            spare.remove(pick)
            out[i] = pick
        return tuple(out)

    def _replan_at_risk(self, ctx: SchedulingContext, plan: RoundPlan) -> None:
        """Before an arrival, move the reservation off nodes whose jobs are now
        predicted to run past it, when free nodes can stand in."""
        ends = None
        for job_id, planned in list(self.planned.items()):
            if planned.arrival <= ctx.now:
                continue
            ends = ends if ends is not None else self._predicted_ends(ctx, plan)
            risky = {n for n in planned.nodes if ends.get(n, ctx.now) > planned.arrival}
            if not risky:
                continue
            moved = self._substitute(ctx, plan, planned.nodes, risky)
            if moved == planned.nodes:
                continue
            rid = ctx.next_reservation_id + sum(1 for d in plan.decisions if isinstance(d, Reserve))
            plan.decisions.append(Release(planned.reservation_id, f"reserve: re-plan for {job_id}"))
            plan.state.unreserve(planned.reservation_id)
            changed = sum(1 for a, b in zip(moved, planned.nodes) if a != b)
            plan.decisions.append(Reserve(
                rid, moved, planned.arrival + self.grace_s, job_id,
                f"reserve: {changed} node(s) for {job_id} swapped for free ones: their jobs are now predicted "
                f"to run past the arrival in {planned.arrival - ctx.now:.0f}s"))
            plan.state.reserve(moved, rid)
            planned.nodes, planned.reservation_id = moved, rid

    # -- 3. everyone else ---------------------------------------------------------
    def _schedule_others(self, ctx: SchedulingContext, plan: RoundPlan) -> None:
        arrivals = [p.arrival for p in self.planned.values()]
        next_arrival = min(arrivals) if arrivals else float("inf")
        for position, job in enumerate(list(ctx.pending.values())):
            if job.job_id in self.planned or any(job is j for j, _ in plan.started):
                continue
            if plan.view.free_total < job.gpus:
                continue
            alloc = plan.place(job)  # outside reserved regions (the placer's mask excludes them)
            if alloc is not None:
                plan.start(job, alloc, f"reserve: queue position {position}, outside reserved nodes")
                continue
            reason = self._inside_reason(ctx, job, next_arrival)
            if reason is None:
                continue
            alloc = plan.placer.place(job.spec, job.gpus, plan.view, self._inside_mask(ctx, plan, job))
            if alloc is not None:
                plan.start(job, alloc, reason)
                self.stats.inside_starts += 1

    def _inside_mask(self, ctx: SchedulingContext, plan: RoundPlan, job: Job) -> np.ndarray | None:
        """The job's GPU types, reserved nodes included except those of planned
        jobs that have already arrived (they are waiting for exactly those)."""
        mask = _type_mask(plan, job)
        arrived = [p.nodes for p in self.planned.values() if p.arrival <= ctx.now]
        if not arrived:
            return mask
        keep = np.ones(ctx.topology.num_nodes, dtype=bool)
        for nodes in arrived:
            keep[list(nodes)] = False
        return keep if mask is None else (mask & keep)

    def _inside_reason(self, ctx: SchedulingContext, job: Job, arrival: float) -> str | None:
        if not self.planned or self.mode == "strict":
            return None
        if self.mode == "best-effort":
            return "reserve (best-effort): inside the reserved region, no prediction"
        if job.spec.preemptible:
            return "reserve: preemptible job inside the reserved region (preempted at arrival)"
        predicted = ctx.now + ctx.runtime_estimate(job)
        if predicted <= arrival:
            return f"reserve: predicted to end {arrival - predicted:.0f}s before the planned arrival"
        return None

    def _sample(self, ctx: SchedulingContext, plan: RoundPlan) -> None:
        state = plan.view
        topo = ctx.topology
        busy = state.free < topo.node_gpus
        reserved = state.reserved_by >= 0
        self.timeline.append((ctx.now, int(busy.sum()), int(reserved.sum()), int((busy & reserved).sum())))


def _type_mask(plan: RoundPlan, job: Job) -> np.ndarray | None:
    """Nodes of the job's GPU type(s), reserved or not (None: every node)."""
    topo = plan.ctx.topology
    spec = job.spec
    mask = None
    if spec.gpu_type is not None and not topo.homogeneous:
        mask = topo.node_type == topo.type_id(spec.gpu_type)
    if spec.gpu_types and not topo.homogeneous:
        ids = [i for i in (topo.type_id(t) for t in spec.gpu_types) if i is not None]
        in_set = np.isin(topo.node_type, ids)
        mask = in_set if mask is None else (mask & in_set)
    return mask
