"""A fixed, documented background occupancy for placement benchmarks.

Busy nodes come from previously placed jobs of realistic sizes, not from coin
flips per node, so free capacity is fragmented the way a shared LLM cluster's is.

Generator (deterministic per seed, `numpy.random.default_rng(seed)`):

1. **Fill.** Draw job sizes in whole nodes from `JOB_SIZE_MIX` and place each
   with a realistic whole-node placer (`gpu-packing` by default: fewest leaves,
   tightest leaf) on the wholly free nodes, until `FILL_FRACTION` of the
   nodes is busy (or the target, if higher). A drawn job that no longer fits
   is redrawn (after `MAX_REDRAWS` misses it shrinks to one node). Sizes
   above `MAX_JOB_SHARE` of the cluster's nodes are dropped from the mix, so a
   small cluster (Arnold setting (i), 18 nodes) holds small jobs.
2. **Finish.** Jobs finish in a random order: each is released if the cluster
   stays at or above the target; if the cluster is still above it, the
   smallest remaining job finishes too and one-node jobs top it back up, so
   the busy node count ends exactly at round(target · nodes) whenever enough
   whole nodes are usable.
3. **Churn.** Steps 1–2 repeat `CHURN_ROUNDS` times, so later jobs land in the
   holes earlier ones left, as on a cluster that has run for a while.

`JOB_SIZE_MIX` (nodes → share of jobs) is an ASSUMPTION loosely following the
LLM-cluster workload studies summarised in DESIGN.md §5–6 (Acme, Arnold): most
jobs are small (one node: evaluation, debugging, fine-tuning), some use 2–8
nodes, a few 16–64-node pretraining jobs hold a large share of the nodes
(about 60% of busy nodes here come from jobs of ≥ 16 nodes). The shares are
not fitted to any trace. Sub-node (1–7 GPU) jobs are not modelled: such a node
is busy for a whole-node pretraining job anyway.
"""

from __future__ import annotations

import numpy as np

from loom.core.protocols import PLACERS
from loom.errors import LoomInputError
from loom.hardware.state import Allocation, ClusterState
from loom.hardware.topology import Topology
from loom.workload.job import JobSpec

JOB_SIZE_MIX: dict[int, float] = {1: 0.50, 2: 0.15, 4: 0.12, 8: 0.10, 16: 0.07, 32: 0.04, 64: 0.02}
FILL_FRACTION = 0.95
CHURN_ROUNDS = 2
MAX_REDRAWS = 20
MAX_JOB_SHARE = 0.25  # no background job takes more than a quarter of the nodes
ONE_NODE = np.ones(1, dtype=np.int64)


def occupy(topology: Topology, target_fraction: float, seed: int, placer: str = "gpu-packing") -> ClusterState:
    """A state with about `target_fraction` of the nodes busy with whole-node jobs."""
    if not 0.0 <= target_fraction <= 1.0:
        raise LoomInputError(f"must be within [0, 1], got {target_fraction!r}", field="target_fraction")
    state = ClusterState(topology)
    nodes = topology.num_nodes
    usable = (topology.node_gpus > 0) & ~state.failed
    target = round(target_fraction * nodes)
    fill = max(target, round(FILL_FRACTION * nodes))
    rng = np.random.default_rng(seed)
    sizes = np.fromiter(JOB_SIZE_MIX, dtype=np.int64)
    shares = np.fromiter(JOB_SIZE_MIX.values(), dtype=float)
    shares /= shares.sum()
    place = PLACERS.get(placer)()
    jobs: list[Allocation] = []
    busy = 0
    keep = sizes <= max(1, int(MAX_JOB_SHARE * nodes))
    sizes, shares = sizes[keep], shares[keep] / shares[keep].sum()
    for _ in range(CHURN_ROUNDS):
        busy = _fill(state, place, rng, sizes, shares, usable, jobs, busy, fill)
        busy = _finish(state, rng, jobs, busy, target)
        if busy > target and jobs:
            # no job small enough was left to finish: end the smallest one and
            # top up with one-node jobs to land on the target exactly
            smallest = min(len(a.nodes) for a in jobs)
            pick = rng.choice([i for i, a in enumerate(jobs) if len(a.nodes) == smallest])
            state.release(jobs.pop(int(pick)))
            busy -= smallest
            busy = _fill(state, place, rng, ONE_NODE, np.ones(1), usable, jobs, busy, target)
    return state


def _fill(state: ClusterState, placer: object, rng: np.random.Generator, sizes: np.ndarray, shares: np.ndarray,
          usable: np.ndarray, jobs: list[Allocation], busy: int, goal: int) -> int:
    topo = state.topology
    while busy < goal:
        whole = usable & (state.free == topo.node_gpus)
        available = int(whole.sum())
        if available == 0:
            break
        alloc = None
        for _ in range(MAX_REDRAWS):
            size = int(rng.choice(sizes, p=shares))
            if size <= min(available, goal - busy):
                alloc = _place(placer, state, whole, size, len(jobs))
                if alloc is not None:
                    break
        if alloc is None:
            alloc = _place(placer, state, whole, 1, len(jobs))
            if alloc is None:
                break
        state.allocate(alloc)
        jobs.append(alloc)
        busy += len(alloc.nodes)
    return busy


def _place(placer: object, state: ClusterState, whole: np.ndarray, nodes: int, index: int) -> Allocation | None:
    topo = state.topology
    # whole-node request on one node size: the largest size among the free nodes
    gpn = int(topo.node_gpus[whole].max())
    allowed = whole & (topo.node_gpus == gpn)
    if int(allowed.sum()) < nodes:
        return None
    alloc = placer.place(JobSpec(f"background-{index}", 0.0, nodes * gpn), nodes * gpn, state, allowed)
    if alloc is None or any(g != topo.node_gpus[n] for n, g in zip(alloc.nodes, alloc.gpus)):
        return None
    return alloc


def _finish(state: ClusterState, rng: np.random.Generator, jobs: list[Allocation], busy: int, target: int) -> int:
    for i in rng.permutation(len(jobs)):
        alloc = jobs[i]
        if alloc is not None and busy - len(alloc.nodes) >= target:
            state.release(alloc)
            busy -= len(alloc.nodes)
            jobs[i] = None  # type: ignore[call-overload]
    jobs[:] = [a for a in jobs if a is not None]
    return busy


def busy_nodes(state: ClusterState) -> np.ndarray:
    """Mask of nodes not wholly free (some GPU allocated, failed or reserved)."""
    topo = state.topology
    return ~((state.free == topo.node_gpus) & ~state.failed & (state.reserved_by < 0))


def occupancy_summary(state: ClusterState) -> dict[str, float]:
    """Busy fraction of the nodes of each minipod, by minipod name."""
    topo = state.topology
    pods = topo.switch_of[topo.minipod_tier]
    count = np.bincount(pods, minlength=topo.num_switches(topo.minipod_tier))
    busy = np.bincount(pods, weights=busy_nodes(state), minlength=len(count))
    names = topo.switch_names[topo.minipod_tier]
    return {names[p]: float(busy[p] / count[p]) if count[p] else 0.0 for p in range(len(count))}
