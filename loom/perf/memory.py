"""GPU memory per rank: model states with ZeRO, activations per pipeline rank.

Model states (Acme, seed 001 §4.1; Rajbhandari et al. 2020): mixed-precision
Adam keeps 2Ψ bytes of weights, 2Ψ of gradients and 12Ψ of optimizer state
(fp32 master weights, momentum, variance) for Ψ parameters on a rank. ZeRO-1
shards the optimizer state, ZeRO-2 also the gradients, ZeRO-3 also the weights,
over the DP group or over groups of `zero_shard` ranks (hierarchical ZeRO).

Activations per layer and micro-batch of b sequences (Korthikanti et al. 2022,
tensor parallel t, no sequence parallelism): s·b·h·(10 + 24/t) bytes plus
5·a·s²·b/t when attention scores are materialised (no FlashAttention). Of the
24/t, K and V are 4/t (2·s·b·h each); with grouped-query attention they are
4·s·b·d·max(g/t, 1) for g KV heads of size d (one head per rank when the heads
are replicated, t > g). The MLP's 16/t assumes a 4h GeLU MLP (not yet scaled
to ffn_hidden or SwiGLU: a later increment of issue 22).
Selective recomputation drops the score term; full recomputation keeps only
each layer's 2·s·b·h input plus one layer's working set. Under 1F1B the first
pipeline rank holds pp micro-batches in flight, rank r holds pp − r; the
interleaved schedule multiplies by 1 + (pp − 1)/(pp·v). The last rank also
holds fp32 logits and their gradient: 8·s·b·V/t bytes.
"""

from __future__ import annotations

from loom.core.plan import ParallelPlan
from loom.perf.inputs import TrainingJob

GIB = 2**30
CNN_ACTIVATION_BYTES_PER_PARAM_IMAGE = 4.0  # ResNet-50 bf16 training: ~100 MB/image for 25.6 M params


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


def layer_activation_bytes(job: TrainingJob, micro_batch: int, tp: int, recompute: str) -> float:
    """Activations one layer keeps for one micro-batch until its backward pass."""
    m = job.model
    sbh = m.seq_len * micro_batch * m.hidden
    if recompute == "full":
        return 2.0 * sbh
    if m.kv_heads == m.heads:  # multi-head attention: Korthikanti's 24/t as published
        stored = sbh * (10.0 + 24.0 / tp)
    else:  # K and V (2·sbh each with MHA) shrink to kv_heads heads, one per rank when tp > kv_heads
        stored = sbh * (10.0 + 20.0 / tp) + 4.0 * m.seq_len * micro_batch * m.head_dim * max(m.kv_heads / tp, 1.0)
    if recompute == "none" and not job.flash_attention:
        stored += 5.0 * m.heads * m.seq_len * m.seq_len * micro_batch / tp
    return stored


def working_layer_bytes(job: TrainingJob, micro_batch: int, tp: int) -> float:
    """One layer's full activations, rebuilt during recomputation."""
    return layer_activation_bytes(job, micro_batch, tp, "none")


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
    in_flight = min(micro_batches, plan.pp - rank)
    if plan.virtual_stages > 1:
        in_flight *= 1.0 + (plan.pp - 1) / (plan.pp * plan.virtual_stages)
    per_layer = layer_activation_bytes(job, mb, plan.tp, plan.recompute)
    activations = in_flight * layers * per_layer
    if plan.recompute == "full":
        activations += working_layer_bytes(job, mb, plan.tp)
    if last:
        activations += 8.0 * m.seq_len * mb * m.vocab / plan.tp
    return states + activations
