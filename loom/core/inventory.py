"""A new generation of the inventory: nodes joined or left a live cluster.

The static topology tree is rebuilt once per generation (it is the backend's
`Inventory.topology`); everything the core holds that names nodes by index is
carried over by node *name*:

* jobs holding GPUs on a node that left lost it: they fail as they would on a
  node failure (recovery, or back to the queue with their progress) before the
  switch — never silently kept;
* running and starting jobs' allocations, reservations (minus vanished nodes;
  a reservation left empty is released), failed and drained nodes are mapped
  onto the new tree;
* recovering jobs are handed back to the queue (their survivors and
  replacement plans refer to the old tree);
* a policy or placer with an `on_inventory(topology)` method is told, so it can
  drop caches built on the old tree.

Node GPU counts may change between generations (a node re-registers with
fewer healthy GPUs); a job whose allocation no longer fits its node is
treated like one on a vanished node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loom.core.backend import Inventory
from loom.core.context import Reservation
from loom.core.decisions import Release
from loom.core.events import NodeDown
from loom.hardware.state import NO_RESERVATION, Allocation, ClusterState
from loom.hardware.topology import Topology

if TYPE_CHECKING:
    from loom.core.scheduler import Scheduler


def adopt(core: Scheduler, inventory: Inventory, at: float) -> bool:
    """Switch `core` to `inventory`; False (nothing done) if it is not newer than the current one."""
    if inventory.generation <= core.generation:
        core.record.stale_events += 1
        return False
    old, new = core.topology, inventory.topology
    lost = _lost_nodes(core, old, new)
    for node in lost:
        core.observe(NodeDown(node, at, f"left the inventory (generation {inventory.generation})"))
    if core.recovery is not None:
        core.recovery.hand_back_all(at)
    ctx = core.ctx
    state = _carry_state(ctx.state, old, new, evicted=set(lost))
    remap = _remapper(old, new)
    for job in [*ctx.running.values(), *ctx.starting.values()]:
        job.allocation = remap(job.allocation)  # type: ignore[arg-type]
        state.allocate(job.allocation)
    for rid, res in list(ctx.reservations.items()):
        nodes = tuple(new.node_index[old.node_names[n]] for n in res.nodes if old.node_names[n] in new.node_index)
        if not nodes:
            core.issue([Release(rid, "its nodes left the inventory")], at)
            continue
        ctx.reservations[rid] = Reservation(rid, nodes, res.until, res.for_job)
        state.reserve(nodes, rid)
    core.topology = ctx.topology = new
    core.generation = inventory.generation
    ctx.state = state
    core._capacity.clear()
    if core.recovery is not None:
        core.recovery.on_inventory(new)
    for component in (core.policy, ctx.placer):
        hook = getattr(component, "on_inventory", None)
        if hook is not None:
            hook(new)
    return True


def _lost_nodes(core: Scheduler, old: Topology, new: Topology) -> list[int]:
    """Old-tree nodes that vanished or shrank below what is allocated on them (and are not down yet)."""
    used: dict[int, int] = {}
    for job in [*core.ctx.running.values(), *core.ctx.starting.values()]:
        for n, g in zip(job.allocation.nodes, job.allocation.gpus):  # type: ignore[union-attr]
            used[n] = used.get(n, 0) + g
    for alloc in core.ctx.held.values():
        for n, g in zip(alloc.nodes, alloc.gpus):
            used[n] = used.get(n, 0) + g
    lost = []
    for node, name in enumerate(old.node_names):
        j = new.node_index.get(name)
        if (j is None or int(new.node_gpus[j]) < used.get(node, 0)) and not core.ctx.state.failed[node]:
            lost.append(node)
    return lost


def _carry_state(state: ClusterState, old: Topology, new: Topology, evicted: set[int]) -> ClusterState:
    """A fresh state on the new tree with failed and drained nodes carried over by name (not the
    nodes only marked down here to evict jobs that no longer fit them)."""
    from loom.hardware.state import DRAINED

    fresh = ClusterState(new)
    for node, name in enumerate(old.node_names):
        j = new.node_index.get(name)
        if j is None:
            continue
        if state.failed[node] and node not in evicted:
            fresh.fail_node(j)
        elif state.reserved_by[node] == DRAINED:
            fresh.reserve([j], DRAINED)
    return fresh


def _remapper(old: Topology, new: Topology):
    def remap(alloc: Allocation) -> Allocation:
        return Allocation(tuple(new.node_index[old.node_names[n]] for n in alloc.nodes), alloc.gpus)

    return remap


__all__ = ["NO_RESERVATION", "adopt"]
