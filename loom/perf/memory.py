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

Allocator allowance: activations are allocated and freed every micro-batch in
many sizes, so PyTorch's caching allocator reserves more than the tensors
need; `ACTIVATION_FRAGMENTATION` adds that share on top of the activations
(model states are allocated once and do not fragment). The fixed part — CUDA
context, NCCL buffers, cuBLAS workspaces — is the calibration's
`memory_reserve_gib`.
"""

from __future__ import annotations

from loom.core.plan import ParallelPlan
from loom.perf.inputs import TrainingJob

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


def model_state_bytes(params_on_rank: float, plan: ParallelPlan, offload: bool = False) -> float:
    """Weights + gradients + optimizer state of `params_on_rank` parameters
    (`offload`: the optimizer state lives in host memory)."""
    shard = plan.zero_shard or plan.dp
    weights, grads, optim = 2.0 * params_on_rank, 2.0 * params_on_rank, 12.0 * params_on_rank
    if plan.zero_stage >= 1:
        optim /= shard
    if plan.zero_stage >= 2:
        grads /= shard
    if plan.zero_stage >= 3:
        weights /= shard
    return weights + grads + (0.0 if offload else optim)


def layer_activation_bytes(
    job: TrainingJob, micro_batch: int, tp: int, recompute: str, sequence_parallel: bool | None = None
) -> float:
    """Activations one layer keeps for one micro-batch until its backward pass, per GPU
    (the module's table; `sequence_parallel` None: the job's setting)."""
    m = job.model
    sbh = m.seq_len * micro_batch * m.hidden
    sp = (job.sequence_parallel if sequence_parallel is None else sequence_parallel) and tp > 1
    if recompute == "full":
        return 2.0 * sbh / tp if sp else 2.0 * sbh
    replicated = REPLICATED_SBH * sbh / tp if sp else REPLICATED_SBH * sbh
    return replicated + tp_split_bytes(job, micro_batch, tp, recompute)


def tp_split_bytes(job: TrainingJob, micro_batch: int, tp: int, recompute: str) -> float:
    """The tensors tensor parallelism splits: Q, K, V, attention output, MLP, scores."""
    m = job.model
    sb = m.seq_len * micro_batch
    sbh = sb * m.hidden
    mlp = (SWIGLU_SBH_PER_F if m.mlp == "swiglu" else GELU_SBH_PER_F) * sb * m.ffn_hidden
    if m.kv_heads == m.heads:  # multi-head attention: K and V 4·sbh/t, as published
        attention = 8.0 * sbh / tp
    else:  # K and V shrink to kv_heads heads, one each per rank when tp > kv_heads (replicated)
        attention = 4.0 * sbh / tp + 4.0 * sb * m.head_dim * max(m.kv_heads / tp, 1.0)
    stored = attention + mlp / tp
    if recompute == "none" and not job.flash_attention:
        stored += 5.0 * m.heads * m.seq_len * sb / tp
    return stored


def working_layer_bytes(job: TrainingJob, micro_batch: int, tp: int) -> float:
    """One layer's full activations, rebuilt during recomputation."""
    return layer_activation_bytes(job, micro_batch, tp, "none")


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
) -> float:
    """Peak bytes on one GPU of pipeline rank `rank` (0 = first stage)."""
    m = job.model
    states = model_state_bytes(params_on_rank, plan, job.optimizer_offload)
    mb = plan.micro_batch
    if m.kind == "cnn":
        return states + CNN_ACTIVATION_BYTES_PER_PARAM_IMAGE * m.total_params() * mb
    micro_batches = job.global_batch // (mb * plan.dp)
    per_layer = layer_activation_bytes(job, mb, plan.tp, plan.recompute)
    activations = in_flight_micro_batches(plan, rank, micro_batches) * layers * per_layer
    if plan.recompute == "full":
        activations += working_layer_bytes(job, mb, plan.tp)
    if last:
        activations += 8.0 * m.seq_len * mb * m.vocab / plan.tp
    return states + activations * (1.0 + ACTIVATION_FRAGMENTATION)
