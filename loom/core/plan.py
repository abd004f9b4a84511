"""How a job is parallelised: carried from policy to backend, priced by loom.perf."""

from __future__ import annotations

from dataclasses import dataclass

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """dp × tp × pp ranks, micro-batch, interleaving, ZeRO and recomputation.

    `zero_shard` > 0 shards ZeRO state within groups of that many DP ranks
    (hierarchical ZeRO, as Acme's InternEvo does); 0 shards over the whole DP group.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    virtual_stages: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    zero_shard: int = 0

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        text = f"dp{self.dp}·tp{self.tp}·pp{self.pp}"
        if self.virtual_stages > 1:
            text += f"·v{self.virtual_stages}"
        return text

    def describe(self) -> str:
        """Every knob, for tables and decision reasons."""
        zero = f"zero{self.zero_stage}" + (f"/{self.zero_shard}" if self.zero_shard else "")
        return f"{self} mb{self.micro_batch} {zero} recompute={self.recompute}"
