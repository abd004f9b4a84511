"""FLOPs per training iteration.

Conventions (one multiply-add = 2 FLOPs; B sequences of `seq_len` tokens each):

- forward = ``2 · W · B·s`` for the matmul weights W a token passes through
  (attention projections, MLP or its `top_k` activated experts, MoE router;
  biases, norms, softmax and activations are ignored)
  + attention scores and context ``4 · B · s² · h · l`` (QKᵀ and AV over the
  full s×s matrix: no causal halving, as in Megatron-LM's accounting; h is
  heads·head_dim when the model sets `head_dim`)
  + logits ``2 · B · s · h · V``.
- backward = 2 × forward.
- ``recompute="none"``: model FLOPs = 3 × forward (what MFU counts);
  ``"selective"`` adds the attention score/context forward once more
  (Korthikanti et al. 2022); ``"full"`` adds a whole forward (4 × forward,
  logits included). For GPT models, ``"full"`` reproduces Narayanan et al.'s
  ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`` exactly (biases are not counted).
- ``kind="cnn"`` (approximation, clearly not exact): forward per sample
  ``≈ 2 · params · CNN_SPATIAL_REUSE``, i.e. each weight is applied at ~160
  output positions on average for a 224×224 ResNet-style network (ResNet-50:
  25.6 M params, 4.1 GMACs; WRN-50-2: 68.9 M, 11.4 GMACs: ratio ≈ 160-165).
  Widening a ResNet scales params and FLOPs alike, so the ratio carries over
  to the Alpa wide-ResNets. B counts images.
"""

from __future__ import annotations

from loom.errors import LoomInputError
from loom.perf.model import ModelSpec

RECOMPUTE = ("none", "selective", "full")
CNN_SPATIAL_REUSE = 160.0


def attention_core_flops(model: ModelSpec, batch: int) -> float:
    """Forward FLOPs of attention scores and context over all layers."""
    _check_batch(batch)
    if model.kind == "cnn":
        return 0.0
    return 4.0 * batch * model.seq_len**2 * model.attention_width * model.layers


def forward_flops(model: ModelSpec, batch: int) -> float:
    """Forward-pass FLOPs for `batch` sequences (images for a cnn)."""
    _check_batch(batch)
    if model.kind == "cnn":
        return 2.0 * model.total_params() * CNN_SPATIAL_REUSE * batch
    tokens = batch * model.seq_len
    matmul = 2.0 * model.matmul_weights_per_token() * tokens
    logits = 2.0 * tokens * model.hidden * model.vocab
    return matmul + logits + attention_core_flops(model, batch)


def flops_per_iteration(
    model: ModelSpec, global_batch: int, recompute: str = "none"
) -> float:
    """FLOPs of one training iteration over `global_batch` sequences.

    ``recompute="none"`` gives model FLOPs (the MFU numerator); the other modes
    add the recomputed forward work the hardware actually executes.
    """
    fwd = forward_flops(model, global_batch)
    if recompute == "none":
        return 3.0 * fwd
    if recompute == "selective":
        return 3.0 * fwd + attention_core_flops(model, global_batch)
    if recompute == "full":
        return 4.0 * fwd
    raise LoomInputError(
        f"must be one of {', '.join(RECOMPUTE)}, got {recompute!r}", field="recompute"
    )


def megatron_flops(
    batch: int, seq_len: int, layers: int, hidden: int, vocab: int
) -> float:
    """Narayanan et al. (SC'21) eq. 3: GPT iteration FLOPs with full recomputation."""
    s, l, h = seq_len, layers, hidden
    return 96.0 * batch * s * l * h * h * (1 + s / (6 * h) + vocab / (16 * l * h))


def _check_batch(batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise LoomInputError(
            f"must be a positive integer, got {batch!r}", field="global_batch"
        )
