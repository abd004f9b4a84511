"""Model specification and parameter counts for the performance estimator.

`ModelSpec` describes one model in the notation of Narayanan et al. (2021):
l layers, hidden size h, a attention heads, FFN size f (4h unless given),
sequence length s and vocabulary V, optionally Mixture-of-Experts.

Parameter-count conventions (every term, so totals can be audited):

- embedding: ``V·h``; plus ``s·h`` when ``position == "learned"`` (GPT, BERT);
  nothing for ``"rope"``/``"none"`` (rotary embeddings have no weights). The
  output (logit) layer shares the input embedding when ``tied_embeddings``
  (GPT-3, Megatron), else adds another ``V·h`` (Llama-2).
- attention per layer: Q and O are ``h×(heads·d)`` and ``(heads·d)×h``; K and V are
  ``h×(kv_heads·d)`` for head size d = ``head_dim`` (default h/heads, so Q and O are
  ``h×h``; Qwen3 and gpt-oss set it apart); grouped-query attention when
  ``kv_heads < heads``, multi-query when 1; biases on all four when ``bias``.
  Multi-head GPT: ``4h² + 4h``. Tensor parallelism
  splits the KV heads, or replicates them when tp > kv_heads
  (`kv_replicated_weights`; `loom.perf.inputs.check_tp` needs one to divide the other).
- MLP per layer: ``mlp="gelu"``: two matrices ``2·h·f`` (+ ``f + h`` biases);
  ``mlp="swiglu"``: three matrices ``3·h·f`` (+ ``2f + h`` biases).
- norms: two per layer plus a final one; LayerNorm has weight and bias (``2h``
  each, ``4h`` per layer), RMSNorm only a weight (``h`` each).
- MoE: after the first ``first_dense_layers`` layers (DeepSeek's first_k_dense),
  every ``moe_every``-th layer holds ``experts`` routed expert MLPs of FFN size
  ``expert_ffn_hidden`` (default ``ffn_hidden``), ``shared_experts`` always-active
  ones of the same size (DeepSeek, Qwen2-MoE) and a router ``h·experts`` (no
  bias); the *activated* count keeps ``top_k`` routed experts plus the shared ones
  per MoE layer. Dense layers use ``ffn_hidden``.
- ``kind="cnn"`` models carry a declared ``params`` count (no formula applies);
  see `loom.perf.flops` for their FLOP approximation.

With these rules GPT-3 175B counts 174.6e9 parameters, Llama-2 7B/13B/70B
6.74e9 / 13.02e9 / 68.98e9.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field

from loom.errors import LoomInputError

KINDS = ("transformer", "cnn")
MLPS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope", "none")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model's shape. Validated on construction (`LoomInputError` naming the field)."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_hidden: int | None = None  # None -> 4·hidden
    experts: int = 1  # 1 = dense
    top_k: int = 1
    moe_every: int = 1  # every n-th layer is MoE (when experts > 1)
    kind: str = "transformer"
    mlp: str = "gelu"
    kv_heads: int | None = None  # None -> heads (no GQA)
    bias: bool = True
    norm: str = "layernorm"
    position: str = "learned"
    tied_embeddings: bool = True
    head_dim: int | None = None  # None -> hidden // heads
    expert_ffn_hidden: int | None = None  # None -> ffn_hidden
    shared_experts: int = 0  # always-active experts per MoE layer
    first_dense_layers: int = 0  # leading layers that are dense in an MoE model
    params: int | None = (
        None  # declared total; required for kind="cnn", else must be None
    )
    source: str = ""  # provenance / assumptions, free text
    # heads·head_dim: Q's and the attention output's width (= hidden unless head_dim is set); derived
    attention_width: int = dataclass_field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise LoomInputError(
                f"model name must be a non-empty string, got {self.name!r}",
                field="name",
            )
        for field in (
            "layers",
            "hidden",
            "heads",
            "seq_len",
            "vocab",
            "experts",
            "top_k",
            "moe_every",
        ):
            _positive_int(field, getattr(self, field))
        for field in ("ffn_hidden", "kv_heads", "params", "head_dim", "expert_ffn_hidden"):
            if getattr(self, field) is not None:
                _positive_int(field, getattr(self, field))
        for field in ("shared_experts", "first_dense_layers"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LoomInputError(f"must be a non-negative integer, got {value!r}", field=field)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.expert_ffn_hidden is None:
            object.__setattr__(self, "expert_ffn_hidden", self.ffn_hidden)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for field, allowed in (
            ("kind", KINDS),
            ("mlp", MLPS),
            ("norm", NORMS),
            ("position", POSITIONS),
        ):
            value = getattr(self, field)
            if value not in allowed:
                raise LoomInputError(
                    f"must be one of {', '.join(allowed)}, got {value!r}", field=field
                )
        for field in ("bias", "tied_embeddings"):
            if not isinstance(getattr(self, field), bool):
                raise LoomInputError(
                    f"must be true or false, got {getattr(self, field)!r}", field=field
                )
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise LoomInputError(
                    f"hidden ({self.hidden}) must be divisible by heads ({self.heads}), or give head_dim",
                    field="hidden",
                )
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        object.__setattr__(self, "attention_width", self.heads * self.head_dim)
        if self.heads % self.kv_heads:
            raise LoomInputError(
                f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})",
                field="kv_heads",
            )
        if self.top_k > self.experts:
            raise LoomInputError(
                f"top_k ({self.top_k}) exceeds experts ({self.experts})", field="top_k"
            )
        if self.experts > 1 and self.moe_every > self.layers - self.first_dense_layers:
            raise LoomInputError(
                f"moe_every ({self.moe_every}) exceeds the layers after the first dense ones "
                f"({self.layers} - {self.first_dense_layers}): no MoE layer",
                field="moe_every",
            )
        if self.experts == 1 and (self.shared_experts or self.first_dense_layers):
            field = "shared_experts" if self.shared_experts else "first_dense_layers"
            raise LoomInputError("only MoE models (experts > 1) have it", field=field)
        if self.kind == "cnn" and self.params is None:
            raise LoomInputError(
                "a cnn model needs a declared parameter count", field="params"
            )
        if self.kind != "cnn" and self.params is not None:
            raise LoomInputError(
                "only cnn models declare params; transformers are counted",
                field="params",
            )
        if not isinstance(self.source, str):
            raise LoomInputError("must be a string", field="source")

    # -- shape helpers -------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 1


    @property
    def ffn_type(self) -> str:
        """The FFN kind ("gelu": 2 matrices, "swiglu": 3), stored as `mlp`; the CLI's --ffn-type."""
        return self.mlp

    def kv_replicated_weights(self, tp: int) -> int:
        """KV projection weights each GPU holds beyond its 1/tp share: Megatron replicates
        KV heads when tp > kv_heads, so each rank keeps one K and one V head (2·h·d)
        instead of 2·h·d·kv_heads/tp. Zero when tp ≤ kv_heads."""
        kv = self.kv_heads or self.heads
        if tp <= kv:
            return 0
        return 2 * self.hidden * self.head_dim * (tp - kv) // tp

    @property
    def moe_layers(self) -> int:
        """Number of MoE layers (every `moe_every`-th one); 0 for a dense model."""
        return (self.layers - self.first_dense_layers) // self.moe_every if self.is_moe else 0

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    # -- parameter counts ----------------------------------------------------
    def attention_params(self) -> int:
        h, q, kv = self.hidden, self.attention_width, self.kv_heads * self.head_dim
        weights = 2 * h * q + 2 * h * kv
        return weights + ((q + h + 2 * kv) if self.bias else 0)

    def attention_weights(self) -> int:
        """Attention matmul weights of one layer (no biases): what FLOPs count."""
        h, q, kv = self.hidden, self.attention_width, self.kv_heads * self.head_dim
        return 2 * h * q + 2 * h * kv

    def mlp_weights(self) -> int:
        """Matmul weights of one (dense or expert) MLP."""
        return (3 if self.mlp == "swiglu" else 2) * self.hidden * self.ffn_hidden

    def mlp_params(self) -> int:
        return self._mlp_params(self.ffn_hidden)

    def expert_mlp_weights(self) -> int:
        """Matmul weights of one expert MLP (FFN size `expert_ffn_hidden`)."""
        return (3 if self.mlp == "swiglu" else 2) * self.hidden * self.expert_ffn_hidden

    def expert_mlp_params(self) -> int:
        return self._mlp_params(self.expert_ffn_hidden)

    def _mlp_params(self, f: int) -> int:
        h = self.hidden
        biases = ((2 * f if self.mlp == "swiglu" else f) + h) if self.bias else 0
        return (3 if self.mlp == "swiglu" else 2) * h * f + biases

    def norm_params(self) -> int:
        """One norm module (weight, plus bias for LayerNorm)."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def router_params(self) -> int:
        return self.hidden * self.experts if self.is_moe else 0

    def embedding_params(self) -> int:
        """Input embedding, learned positions and (untied) output layer."""
        h = self.hidden
        total = self.vocab * h
        if self.position == "learned":
            total += self.seq_len * h
        if not self.tied_embeddings:
            total += self.vocab * h
        return total

    def layer_params(self, moe: bool = False, activated: bool = False) -> int:
        """Parameters of one transformer layer (`moe`: an MoE layer)."""
        base = self.attention_params() + 2 * self.norm_params()
        if not moe:
            return base + self.mlp_params()
        copies = (self.top_k if activated else self.experts) + self.shared_experts
        return base + copies * self.expert_mlp_params() + self.router_params()

    def total_params(self) -> int:
        """Ψ: every parameter stored (all experts)."""
        if self.params is not None:
            return self.params
        return self._count(activated=False)

    def activated_params(self) -> int:
        """Parameters touched per token (MoE: `top_k` experts); = total for dense."""
        if self.params is not None:
            return self.params
        return self._count(activated=True)

    def _count(self, activated: bool) -> int:
        return (
            self.embedding_params()
            + self.norm_params()  # final norm
            + self.dense_layers * self.layer_params()
            + self.moe_layers * self.layer_params(moe=True, activated=activated)
        )

    def matmul_weights_per_token(self) -> int:
        """Transformer-layer matmul weights a token passes through (activated experts,
        router included; embedding lookup and logit layer excluded)."""
        mlp = self.mlp_weights()
        dense = self.attention_weights() + mlp
        experts = (self.top_k + self.shared_experts) * self.expert_mlp_weights()
        moe = self.attention_weights() + experts + self.router_params()
        return self.dense_layers * dense + self.moe_layers * moe


def _positive_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LoomInputError(f"must be a positive integer, got {value!r}", field=field)
