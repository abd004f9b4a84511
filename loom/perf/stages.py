"""Pipeline stages: how a uniform plan's layers are split over its pp stages.

A stage is a `StageSpec` (its GPUs and contiguous layers); identical consecutive
stages are grouped (`count`) so that the estimator prices each shape once.

Split rule (`split_layers`):

- layers divisible by pp: every stage gets layers/pp (Megatron's default and
  the only split of ``pipeline_split="even"``, the behaviour before issue 22);
- otherwise (``pipeline_split="uneven"``, the default): q = layers // pp on every stage and
  the r = layers mod pp extra layers one each on the middle stages, the ones
  nearest the last stage first (they hold the fewest in-flight micro-batches
  under 1F1B, so memory stays balanced). The first stage (embedding) and the
  last (LM head, whose logit GEMM costs 2·h·V FLOPs per token, about 2.4 layers
  of Llama 3 8B) keep q. Only when r = pp − 1 (more extras than middle stages)
  does the first stage take the last extra; the last stage always keeps the
  fewest. This is Megatron-Core's convention of counting the embedding and the
  loss as a layer each: Llama 3 405B's 126 layers on 16 stages split 7, 8×14, 7
  (Dubey et al. 2024, §3.3.2).

The pipeline then runs at the pace of its slowest stage and each stage's memory
is checked on its own (`Estimator`), so the most loaded stage decides both.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from loom.core.plan import ParallelPlan
from loom.perf.inputs import Hardware, TrainingJob


@dataclass(frozen=True, slots=True)
class StageSpec:
    """`count` identical pipeline stages of `layers` layers each on dp × tp × cp GPUs
    (`cp`: context-parallel ranks; `ep`: expert-parallel ranks among the dp·cp, no extra GPUs)."""

    hardware: Hardware
    tp: int
    dp: int
    layers: int
    first: bool = False
    last: bool = False
    count: int = 1
    cp: int = 1
    ep: int = 1

    @property
    def gpus(self) -> int:
        """GPUs of one such stage."""
        return self.dp * self.tp * self.cp


def split_layers(layers: int, pp: int) -> tuple[int, ...]:
    """Layers on each of the pp stages, first to last (the module's rule)."""
    q, r = divmod(layers, pp)
    if r == 0 or pp == 1:
        return (q,) * pp
    middle = pp - 2
    to_first = max(0, r - middle)  # 1 only when r = pp - 1
    extras_mid = r - to_first
    mids = (q,) * (middle - extras_mid) + (q + 1,) * extras_mid
    return (q + to_first, *mids, q)


def uniform_stages(job: TrainingJob, hardware: Hardware, plan: ParallelPlan) -> tuple[StageSpec, ...]:
    """The stages of a uniform plan: first, middle run(s) and last (at most four distinct shapes)."""
    return _uniform_stages(hardware, plan.tp, plan.dp, plan.pp, job.model.layers, plan.cp, plan.ep)


@lru_cache(maxsize=1 << 16)
def _uniform_stages(hardware: Hardware, tp: int, dp: int, pp: int, layers: int, cp: int = 1,
                    ep: int = 1) -> tuple[StageSpec, ...]:
    # Memoised so that the plans of a search share stage objects (cheap cache keys).
    if pp == 1:
        return (StageSpec(hardware, tp, dp, layers, True, True, 1, cp, ep),)
    counts = split_layers(layers, pp)
    runs: list[list[int]] = []  # [layers, first, last, count] per run of identical stages
    for rank, n in enumerate(counts):
        first, last = rank == 0, rank == pp - 1
        if runs and not (first or last or runs[-1][1] or runs[-1][2]) and runs[-1][0] == n:
            runs[-1][3] += 1
        else:
            runs.append([n, first, last, 1])
    return tuple(StageSpec(hardware, tp, dp, n, bool(f), bool(l), c, cp, ep) for n, f, l, c in runs)
