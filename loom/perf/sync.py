"""Data-parallel gradient sync and ZeRO collectives of one stage (Rajbhandari et al. 2020).

Volumes follow Arnold Appendix C: each rank's parameters (its stage's, / tp; expert
weights also / ep) in `grad_bytes` elements.

- ZeRO 0, and ZeRO 1 (the distributed optimizer: Megatron's ``--use-distributed-optimizer``
  shards the optimizer state over DP) over the whole group: one all-reduce of the
  gradients. The distributed optimizer runs it as a reduce-scatter of the gradients and an
  all-gather of the updated bf16 weights; on a ring those move (n−1)/n·S each, the
  all-reduce's 2(n−1)/n·S, so with 2-byte gradients it is priced the same (one start-up
  latency fewer) and Megatron-LM Table 1's fit is untouched.
- ZeRO 2, or sharding within `zero_shard` groups: reduce-scatter + all-gather in the shard
  group plus an all-reduce of the 1/shard slice across the groups (hierarchical ZeRO).
- ZeRO 3 (FSDP): the weights are gathered layer by layer for the forward and again for the
  backward pass, and each layer's gradients reduce-scattered, every micro-batch. The
  gathers are prefetched: layer l+1's gather runs during layer l's compute (FSDP's
  forward/backward prefetch, DeepSpeed's prefetch bucket), so a layer exposes only
  max(0, gather − its compute). With the layers of a stage alike that is, per micro-batch,
  max(0, forward gathers − forward compute) + max(0, backward gathers and reduce-scatters −
  backward compute) (`zero3_exposed`).

The group of the gradient sync is the dp·cp ranks that hold the same weights (context
parallel ranks do), tp apart; an MoE model with ep > 1 syncs expert gradients separately
over the dp·cp/ep ranks that hold the same experts (`loom.perf.moe`).
"""

from __future__ import annotations

from loom.perf.comm import CommModel, GroupShape, Links
from loom.perf.inputs import Placement, TrainingJob


def dp_sync(comm: CommModel, links: Links, job: TrainingJob, placement: Placement, params: float, zero_stage: int,
            zero_shard: int, ranks: int, per_node: int, layers: int) -> tuple[float, float, float]:
    """(gradient sync after the last micro-batch, ZeRO-3 forward gathers per micro-batch, ZeRO-3
    backward gathers + reduce-scatters per micro-batch) for `params` per rank synced over
    `ranks` ranks, `per_node` of them per node."""
    if ranks <= 1:
        return 0.0, 0.0, 0.0
    whole = GroupShape(
        size=ranks, per_node=per_node, minipods=placement.dp_minipods, oversubscription=placement.dp_oversubscription
    )
    grads = params * job.grad_bytes
    weights = params * 2.0
    shard = zero_shard or ranks
    if zero_stage <= 1 and shard == ranks:
        return comm.all_reduce(grads, whole, links), 0.0, 0.0
    inner = GroupShape(size=shard, per_node=min(shard, per_node))
    across = GroupShape(
        size=ranks // shard,
        per_node=max(1, per_node // shard),
        minipods=placement.dp_minipods,
        oversubscription=placement.dp_oversubscription,
    )
    across_sync = comm.all_reduce(grads / shard, across, links)  # the shard across shard groups
    if zero_stage <= 2:  # reduce-scatter grads, all-gather updated weights in the shard group
        return comm.reduce_scatter(grads, inner, links) + across_sync + comm.all_gather(weights, inner, links), 0.0, 0.0
    layers = max(1, layers)
    gather = comm.all_gather(weights / layers, inner, links)
    scatter = comm.reduce_scatter(grads / layers, inner, links)
    return across_sync, layers * gather, layers * (gather + scatter)


def zero3_exposed(compute: float, backward: float, forward_gathers: float, backward_gathers: float) -> float:
    """ZeRO-3 time not hidden by prefetching, per micro-batch (the module's rule)."""
    if not (forward_gathers or backward_gathers):
        return 0.0
    return max(0.0, forward_gathers - (compute - backward)) + max(0.0, backward_gathers - backward)


__all__ = ["dp_sync", "zero3_exposed"]
