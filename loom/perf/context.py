"""Context parallelism: ring attention's K/V exchange, per stage and micro-batch.

With `cp` context-parallel ranks (Megatron-Core's ``--context-parallel-size``;
Liu et al. 2023, "Ring Attention with Blockwise Transformers") each rank holds
s/cp tokens of every sequence (2 chunks of s/(2·cp), paired so causal attention
is balanced: `loom.perf.inputs.check_cp`). Every layer's attention needs all
keys and values, so each rank passes its K/V chunk around the ring: cp − 1
send/recv steps of 2·(s/cp)·kv_dim·b elements (K and V; kv_dim = the KV heads
on this TP rank × head_dim, one head when tp > kv_heads) in the forward pass,
and twice that in the backward pass (K/V again, and their gradients dK/dV
travelling back). A recomputed forward (selective or full) runs the ring again.

Each step overlaps the attention of the chunk already received (FlashAttention
on one s/cp × s/cp block: the layer's attention core / cp), so a step exposes
only max(0, send − block attention); the cp − 1 steps of a pass expose
(cp − 1)·that. Everything else a rank computes (projections, MLP, logits,
memory traffic) holds s/cp tokens, so it is divided by cp (`Estimator`).

Placement: Megatron-Core orders ranks TP fastest, then CP, so a CP group's
neighbours are tp apart and the ring stays inside a node when tp·cp ≤ GPUs per
node (NVLink); otherwise its slowest hop crosses nodes and every step is priced
on the NIC. K/V travel in 16-bit (`KV_BYTES`) whatever the GEMM precision.
"""

from __future__ import annotations

from loom.perf.comm import CommModel, GroupShape, Links
from loom.perf.inputs import TrainingJob
from loom.perf.stages import StageSpec

KV_BYTES = 2.0  # K/V chunks are bf16 even with FP8 GEMMs (Transformer Engine keeps attention in bf16)


def kv_chunk_bytes(job: TrainingJob, stage: StageSpec, mb: int) -> float:
    """Bytes of one ring step: the K and V of s/cp tokens for this TP rank's KV heads."""
    m = job.model
    kv_heads_here = max(m.kv_heads / stage.tp, 1.0)  # replicated: one head each when tp > kv_heads
    return 2.0 * (m.seq_len / stage.cp) * kv_heads_here * m.head_dim * mb * KV_BYTES


def ring_group(stage: StageSpec) -> GroupShape:
    """A ring hop: inside a node when the TP·CP block fits in one (Megatron's rank order)."""
    same_node = stage.tp * stage.cp <= stage.hardware.gpus_per_node
    return GroupShape(size=2, per_node=2 if same_node else 1)


def ring_passes(recompute: str) -> int:
    """K/V ring passes per layer and micro-batch: forward 1, backward 2, +1 when the forward's
    attention is recomputed (selective or full)."""
    return 3 + (1 if recompute in ("selective", "full") else 0)


def ring_attention_s(comm: CommModel, links: Links, job: TrainingJob, stage: StageSpec, mb: int, recompute: str,
                     attention_layer_s: float) -> float:
    """Exposed ring-attention time of one micro-batch on a stage: layers × passes × (cp − 1)
    steps × max(0, send − attention of one block). `attention_layer_s`: this rank's forward
    attention-core time for one layer (all its s/cp queries against all s keys)."""
    cp = stage.cp
    if cp <= 1 or job.model.kind == "cnn":
        return 0.0
    step = comm.send(kv_chunk_bytes(job, stage, mb), ring_group(stage), links)
    exposed = max(0.0, step - attention_layer_s / cp)
    return stage.layers * ring_passes(recompute) * (cp - 1) * exposed


__all__ = ["KV_BYTES", "kv_chunk_bytes", "ring_attention_s", "ring_group", "ring_passes"]
