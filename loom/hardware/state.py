"""Mutable cluster state as dense arrays over the static topology.

Free GPUs, failures and reservations are per-node NumPy arrays with per-switch
aggregates kept in step, so that a scheduling round can take a cheap `copy()`
and try placements on it without touching the live state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

import numpy as np

from loom.hardware.topology import Topology

NO_RESERVATION = -1
DRAINED = (1 << 30) + 1  # reservation id that keeps new work off drained (cordoned) nodes



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
        """`gpus` GPUs of one node. Allocations are immutable values, so the same object serves
        every request for the same node and count: a 100k-job run holds a few hundred, not one
        per job (and builds none in its hot loop)."""
        alloc = _SINGLES.get((node, gpus))
        if alloc is not None and type(alloc) is cls:
            return alloc
        alloc = cls((node,), (gpus,))
        if type(node) is int and type(gpus) is int:  # not a NumPy integer: it would be shared too
            _SINGLES[(node, gpus)] = alloc
        return alloc

    def describe(self, topology: Topology) -> str:
        return ",".join(f"{topology.node_names[n]}:{g}" for n, g in zip(self.nodes, self.gpus))


_set_nodes, _set_gpus, _set_total = (Allocation.__dict__[f].__set__ for f in ("nodes", "gpus", "total"))
_SINGLES: dict[tuple[int, int], Allocation] = {}  # (node, gpus) → its one-node allocation


class AllocationError(RuntimeError):
    """A decision asked for GPUs that are not free: a policy or placer bug."""


class ClusterState:
    """Free / failed / reserved GPUs per node, plus free GPUs per switch.

    `copy()` is the hot path of every scheduling round, so it copies only the
    free-GPU array; `failed` and `reserved_by` change rarely and are replaced
    (copy-on-write) rather than edited in place, so copies may share them.
    Per-switch aggregates are derived on demand and cached until the next change.

    Nodes are also indexed by free GPU count (`by_free[v]`: a bit set, as a Python int, of
    the nodes with exactly `v` free), kept in step by `allocate` and `release`: the tightest
    node that holds a job is then the lowest bit of the first non-empty set from the job's
    size up, a few integer operations instead of a pass over every node (`tightest`).
    `allocate` and `release` read and write single nodes through a memoryview of `free`
    (a NumPy scalar read or write costs twice as much, and every start and end does both).
    """

    __slots__ = (
        "_bits",
        "_by_free",
        "_capacity",
        "_cells",
        "_switch_free",
        "failed",
        "free",
        "free_total",
        "reserved_by",
        "reserved_nodes",
        "topology",
    )

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.free = topology.node_gpus.astype(np.int32).copy()
        self.failed = np.zeros(topology.num_nodes, dtype=bool)
        self.reserved_by = np.full(topology.num_nodes, NO_RESERVATION, dtype=np.int32)
        self.reserved_nodes = 0
        self.free_total = int(self.free.sum())
        self._switch_free: dict[int, np.ndarray] = {}
        self._cells = memoryview(self.free)  # the same memory as `free`, one node at a time
        self._bits, self._capacity = _node_tables(topology)
        self._by_free = [0] * (max(self._capacity, default=0) + 1)
        for node, have in enumerate(self._capacity):
            self._by_free[have] |= self._bits[node]

    def copy(self) -> ClusterState:
        clone = object.__new__(ClusterState)
        clone.topology = self.topology
        clone.free = self.free.copy()
        clone._cells = memoryview(clone.free)
        clone.failed = self.failed
        clone.reserved_by = self.reserved_by
        clone.reserved_nodes = self.reserved_nodes
        clone.free_total = self.free_total
        clone._switch_free = self._switch_free  # read-only arrays; replaced, never edited
        clone._by_free = self._by_free[:]  # of immutable ints
        clone._bits, clone._capacity = self._bits, self._capacity  # per topology, never edited
        return clone

    def __getstate__(self) -> dict[str, object]:
        """For pickle and `copy`: everything but the memoryview (rebuilt on the unpickled `free`)."""
        return {name: getattr(self, name) for name in self.__slots__ if name != "_cells"}

    def __setstate__(self, state: dict[str, object]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self._cells = memoryview(self.free)

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
        cells, by_free, bits = self._cells, self._by_free, self._bits
        for node, gpus in zip(alloc.nodes, alloc.gpus):
            have = cells[node]
            if gpus <= 0 or have < gpus:
                raise AllocationError(f"node {self.topology.node_names[node]} has {have} free GPUs, asked for {gpus}")
            cells[node] = have - gpus
            bit = bits[node]
            by_free[have] ^= bit
            by_free[have - gpus] |= bit
        self.free_total -= alloc.total
        if self._switch_free:
            self._switch_free = {}

    def release(self, alloc: Allocation) -> None:
        cells, by_free, bits, capacity = self._cells, self._by_free, self._bits, self._capacity
        for node, gpus in zip(alloc.nodes, alloc.gpus):
            had = cells[node]
            have = had + gpus
            if have > capacity[node]:
                raise AllocationError(f"node {self.topology.node_names[node]} released more GPUs than it has")
            cells[node] = have
            bit = bits[node]
            by_free[had] ^= bit
            by_free[have] |= bit
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
    @property
    def by_free(self) -> list[int]:
        """The index: `by_free[v]` is the bit set (a Python int, bit n = node n) of the nodes with
        exactly `v` free GPUs. For reading only: `allocate` and `release` keep it."""
        return self._by_free

    def tightest(self, gpus: int) -> int | None:
        """The node with the fewest free GPUs that still holds `gpus` (the lowest index among
        equals), or None: `placement.common.tightest_node(self.free, gpus)`, from the index."""
        by_free = self._by_free
        for have in range(max(gpus, 0), len(by_free)):
            nodes = by_free[have]
            if nodes:
                return (nodes & -nodes).bit_length() - 1
        return None

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


_TABLES: WeakKeyDictionary[Topology, tuple[list[int], list[int]]] = WeakKeyDictionary()


def _node_tables(topology: Topology) -> tuple[list[int], list[int]]:
    """Per node of `topology`: its bit in the free-count index and its GPU count, as Python ints
    (made once per topology, shared by every state on it)."""
    tables = _TABLES.get(topology)
    if tables is None:
        tables = _TABLES[topology] = ([1 << n for n in range(topology.num_nodes)], topology.node_gpus.tolist())
    return tables

