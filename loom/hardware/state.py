"""Mutable cluster state as dense arrays over the static topology.

Free GPUs, failures and reservations are per-node NumPy arrays with per-switch
aggregates kept in step, so that a scheduling round can take a cheap `copy()`
and try placements on it without touching the live state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loom.hardware.topology import Topology

NO_RESERVATION = -1


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPUs of a job: parallel tuples of node indices and GPU counts."""

    nodes: tuple[int, ...]
    gpus: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.gpus)

    @classmethod
    def single(cls, node: int, gpus: int) -> Allocation:
        return cls((node,), (gpus,))

    def describe(self, topology: Topology) -> str:
        return ",".join(f"{topology.node_names[n]}:{g}" for n, g in zip(self.nodes, self.gpus))


class AllocationError(RuntimeError):
    """A decision asked for GPUs that are not free: a policy or placer bug."""


class ClusterState:
    """Free / failed / reserved GPUs per node, plus free GPUs per switch."""

    __slots__ = ("topology", "free", "failed", "reserved_by", "reserved_nodes", "switch_free", "free_total")

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.free = topology.node_gpus.astype(np.int32).copy()
        self.failed = np.zeros(topology.num_nodes, dtype=bool)
        self.reserved_by = np.full(topology.num_nodes, NO_RESERVATION, dtype=np.int32)
        self.reserved_nodes = 0
        self.switch_free = [
            np.bincount(topology.switch_of[t], weights=self.free, minlength=topology.num_switches(t)).astype(np.int64)
            for t in range(len(topology.tiers))
        ]
        self.free_total = int(self.free.sum())

    def copy(self) -> ClusterState:
        clone = object.__new__(ClusterState)
        clone.topology = self.topology
        clone.free = self.free.copy()
        clone.failed = self.failed.copy()
        clone.reserved_by = self.reserved_by.copy()
        clone.reserved_nodes = self.reserved_nodes
        clone.switch_free = [a.copy() for a in self.switch_free]
        clone.free_total = self.free_total
        return clone

    # ------------------------------------------------------------ allocation
    def allocate(self, alloc: Allocation) -> None:
        free = self.free
        for node, gpus in zip(alloc.nodes, alloc.gpus):
            if gpus <= 0 or free[node] < gpus:
                raise AllocationError(
                    f"node {self.topology.node_names[node]} has {int(free[node])} free GPUs, asked for {gpus}"
                )
        self._add(alloc, -1)

    def release(self, alloc: Allocation) -> None:
        self._add(alloc, +1)
        for node in alloc.nodes:
            if self.free[node] > self.topology.node_gpus[node]:
                raise AllocationError(f"node {self.topology.node_names[node]} released more GPUs than it has")

    def _add(self, alloc: Allocation, sign: int) -> None:
        switch_of = self.topology.switch_of
        for node, gpus in zip(alloc.nodes, alloc.gpus):
            delta = sign * gpus
            self.free[node] += delta
            for tier, agg in enumerate(self.switch_free):
                agg[switch_of[tier, node]] += delta
            self.free_total += delta

    # -------------------------------------------------------------- failures
    def fail_node(self, node: int) -> None:
        """Mark a node failed; its jobs must already have been evicted."""
        if self.failed[node]:
            return
        if self.free[node] != self.topology.node_gpus[node]:
            raise AllocationError(f"node {self.topology.node_names[node]} failed with GPUs still allocated")
        if self.free[node]:
            self._add(Allocation.single(node, int(self.free[node])), -1)
        self.failed[node] = True

    def repair_node(self, node: int) -> None:
        if not self.failed[node]:
            return
        self.failed[node] = False
        gpus = int(self.topology.node_gpus[node])
        if gpus:
            self._add(Allocation.single(node, gpus), +1)

    # ---------------------------------------------------------- reservations
    def reserve(self, nodes: Sequence[int], reservation: int) -> None:
        self.reserved_by[list(nodes)] = reservation
        self.reserved_nodes = int((self.reserved_by != NO_RESERVATION).sum())

    def unreserve(self, reservation: int) -> None:
        self.reserved_by[self.reserved_by == reservation] = NO_RESERVATION
        self.reserved_nodes = int((self.reserved_by != NO_RESERVATION).sum())

    # --------------------------------------------------------------- queries
    def usable_mask(self, reservation: int | None = None, gpu_type: str | None = None) -> np.ndarray | None:
        """Nodes a job may use: unreserved (or reserved for it) and of its type.

        Returns None when every node qualifies, so placers can skip masking.
        """
        mask = None
        if self.reserved_nodes:
            reserved = self.reserved_by != NO_RESERVATION
            mask = ~reserved if reservation is None else (~reserved | (self.reserved_by == reservation))
        if gpu_type is not None and not (self.topology.homogeneous and self.topology.gpu_types[0] == gpu_type):
            tid = self.topology.type_id(gpu_type)
            type_mask = self.topology.node_type == tid
            mask = type_mask if mask is None else (mask & type_mask)
        return mask

    @property
    def busy_gpus(self) -> int:
        healthy = int(self.topology.node_gpus[~self.failed].sum())
        return healthy - self.free_total
