"""Shared placement arithmetic on free-GPU arrays.

Placers see `free` already masked (disallowed nodes count as 0 free), and a job
never spans GPU types: on a heterogeneous cluster a multi-node job is placed
within one type at a time and the placer keeps the best result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np

from loom.hardware.state import Allocation, ClusterState

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
