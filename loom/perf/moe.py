"""Mixture of experts with expert parallelism: parameters per rank, all-to-all, padding.

Expert parallelism (`ParallelPlan.ep`; Megatron-Core's ``--expert-model-parallel-size``,
Lepikhin et al. 2020 "GShard") is folded inside data parallelism, as Megatron-Core
does: ep of the dp·cp ranks that hold the same dense weights each hold experts/ep
of every MoE layer's experts, so EP adds no GPUs. Then:

- **memory**: the expert MLPs of a stage (all experts: `expert_params`) are divided
  by ep on a rank, the rest (attention, router, norms, embeddings) is not;
- **gradient sync**: dense gradients over the dp·cp group, expert gradients over the
  expert-data-parallel group of dp·cp/ep ranks (the ranks holding the same experts),
  ZeRO shards the same way (`loom.perf.memory.zero_shards`);
- **compute** is unchanged by ep: with balanced routing each rank's experts receive
  as many token-expert pairs as its own tokens send (top_k per token), so a rank's
  expert GEMMs are those of its activated parameters (top_k experts per token);
- **all-to-all**: per MoE layer and micro-batch a dispatch and a combine forward and
  both again backward (4; 6 with full recomputation), each moving
  tokens·h·top_k·c bytes per rank of which (ep − 1)/ep leave it
  (`loom.perf.comm.BusBandwidthComm.all_to_all`). With TP the tokens are the rank's
  s/tp share (Megatron-Core requires sequence parallelism for MoE with TP);
- **capacity factor** c (`TrainingJob.capacity_factor`, 1.0 = dropless and balanced)
  pads every expert's buffer to c × its share: expert GEMMs, their activations and
  the all-to-all grow by c; model FLOPs (MFU) do not count the padding.

Expert tensor parallelism is not a separate knob: experts are split over the TP ranks
like the dense MLP (Megatron-Core's default, expert TP = TP). The EP group's members are
tp apart (Megatron-Core's expert rank order TP, EP, DP, PP), so it stays in a node when
tp·ep ≤ GPUs per node; the expert-data-parallel group's members are tp·ep apart.
"""

from __future__ import annotations

from loom.perf.comm import CommModel, GroupShape, Links
from loom.perf.inputs import TrainingJob
from loom.perf.model import ModelSpec
from loom.perf.stages import StageSpec

A2A_BYTES = 2.0  # tokens are dispatched in bf16


def expert_params_per_layer(model: ModelSpec) -> float:
    """Routed expert MLP parameters (all experts) of the average layer, as the estimator averages
    MoE and dense layers over a stage. Shared experts are replicated like dense weights."""
    if not model.is_moe:
        return 0.0
    return model.moe_layers * model.experts * model.expert_mlp_params() / model.layers


def padding_weights_per_layer(job: TrainingJob) -> float:
    """Extra expert matmul weights a token passes per layer (average) from the capacity
    factor's padding: (c − 1)·top_k expert MLPs on MoE layers."""
    m = job.model
    if not m.is_moe or job.capacity_factor == 1.0:
        return 0.0
    return (job.capacity_factor - 1.0) * m.top_k * m.expert_mlp_weights() * m.moe_layers / m.layers


def ep_group(stage: StageSpec) -> GroupShape:
    """The EP group: ep ranks tp apart."""
    per_node = max(1, min(stage.ep, stage.hardware.gpus_per_node // stage.tp))
    return GroupShape(size=stage.ep, per_node=per_node)


def expert_dp_shape(stage: StageSpec) -> tuple[int, int]:
    """(ranks, members per node) of the expert-data-parallel group: dp·cp/ep ranks tp·ep apart."""
    ranks = stage.dp * stage.cp // stage.ep
    return ranks, max(1, min(ranks, stage.hardware.gpus_per_node // (stage.tp * stage.ep)))


def all_to_all_s(comm: CommModel, links: Links, job: TrainingJob, stage: StageSpec, mb: int, recompute: str) -> float:
    """All-to-all time of one micro-batch on a stage (not overlapped: the experts wait for
    their tokens and the next layer for the combined output)."""
    m = job.model
    if stage.ep <= 1 or not m.is_moe:
        return 0.0
    tokens = mb * m.seq_len / (stage.cp * stage.tp)
    nbytes = tokens * m.hidden * m.top_k * job.capacity_factor * A2A_BYTES
    calls = 4 + (2 if recompute == "full" else 0)
    moe_layers = stage.layers * m.moe_layers / m.layers
    return moe_layers * calls * comm.all_to_all(nbytes, ep_group(stage), links)


__all__ = ["A2A_BYTES", "all_to_all_s", "ep_group", "expert_dp_shape", "expert_params_per_layer",
           "padding_weights_per_layer"]
