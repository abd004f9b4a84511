"""Gandiva (Xiao et al., OSDI'18): introspective scheduling for deep learning —
time-slicing by suspend/resume, and migration to improve locality.

Rules
-----
* **Start.** Waiting jobs start in queue order whenever they fit (a job that
  does not fit is skipped, it does not block later ones), placed by the
  context's placer.
* **Time-slicing.** Gandiva over-subscribes the cluster by suspending and
  resuming jobs. Every `time_slice_s` seconds while jobs wait (the policy asks
  for the next slice with a `Timer`), each waiting job, in queue order, may
  take the GPUs of a running job *of the same size* that has run at least
  `time_slice_s` since it last (re)started and whose GPUs the waiting job may
  use (its own GPU-type constraint): the longest-running such job is suspended
  (`Preempt`, progress kept) and the waiting job started in its place.
  Suspended jobs rejoin the back of the queue, so jobs of one size take turns
  round-robin. A job suspended at an instant is not restarted at that
  instant.
* **Introspective migration.** After starting jobs, a running multi-node job
  is moved (`Migrate`, pause `migration_pause_s`) when free GPUs — plus its
  own — allow a more local placement: fewer switches spanned at some tier
  (top tier first), then fewer nodes. The compact placement is the switch
  (lowest tier first) whose free GPUs hold the job on the fewest nodes,
  fullest nodes first. A job is moved only if it is expected to run for more
  than 4 × `migration_pause_s` longer.
* **Heterogeneity-blind.** GPU types are ignored except for a job's own
  constraint (`gpu_type` / `gpu_types`), which every placement respects.

`round_latencies` records (time, seconds) per call.
"""

from __future__ import annotations

import math
import time

import numpy as np

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Migrate, Timer
from loom.core.jobs import Job
from loom.core.protocols import POLICIES
from loom.core.round import RoundPlan
from loom.hardware.state import Allocation, ClusterState
from loom.hardware.topology import Topology
from loom.placement.common import masked_free, take_in_order
from loom.policies import params

TINY = 1e-9


def locality_key(nodes: tuple[int, ...], topology: Topology) -> tuple[int, ...]:
    """Switches spanned per tier (top → leaf), then nodes: smaller is more local."""
    return (*topology.switches_spanned(nodes), len(nodes))


def compact_allocation(state: ClusterState, gpus: int, allowed: np.ndarray | None) -> Allocation | None:
    """The most local gang placement of `gpus` on free GPUs: within one switch of
    the lowest tier possible, on the fewest nodes (fullest first)."""
    topo = state.topology
    free = masked_free(state, allowed)
    if int(free.sum()) < gpus:
        return None
    best: Allocation | None = None
    for tier in range(topo.leaf_tier, -1, -1):
        groups = topo.switch_of[tier]
        sums = np.bincount(groups, weights=free, minlength=topo.num_switches(tier))
        for switch in np.flatnonzero(sums >= gpus).tolist():
            members = np.flatnonzero((groups == switch) & (free > 0))
            order = members[np.argsort(-free[members], kind="stable")]
            alloc = take_in_order(free, order, gpus)
            if alloc is not None and (best is None or len(alloc.nodes) < len(best.nodes)):
                best = alloc
        if best is not None:
            return best
    return None


@POLICIES.register("gandiva")
class Gandiva:
    name = "gandiva"

    def __init__(self, time_slice_s: float = 600.0, migration_pause_s: float = 30.0) -> None:
        self.time_slice_s = params.number(time_slice_s, "time_slice_s", low=0, low_open=True)
        self.migration_pause_s = params.number(migration_pause_s, "migration_pause_s", low=0)
        self._next_slice = -math.inf
        self._suspended: tuple[float, set[str]] = (-math.inf, set())
        self.round_latencies: list[tuple[float, float]] = []

    def schedule(self, ctx: SchedulingContext) -> list[Decision]:
        clock = time.perf_counter()
        decisions = self._schedule(ctx)
        self.round_latencies.append((ctx.now, time.perf_counter() - clock))
        return decisions

    def _schedule(self, ctx: SchedulingContext) -> list[Decision]:
        if not ctx.pending and not ctx.running:
            return []
        now = ctx.now
        at, suspended = self._suspended
        if at != now:
            suspended = set()
        plan = RoundPlan(ctx)
        touched: set[str] = set()
        waiting: list[Job] = []
        for position, job in enumerate(ctx.pending.values()):
            if job.job_id in suspended:
                continue
            if job.gpus <= plan.view.free_total and plan.try_start(job, f"gandiva: queue position {position}"):
                touched.add(job.job_id)
            else:
                waiting.append(job)
        if waiting and now >= self._next_slice - TINY:
            self._time_slice(ctx, plan, waiting, touched, suspended)
            self._next_slice = now + self.time_slice_s
            plan.decisions.append(Timer(self._next_slice, f"gandiva: next time slice in {self.time_slice_s:.0f}s"))
        self._suspended = (now, suspended)
        self._migrate(ctx, plan, touched)
        return plan.decisions

    def _time_slice(self, ctx: SchedulingContext, plan: RoundPlan, waiting: list[Job], touched: set[str],
                    suspended: set[str]) -> None:
        now = ctx.now
        candidates = sorted((j for j in ctx.running.values()
                             if j.job_id not in touched and j.last_start is not None
                             and now - j.last_start >= self.time_slice_s - TINY),
                            key=lambda j: (j.last_start, j.key))  # longest running first
        for job in waiting:
            for victim in candidates:
                if victim.gpus != job.gpus or victim.job_id in touched:
                    continue
                trial = plan.fork()
                trial.preempt(victim, "")
                alloc = trial.place(job)
                if alloc is None:
                    continue
                ran = now - victim.last_start  # type: ignore[operator]
                plan.preempt(victim, f"gandiva: time slice — suspend {victim.job_id} after {ran:.0f}s "
                                     f"so waiting {job.job_id} ({job.gpus} GPUs) runs")
                plan.start(job, alloc, f"gandiva: time slice — runs in place of {victim.job_id}")
                touched.update((victim.job_id, job.job_id))
                suspended.add(victim.job_id)
                break

    def _migrate(self, ctx: SchedulingContext, plan: RoundPlan, touched: set[str]) -> None:
        topo = ctx.topology
        if plan.view.free_total == 0:
            return
        for job in sorted(ctx.running.values(), key=lambda j: (-j.gpus, j.key)):
            old = job.allocation
            if job.job_id in touched or old is None or len(old.nodes) < 2:
                continue
            if ctx.expected_end(job) - ctx.now <= 4 * self.migration_pause_s:
                continue
            per_node = int(topo.node_gpus[list(old.nodes)].max())
            current = locality_key(old.nodes, topo)
            if current == (1,) * len(topo.tiers) + (-(-job.gpus // per_node),):
                continue  # already as local as it can be
            trial = plan.fork()
            trial.state.release(old)
            rid = ctx.reservation_for(job.job_id) if ctx.reservations else None
            allowed = trial.state.usable_mask(rid, job.spec.gpu_type, job.spec.gpu_types)
            new = compact_allocation(trial.state, job.gpus, allowed)
            if new is None:
                continue
            better = locality_key(new.nodes, topo)
            if better >= current:
                continue
            plan.state.release(old)
            plan.state.allocate(new)
            touched.add(job.job_id)
            plan.decisions.append(Migrate(job.job_id, new,
                                          f"gandiva: migrate for locality ({len(old.nodes)} → {len(new.nodes)} "
                                          f"nodes; switches per tier {current[:-1]} → {better[:-1]})",
                                          self.migration_pause_s))
            if plan.view.free_total == 0:
                return
