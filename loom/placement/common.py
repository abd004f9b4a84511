"""Shared placement arithmetic on free-GPU arrays.

Placers see `free` already masked (disallowed nodes count as 0 free), and a job
never spans GPU types: on a heterogeneous cluster a multi-node job is placed
within one type at a time and the placer keeps the best result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from weakref import WeakKeyDictionary

import numpy as np

from loom.hardware.state import Allocation, ClusterState
from loom.hardware.topology import Topology

NOT_FIT = np.iinfo(np.int32).max


def masked_free(state: ClusterState, allowed: np.ndarray | None) -> np.ndarray:
    return state.free if allowed is None else np.where(allowed, state.free, 0)


def type_groups(state: ClusterState, free: np.ndarray, gpus: int = 0) -> Iterator[np.ndarray]:
    """`free` restricted to one GPU type at a time (once if the cluster is homogeneous),
    skipping types with fewer than `gpus` free GPUs (nothing could be placed there)."""
    topo = state.topology
    if topo.homogeneous:
        yield free
        return
    per_type = np.bincount(topo.node_type, weights=free, minlength=len(topo.gpu_types))
    for tid in np.flatnonzero(per_type >= gpus).tolist():
        yield np.where(topo.node_type == tid, free, 0)


_scratch = threading.local()  # per thread: size → (int32 buffer, its uint32 view)


def tightest_node(free: np.ndarray, gpus: int, exclude: np.ndarray | None = None) -> int | None:
    """Index of the node with the fewest free GPUs that still holds `gpus`."""
    # Nodes that cannot hold the job wrap around to huge unsigned values. The slack goes into a
    # reused buffer: best-fit asks this once per placement, and a fresh array costs a third of it.
    buffers = _scratch.__dict__.get(free.size)
    if buffers is None:
        buffer = np.empty(free.size, dtype=np.int32)
        buffers = _scratch.__dict__[free.size] = (buffer, buffer.view(np.uint32))
    np.subtract(free, gpus, out=buffers[0])
    slack = buffers[1]
    if exclude is not None:
        slack[exclude] = NOT_FIT
    node = slack.argmin().item()
    return None if slack.item(node) >= NOT_FIT else node


def take_in_order(free: np.ndarray, order: np.ndarray, gpus: int) -> Allocation | None:
    """Whole free capacity of nodes in `order` until `gpus` are covered; the last node gives the rest."""
    caps = free[order]
    total = np.cumsum(caps)
    if total.size == 0 or total[-1] < gpus:
        return None
    k = int(np.searchsorted(total, gpus))
    nodes = order[: k + 1]
    counts = caps[: k + 1].copy()
    counts[-1] = gpus - (int(total[k - 1]) if k else 0)
    keep = counts > 0
    return Allocation(tuple(nodes[keep].tolist()), tuple(counts[keep].tolist()))


def fewest_nodes_then_remainder(free: np.ndarray, gpus: int) -> Allocation | None:
    """Minimum node count: fullest-free nodes first, remainder on the tightest other node."""
    order = np.argsort(-free, kind="stable")
    alloc = take_in_order(free, order, gpus)
    if alloc is None or len(alloc.nodes) == 1:
        return alloc
    full_nodes = np.asarray(alloc.nodes[:-1])
    rest = alloc.gpus[-1]
    last = tightest_node(free, rest, exclude=full_nodes)
    if last is None:
        return alloc
    return Allocation(alloc.nodes[:-1] + (last,), alloc.gpus[:-1] + (rest,))


def node_bits(topology: Topology) -> list[int]:
    """Per GPU type (by type id), the bit set of its nodes (as in `ClusterState.by_free`)."""
    bits = _NODE_BITS.get(topology)
    if bits is None:
        types = topology.node_type.tolist()
        bits = [sum(1 << n for n, t in enumerate(types) if t == tid) for tid in range(len(topology.gpu_types))]
        _NODE_BITS[topology] = bits
    return bits


_NODE_BITS: WeakKeyDictionary[Topology, list[int]] = WeakKeyDictionary()


def fewest_nodes_indexed(state: ClusterState, gpus: int) -> Allocation | None:
    """`best_over_types(state, state.free, gpus, lambda f: fewest_nodes_then_remainder(f, gpus))`, the
    same allocation, from the state's free-count index instead of sorting every node: the nodes
    with the most free GPUs first (lowest index among equals), per GPU type."""
    if gpus <= 0:
        return best_over_types(state, state.free, gpus, lambda f: fewest_nodes_then_remainder(f, gpus))
    by_free = state.by_free
    groups = node_bits(state.topology)
    if state.topology.homogeneous:
        groups = [sum(groups)]
    best: Allocation | None = None
    for group in groups:
        if len(groups) > 1 and sum(have * (nodes & group).bit_count() for have, nodes in enumerate(by_free)) < gpus:
            continue  # type_groups skips a type with fewer free GPUs than asked
        alloc = _fewest_in_group(by_free, group, gpus)
        if alloc is not None and (best is None or len(alloc.nodes) < len(best.nodes)):
            best = alloc
    return best


def _fewest_in_group(by_free: list[int], group: int, gpus: int) -> Allocation | None:
    """`fewest_nodes_then_remainder` on the nodes of bit set `group`."""
    nodes: list[int] = []
    counts: list[int] = []
    need = gpus
    for have in range(len(by_free) - 1, 0, -1):
        bits = by_free[have] & group
        while bits and need > 0:
            low = bits & -bits
            bits ^= low
            nodes.append(low.bit_length() - 1)
            counts.append(min(have, need))
            need -= have
        if need <= 0:
            break
    if need > 0:
        return None
    if len(nodes) > 1:  # the remainder on the tightest node that holds it, the full nodes aside
        rest = counts[-1]
        others = group
        for node in nodes[:-1]:
            others &= ~(1 << node)
        for have in range(rest, len(by_free)):
            bits = by_free[have] & others
            if bits:
                nodes[-1] = (bits & -bits).bit_length() - 1
                break
    return Allocation(tuple(nodes), tuple(counts))


def best_over_types(
    state: ClusterState, free: np.ndarray, gpus: int, place_one: Callable[[np.ndarray], Allocation | None]
) -> Allocation | None:
    """Run `place_one` per GPU type that has `gpus` free (every placer fails, without side
    effects, on a type with fewer); keep the allocation on the fewest nodes."""
    best: Allocation | None = None
    for group_free in type_groups(state, free, gpus):
        alloc = place_one(group_free)
        if alloc is not None and (best is None or len(alloc.nodes) < len(best.nodes)):
            best = alloc
    return best
