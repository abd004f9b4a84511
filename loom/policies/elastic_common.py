"""What the elastic policies (ElasticFlow, Sia, Sia-Arena, Gavel-Arena, SLA tiers) share:
pool capacities, candidate sizes, and turning per-job GPU targets into placements and
decisions.

Kept apart from any one policy so that each can change its own rules without
the others importing its module.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from loom.core.decisions import Migrate, Resize
from loom.core.jobs import Job
from loom.core.round import RoundPlan
from loom.hardware.state import Allocation, ClusterState
from loom.hardware.topology import Topology

Target = tuple[str | None, int]  # (GPU type or None = any, GPU count)


def type_of(topology: Topology, alloc: Allocation) -> str:
    """The GPU type an allocation runs on (an allocation never mixes types)."""
    return node_types(topology)[alloc.nodes[0]]


_node_types: tuple[Topology | None, list[str]] = (None, [])  # the last topology asked about


def node_types(topology: Topology) -> list[str]:
    """The GPU type of each node (kept for the last topology: topologies are immutable)."""
    global _node_types
    if _node_types[0] is not topology:
        _node_types = (topology, [topology.gpu_types[t] for t in topology.node_type.tolist()])
    return _node_types[1]


def healthy_capacity(state: ClusterState, gpu_type: str | None) -> int:
    """GPUs of `gpu_type` (None: any type) on nodes that have not failed: a pool's size now."""
    topo = state.topology
    ok = ~state.failed
    if gpu_type is not None:
        ok = ok & (topo.node_type == topo.type_id(gpu_type))
    return int(topo.node_gpus[ok].sum())


def healthy_capacities(state: ClusterState) -> dict[str | None, int]:
    """`healthy_capacity` of every GPU type of the cluster and of None (the whole cluster)."""
    topo = state.topology
    gpus = np.where(state.failed, 0, topo.node_gpus)
    per_type = np.bincount(topo.node_type, weights=gpus, minlength=len(topo.gpu_types)).tolist()
    capacities: dict[str | None, int] = {t: int(per_type[i]) for i, t in enumerate(topo.gpu_types)}
    capacities[None] = int(gpus.sum())
    return capacities


def power_sizes(request: int, low: int, high: int) -> list[int]:
    """The sizes an elastic job may get: powers of two in [low, high], plus its request when in range."""
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
    types = node_types(topo)
    changes: list[tuple[Job, str | None, int]] = []
    for job in list(ctx.running.values()):
        want = targets.get(job.job_id)
        if want is None:
            plan.preempt(job, reason(job, None))
            continue
        gpu_type, gpus = want
        alloc = job.allocation
        assert alloc is not None
        if gpus == alloc.total and (gpu_type is None or gpu_type == types[alloc.nodes[0]]):
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
