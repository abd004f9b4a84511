"""How a job is parallelised: carried from policy to backend, priced by loom.perf."""

from __future__ import annotations

from dataclasses import dataclass

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """dp × tp × pp × cp ranks, micro-batch, interleaving, ZeRO, recomputation, experts.

    `zero_shard` > 0 shards ZeRO state within groups of that many DP ranks
    (hierarchical ZeRO, as Acme's InternEvo does); 0 shards over the whole DP group
    (dp·cp ranks: context-parallel ranks hold the same weights).
    `cp` splits each sequence over that many ranks (context parallelism, ring attention);
    `ep` shards an MoE model's experts over that many of the dp·cp ranks (expert parallelism
    folded inside data parallelism, as Megatron-Core does: it adds no GPUs). Both default
    to 1 so every plan written before them means what it did.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    virtual_stages: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    zero_shard: int = 0
    cp: int = 1
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def __str__(self) -> str:
        text = f"dp{self.dp}·tp{self.tp}·pp{self.pp}"
        if self.virtual_stages > 1:
            text += f"·v{self.virtual_stages}"
        if self.cp > 1:
            text += f"·cp{self.cp}"
        if self.ep > 1:
            text += f"·ep{self.ep}"
        return text

    def describe(self) -> str:
        """Every knob, for tables and decision reasons."""
        zero = f"zero{self.zero_stage}" + (f"/{self.zero_shard}" if self.zero_shard else "")
        return f"{self} mb{self.micro_batch} {zero} recompute={self.recompute}"
