"""GPU memory per rank: model states with ZeRO, activations per pipeline rank.

Model states (Acme, seed 001 §4.1; Rajbhandari et al. 2020): mixed-precision
Adam keeps 2Ψ bytes of weights, 2Ψ of gradients and 12Ψ of optimizer state
(fp32 master weights, momentum, variance) for Ψ parameters on a rank. ZeRO-1
shards the optimizer state, ZeRO-2 also the gradients, ZeRO-3 also the weights,
over the DP group or over groups of `zero_shard` ranks (hierarchical ZeRO).

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", §4): one layer keeps s·b·h·(34 + 5·a·s/h) bytes for
a micro-batch of b sequences of s tokens in 16-bit precision. Per tensor, in
units of s·b·h bytes (f = ffn_hidden, g = kv_heads, a = heads):

==========================  ========  ======================================
tensor kept for backward    sbh units split by
==========================  ========  ======================================
LayerNorm inputs (two)      4         SP (replicated over TP without it)
QKV projection input        2         SP
attention dropout mask      1         SP
MLP input                   2         SP
MLP dropout mask            1         SP
Q                           2         TP
K and V                     4·g/a     TP (one head each per rank when t > g)
attention output (proj in)  2         TP
MLP, GeLU: act. input and   4·f/h     TP (2·f/h each; 16 for f = 4h)
fc2 input
MLP, SwiGLU: gate and up    6·f/h     TP (Megatron keeps fc1's 2f-wide
(act. input), fc2 input               output, 4·f/h, and the product, 2·f/h)
scores: softmax out, its    5·a·s/h   TP; absent with FlashAttention (never
dropout mask, dropout out             materialised), dropped by selective
                                      recomputation
==========================  ========  ======================================

The first five rows are Korthikanti's "10", the rest his "24" (multi-head
attention, 4h GeLU MLP: 2 + 4 + 2 + 16). With tensor parallelism t they are
s·b·h·(10 + 24/t + 5·a·s/(h·t)); with sequence parallelism (`TrainingJob.
sequence_parallel`, on by default with t > 1, as Megatron does) the "10" is
split too: s·b·h/t·(34 + 5·a·s/h). Selective recomputation drops the score
term; full recomputation keeps only each layer's 2·s·b·h input (/t with SP)
plus one layer's working set while it is rebuilt.

Pipeline (Korthikanti §4.2.3; Narayanan et al. 2021): under 1F1B pipeline rank
r holds min(pp − r, m) micro-batches in flight for m micro-batches, so the
first stage holds min(pp, m); the interleaved schedule multiplies that by
1 + (pp − 1)/(pp·v). The last rank also holds fp32 logits and their gradient:
8·s·b·V/t bytes.

Context parallelism (cp ranks per sequence; Megatron-Core): every tensor above
holds s/cp tokens on a rank, so a layer's activations (and the last rank's
logits) are divided by cp. Ring attention's K/V chunks in flight are one
chunk pair per step (2·s/cp·kv_dim·b), small next to the layer and not counted.

Mixture of experts: an MoE layer's MLP tensors are kept for each of the top_k
experts a token visits, padded by the capacity factor c, so its MLP rows are
× (top_k·c + shared experts)·f_expert/f (`mlp_activation_factor`, averaged over the layers as the estimator
averages MoE and dense layers). Expert parallelism moves tokens, not these.

Model states of MoE models: expert weights are sharded over ep ranks (the
caller's `expert_params` are already /ep) and their ZeRO state over the
expert-data-parallel group of dp·cp/ep ranks; the other weights over dp·cp.

ZeRO-3 prefetch: with per-layer gathers, a rank holds the gathered full
weights of the layer it computes and of the next one (prefetched): 2 layers ×
2 bytes × the layer's parameters on the rank × (1 − 1/shard), added to the states.

Allocator allowance: activations are allocated and freed every micro-batch in
many sizes, so PyTorch's caching allocator reserves more than the tensors
need; `ACTIVATION_FRAGMENTATION` adds that share on top of the activations
(model states are allocated once and do not fragment). The fixed part — CUDA
context, NCCL buffers, cuBLAS workspaces — is the calibration's
`memory_reserve_gib`.
"""

from __future__ import annotations

import math
from functools import lru_cache

from loom.core.plan import ParallelPlan
from loom.perf.inputs import TrainingJob
from loom.perf.model import ModelSpec

GIB = 2**30
CNN_ACTIVATION_BYTES_PER_PARAM_IMAGE = 4.0  # ResNet-50 bf16 training: ~100 MB/image for 25.6 M params
# Korthikanti's per-tensor terms (module table), in s·b·h bytes: LayerNorm inputs 4, QKV input 2,
# attention dropout mask 1, MLP input 2, MLP dropout mask 1 — replicated over TP unless SP splits them.
REPLICATED_SBH = 10.0
# MLP tensors per FFN unit (s·b·f bytes): GeLU keeps its input and fc2's input (2 + 2); SwiGLU keeps
# fc1's gate+up output (2·2) and the gated product fc2 reads (2). 4·4h = Korthikanti's 16·sbh.
GELU_SBH_PER_F = 4.0
SWIGLU_SBH_PER_F = 6.0
# PyTorch's caching allocator reserves more than live activations need: they are freed and
# reallocated every micro-batch in many sizes, and blocks split for one size cannot always serve
# another. 10% of the activations is ASSUMED from common reports (reserved/allocated ≈ 1.05–1.15
# in Megatron/torchtitan memory logs; what PYTORCH_CUDA_ALLOC_CONF=expandable_segments recovers).
# Model states are allocated once and are not included; fixed overheads are memory_reserve_gib.
ACTIVATION_FRAGMENTATION = 0.10


def model_state_bytes(
    params_on_rank: float, plan: ParallelPlan, offload: bool = False, expert_params: float = 0.0
) -> float:
    """Weights + gradients + optimizer state of `params_on_rank` parameters
    (`offload`: the optimizer state lives in host memory). `expert_params` of them
    (already /ep) are ZeRO-sharded over the expert-data-parallel group (`zero_shards`)."""
    if not expert_params:
        return _sharded_states(params_on_rank, plan.zero_stage, plan.zero_shard or plan.dp * plan.cp, offload)
    dense_shard, expert_shard = zero_shards(plan)
    dense = _sharded_states(params_on_rank - expert_params, plan.zero_stage, dense_shard, offload)
    return dense + _sharded_states(expert_params, plan.zero_stage, expert_shard, offload)


def zero_shards(plan: ParallelPlan) -> tuple[int, int]:
    """Ranks ZeRO shards over: (dense weights: `zero_shard` or dp·cp; experts: the dp·cp/ep
    expert-data-parallel ranks, or with `zero_shard` a group of zero_shard/ep of them).
    CP ranks hold the same weights, so they shard with DP (Megatron's distributed optimizer)."""
    shard = plan.zero_shard or plan.dp * plan.cp
    if plan.ep == 1:
        return shard, shard
    expert_ranks = plan.dp * plan.cp // plan.ep
    return shard, math.gcd(max(1, shard // plan.ep), expert_ranks)


def _sharded_states(params: float, zero_stage: int, shard: int, offload: bool) -> float:
    weights, grads, optim = 2.0 * params, 2.0 * params, 12.0 * params
    if zero_stage >= 1:
        optim /= shard
    if zero_stage >= 2:
        grads /= shard
    if zero_stage >= 3:
        weights /= shard
    return weights + grads + (0.0 if offload else optim)


def mlp_activation_factor(job: TrainingJob) -> float:
    """`_expert_factor` of the job's model and capacity factor; 1.0 for dense models."""
    if job.model.experts == 1:
        return 1.0
    return _expert_factor(job.model, job.capacity_factor)


@lru_cache(maxsize=1024)
def _expert_factor(m: ModelSpec, capacity_factor: float) -> float:
    """MLP activations of the average layer relative to a dense one: MoE layers keep them for
    top_k experts × the capacity factor, plus the shared experts, each of FFN size
    expert_ffn_hidden. 1.0 for dense models."""
    experts = (m.top_k * capacity_factor + m.shared_experts) * m.expert_ffn_hidden / m.ffn_hidden
    return (m.dense_layers + m.moe_layers * experts) / m.layers


def layer_activation_bytes(
    job: TrainingJob, micro_batch: int, tp: int, recompute: str, sequence_parallel: bool | None = None, cp: int = 1,
    expert_copies: bool = True,
) -> float:
    """Activations one layer keeps for one micro-batch until its backward pass, per GPU
    (the module's table; `sequence_parallel` None: the job's setting; `cp`: context-parallel
    ranks, each holding s/cp tokens; `expert_copies` False: an MoE layer's MLP counted once,
    as the estimator's memory-traffic proxy does)."""
    m = job.model
    sbh = m.seq_len * micro_batch * m.hidden
    sp = (job.sequence_parallel if sequence_parallel is None else sequence_parallel) and tp > 1
    if recompute == "full":
        kept = 2.0 * sbh / tp if sp else 2.0 * sbh
    else:
        replicated = REPLICATED_SBH * sbh / tp if sp else REPLICATED_SBH * sbh
        kept = replicated + tp_split_bytes(job, micro_batch, tp, recompute, expert_copies)
    return kept / cp if cp > 1 else kept


def tp_split_bytes(job: TrainingJob, micro_batch: int, tp: int, recompute: str, expert_copies: bool = True) -> float:
    """The tensors tensor parallelism splits: Q, K, V, attention output, MLP (× `mlp_activation_factor`
    with `expert_copies`), scores."""
    m = job.model
    sb = m.seq_len * micro_batch
    sbh = sb * m.hidden
    mlp = (SWIGLU_SBH_PER_F if m.mlp == "swiglu" else GELU_SBH_PER_F) * sb * m.ffn_hidden
    if m.attention_width != m.hidden:  # head_dim set apart from h/heads: Q and attention output are heads·d wide
        attention = 4.0 * sb * m.attention_width / tp + 4.0 * sb * m.head_dim * max(m.kv_heads / tp, 1.0)
    elif m.kv_heads == m.heads:  # multi-head attention: K and V 4·sbh/t, as published
        attention = 8.0 * sbh / tp
    else:  # K and V shrink to kv_heads heads, one each per rank when tp > kv_heads (replicated)
        attention = 4.0 * sbh / tp + 4.0 * sb * m.head_dim * max(m.kv_heads / tp, 1.0)
    if expert_copies and m.experts > 1:
        mlp *= mlp_activation_factor(job)
    stored = attention + mlp / tp
    if recompute == "none" and not job.flash_attention:
        stored += 5.0 * m.heads * m.seq_len * sb / tp
    return stored


def working_layer_bytes(job: TrainingJob, micro_batch: int, tp: int, cp: int = 1) -> float:
    """One layer's full activations, rebuilt during recomputation."""
    return layer_activation_bytes(job, micro_batch, tp, "none", cp=cp)


def in_flight_micro_batches(plan: ParallelPlan, rank: int, micro_batches: int) -> float:
    """Micro-batches whose activations pipeline rank `rank` holds at its peak: min(pp − rank, m)
    under 1F1B, × (1 + (pp − 1)/(pp·v)) interleaved (Korthikanti §4.2.3)."""
    in_flight: float = min(micro_batches, plan.pp - rank)
    if plan.virtual_stages > 1:
        in_flight *= 1.0 + (plan.pp - 1) / (plan.pp * plan.virtual_stages)
    return in_flight


def stage_memory_bytes(
    job: TrainingJob,
    plan: ParallelPlan,
    params_on_rank: float,
    layers: int,
    rank: int,
    last: bool,
    expert_params: float = 0.0,
) -> float:
    """Peak bytes on one GPU of pipeline rank `rank` (0 = first stage); `expert_params` of
    `params_on_rank` are expert weights (ZeRO-sharded over the expert-data-parallel group)."""
    m = job.model
    states = model_state_bytes(params_on_rank, plan, job.optimizer_offload, expert_params)
    mb = plan.micro_batch
    if m.kind == "cnn":
        return states + CNN_ACTIVATION_BYTES_PER_PARAM_IMAGE * m.total_params() * mb
    if plan.zero_stage == 3:
        states += prefetch_buffer_bytes(plan, params_on_rank, layers)
    cp = plan.cp
    micro_batches = job.global_batch // (mb * plan.dp)
    per_layer = layer_activation_bytes(job, mb, plan.tp, plan.recompute, cp=cp)
    activations = in_flight_micro_batches(plan, rank, micro_batches) * layers * per_layer
    if plan.recompute == "full":
        activations += working_layer_bytes(job, mb, plan.tp, cp)
    if last:
        activations += 8.0 * m.seq_len * mb * m.vocab / plan.tp / cp
    return states + activations * (1.0 + ACTIVATION_FRAGMENTATION)


def prefetch_buffer_bytes(plan: ParallelPlan, params_on_rank: float, layers: int) -> float:
    """ZeRO-3's gathered weights: the layer being computed and the one prefetched (2 bytes each),
    beyond the 1/shard the rank keeps anyway."""
    shard = zero_shards(plan)[0]
    if shard <= 1 or layers <= 0:
        return 0.0
    return 2.0 * 2.0 * params_on_rank / layers * (1.0 - 1.0 / shard)
