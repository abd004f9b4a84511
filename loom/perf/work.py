"""One pipeline stage's work for one micro-batch: GEMM FLOPs and memory traffic per GPU.

Forward GEMMs per layer: 2·tokens·W for the matmul weights W a token passes
(`ModelSpec.matmul_weights_per_token` / layers, plus MoE capacity padding) and the
attention core 4·b·s²·(heads·head_dim); the LM head 2·tokens·h·V on the last stage;
all / tp, and / cp for context parallelism (each rank's s/cp queries). Backward is
2× forward; full recomputation adds a forward, selective the attention core.
Memory traffic is proxied by the activation bytes a layer writes and reads
(`loom.perf.memory.layer_activation_bytes`), × `UNFUSED_TRAFFIC_FACTOR` for eager
frameworks. The attention core and the LM head are returned apart: FP8 recipes keep
them in BF16 (`Estimator` prices them at the BF16 peak for fp8 jobs).
"""

from __future__ import annotations

from loom.perf.flops import CNN_SPATIAL_REUSE
from loom.perf.inputs import TrainingJob
from loom.perf.memory import (
    CNN_ACTIVATION_BYTES_PER_PARAM_IMAGE,
    layer_activation_bytes,
)
from loom.perf.moe import padding_weights_per_layer
from loom.perf.stages import StageSpec

# Eager (unfused) transformer layers move ~2.5x the bytes of fused ones: counting
# HF Llama's ops per token (fp32 RMSNorm upcasts, rotary slicing/cat, SiLU·up,
# residual adds) gives ~171·h bytes forward vs ~68·h for Megatron's fused kernels.
UNFUSED_TRAFFIC_FACTOR = 2.5


def stage_work(job: TrainingJob, stage: StageSpec, mb: int, recompute: str,
               weights_per_layer: float) -> tuple[float, float, float, float]:
    """GEMM FLOPs and memory traffic per GPU for one micro-batch, the share of the time
    spent in the backward pass, and the FLOPs of the attention core and LM head among the
    GEMM FLOPs (FP8 recipes keep them in BF16)."""
    model = job.model
    if model.kind == "cnn":
        forward = 2.0 * model.total_params() * CNN_SPATIAL_REUSE * mb
        fwd_traffic = 2.0 * CNN_ACTIVATION_BYTES_PER_PARAM_IMAGE * model.total_params() * mb
        return 3.0 * forward, 3.0 * fwd_traffic, 2.0 / 3.0, 0.0
    tp, layers = stage.tp, stage.layers
    tokens = mb * model.seq_len
    if model.experts > 1 and job.capacity_factor != 1.0:  # padded expert buffers (`loom.perf.moe`)
        weights_per_layer += padding_weights_per_layer(job)
    attention = 4.0 * mb * model.seq_len**2 * model.attention_width
    fwd_layer = 2.0 * tokens * weights_per_layer + attention
    # the whole sequence (/ cp below); MoE layers' MLP traffic counted as one MLP's (see ESTIMATOR.md, Limits)
    traffic_layer = 2.0 * layer_activation_bytes(job, mb, tp, "none", expert_copies=False)
    if not job.fused_kernels:
        traffic_layer *= UNFUSED_TRAFFIC_FACTOR
    forward = layers * fwd_layer / tp
    if tp > model.kv_heads:  # replicated KV heads: each rank projects one K and one V head
        forward += layers * 2.0 * tokens * model.kv_replicated_weights(tp)
    fwd_traffic = layers * traffic_layer
    bf16_forward = layers * attention / tp
    if stage.last:
        logits = 2.0 * tokens * model.hidden * model.vocab / tp
        forward += logits
        bf16_forward += logits
        fwd_traffic += 12.0 * tokens * model.vocab / tp
    gemm, traffic, bf16 = 3.0 * forward, 3.0 * fwd_traffic, 3.0 * bf16_forward
    if recompute == "full":
        gemm += forward
        traffic += fwd_traffic
        bf16 += bf16_forward
    elif recompute == "selective":
        gemm += layers * attention / tp
        bf16 += layers * attention / tp
    if stage.cp > 1:  # every term is linear in this rank's s/cp tokens (attention: s/cp queries × s keys)
        return gemm / stage.cp, traffic / stage.cp, (gemm - forward) / gemm, bf16 / stage.cp
    return gemm, traffic, (gemm - forward) / gemm, bf16


__all__ = ["UNFUSED_TRAFFIC_FACTOR", "stage_work"]
