"""How a job is parallelised. The estimator issue fills in the search; the
core only carries the plan from policy to backend."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    virtual_stages: int = 1
    zero_stage: int = 0

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        return f"dp{self.dp}·tp{self.tp}·pp{self.pp}"
