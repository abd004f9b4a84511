"""Mutable cluster state as dense arrays over the static topology.

Free GPUs, failures and reservations are per-node NumPy arrays with per-switch
aggregates kept in step, so that a scheduling round can take a cheap `copy()`
and try placements on it without touching the live state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from loom.hardware.topology import Topology

NO_RESERVATION = -1



@dataclass(frozen=True, slots=True, init=False)
class Allocation:
    """GPUs of a job: parallel tuples of node indices and GPU counts."""

    nodes: tuple[int, ...]
    gpus: tuple[int, ...]
    total: int = field(init=False, compare=False, repr=False)  # sum(gpus): policies ask for it millions of times

    def __init__(self, nodes: tuple[int, ...], gpus: tuple[int, ...]) -> None:
        # by hand, through the slots' own setters (frozen forbids `self.x = …`; `object.__setattr__`
        # is slower): every placement builds one
        _set_nodes(self, nodes)
        _set_gpus(self, gpus)
        _set_total(self, gpus[0] if len(gpus) == 1 else sum(gpus))

    @classmethod
    def single(cls, node: int, gpus: int) -> Allocation:
        return cls((node,), (gpus,))

    def describe(self, topology: Topology) -> str:
        return ",".join(f"{topology.node_names[n]}:{g}" for n, g in zip(self.nodes, self.gpus))


_set_nodes, _set_gpus, _set_total = (Allocation.__dict__[f].__set__ for f in ("nodes", "gpus", "total"))


class AllocationError(RuntimeError):
    """A decision asked for GPUs that are not free: a policy or placer bug."""


class ClusterState:
    """Free / failed / reserved GPUs per node, plus free GPUs per switch.

    `copy()` is the hot path of every scheduling round, so it copies only the
    free-GPU array; `failed` and `reserved_by` change rarely and are replaced
    (copy-on-write) rather than edited in place, so copies may share them.
    Per-switch aggregates are derived on demand and cached until the next change.
    """

    __slots__ = ("topology", "free", "failed", "reserved_by", "reserved_nodes", "free_total", "_switch_free")

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.free = topology.node_gpus.astype(np.int32).copy()
        self.failed = np.zeros(topology.num_nodes, dtype=bool)
        self.reserved_by = np.full(topology.num_nodes, NO_RESERVATION, dtype=np.int32)
        self.reserved_nodes = 0
        self.free_total = int(self.free.sum())
        self._switch_free: dict[int, np.ndarray] = {}

    def copy(self) -> ClusterState:
        clone = object.__new__(ClusterState)
        clone.topology = self.topology
        clone.free = self.free.copy()
        clone.failed = self.failed
        clone.reserved_by = self.reserved_by
        clone.reserved_nodes = self.reserved_nodes
        clone.free_total = self.free_total
        clone._switch_free = self._switch_free  # read-only arrays; replaced, never edited
        return clone

    def switch_free(self, tier: int) -> np.ndarray:
        """Free GPUs under each switch of `tier` (read-only)."""
        agg = self._switch_free.get(tier)
        if agg is None:
            topo = self.topology
            agg = np.bincount(topo.switch_of[tier], weights=self.free, minlength=topo.num_switches(tier))
            agg = agg.astype(np.int64)
            agg.flags.writeable = False
            self._switch_free = {**self._switch_free, tier: agg}
        return agg

    # ------------------------------------------------------------ allocation
    def allocate(self, alloc: Allocation) -> None:
        free = self.free
        for node, gpus in zip(alloc.nodes, alloc.gpus):
            have = free.item(node)
            if gpus <= 0 or have < gpus:
                raise AllocationError(f"node {self.topology.node_names[node]} has {have} free GPUs, asked for {gpus}")
            free[node] = have - gpus
        self.free_total -= alloc.total
        if self._switch_free:
            self._switch_free = {}

    def release(self, alloc: Allocation) -> None:
        free = self.free
        capacity = self.topology.node_gpus
        for node, gpus in zip(alloc.nodes, alloc.gpus):
            have = free.item(node) + gpus
            if have > capacity.item(node):
                raise AllocationError(f"node {self.topology.node_names[node]} released more GPUs than it has")
            free[node] = have
        self.free_total += alloc.total
        if self._switch_free:
            self._switch_free = {}

    # -------------------------------------------------------------- failures
    def fail_node(self, node: int) -> None:
        """Mark a node failed; its jobs must already have been evicted."""
        if self.failed[node]:
            return
        if self.free[node] != self.topology.node_gpus[node]:
            raise AllocationError(f"node {self.topology.node_names[node]} failed with GPUs still allocated")
        gpus = int(self.free[node])
        if gpus:
            self.allocate(Allocation.single(node, gpus))
        self.failed = self.failed.copy()
        self.failed[node] = True

    def repair_node(self, node: int) -> None:
        if not self.failed[node]:
            return
        self.failed = self.failed.copy()
        self.failed[node] = False
        gpus = int(self.topology.node_gpus[node])
        if gpus:
            self.release(Allocation.single(node, gpus))

    # ---------------------------------------------------------- reservations
    def reserve(self, nodes: Sequence[int], reservation: int) -> None:
        self.reserved_by = self.reserved_by.copy()
        self.reserved_by[list(nodes)] = reservation
        self.reserved_nodes = int((self.reserved_by != NO_RESERVATION).sum())

    def unreserve(self, reservation: int) -> None:
        self.reserved_by = np.where(self.reserved_by == reservation, NO_RESERVATION, self.reserved_by)
        self.reserved_nodes = int((self.reserved_by != NO_RESERVATION).sum())

    # --------------------------------------------------------------- queries
    def usable_mask(self, reservation: int | None = None, gpu_type: str | None = None,
                    gpu_types: tuple[str, ...] | None = None) -> np.ndarray | None:
        """Nodes a job may use: unreserved (or reserved for it) and of its type
        (`gpu_types`: any one of a set; a job still never spans types).

        Returns None when every node qualifies, so placers can skip masking.
        """
        mask = None
        if self.reserved_nodes:
            reserved = self.reserved_by != NO_RESERVATION
            mask = ~reserved if reservation is None else (~reserved | (self.reserved_by == reservation))
        topo = self.topology
        if gpu_type is not None and not (topo.homogeneous and topo.gpu_types[0] == gpu_type):
            type_mask = topo.node_type == topo.type_id(gpu_type)
            mask = type_mask if mask is None else (mask & type_mask)
        if gpu_types:
            ids = [topo.type_id(t) for t in gpu_types]
            if not (topo.homogeneous and topo.gpu_types[0] in gpu_types):
                set_mask = np.isin(topo.node_type, [i for i in ids if i is not None])
                mask = set_mask if mask is None else (mask & set_mask)
        return mask

    @property
    def busy_gpus(self) -> int:
        healthy = int(self.topology.node_gpus[~self.failed].sum())
        return healthy - self.free_total
