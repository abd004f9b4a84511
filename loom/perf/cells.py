"""Crius Cells: a job on a fixed GPU type and count with a fixed number of pipeline stages.

Cells shard the scheduling space that adaptive parallelism opens up (Crius §4, §6.1):
the scheduler picks among a few Cells per job (counts N/2, N, 2N × stages 1, 2, 4, …
per GPU type), each priced cheaply by sampling its plan grid (DP-only or TP-only per
stage, 2^stages assemblies, §5.1); the chosen Cell's preferred side per stage then
halves the full tuning (§5.2). `compare_with_exhaustive` measures what that costs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import product

from loom.core.plan import RECOMPUTE_MODES, ParallelPlan
from loom.perf.estimator import Estimate, Estimator, StageSpec, default_estimator
from loom.perf.inputs import Hardware, PlanError, TrainingJob, check_plan
from loom.perf.search import MAX_MICRO_BATCH, Choices, candidate_plans


@dataclass(frozen=True, slots=True)
class Cell:
    """A scheduling candidate: `gpus` GPUs of `gpu_type` running `stages` pipeline stages."""

    gpu_type: str
    gpus: int
    stages: int


@dataclass(frozen=True, slots=True)
class StagePart:
    """One pipeline stage of a Cell: its GPUs and contiguous layers."""

    gpus: int
    layers: int
    first: bool
    last: bool


@dataclass(frozen=True, slots=True)
class CellEstimate:
    """The best grid-sampled assembly; `estimate` is None (with `reason`) when none fits."""

    cell: Cell
    parts: tuple[StagePart, ...]
    sides: tuple[str, ...]  # per stage, "dp" or "tp"
    estimate: Estimate | None
    reason: str
    estimates_used: int

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s if self.estimate else 0.0


@dataclass(frozen=True, slots=True)
class TunedCell:
    """Best plan found by tuning inside a Cell (None when nothing fits)."""

    estimate: Estimate | None
    estimates_used: int

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s if self.estimate else 0.0


@dataclass(frozen=True, slots=True)
class CellComparison:
    """Cell estimate and pruned tuning against the exhaustive best of the same Cell."""

    cell_throughput_ratio: float  # NaN when the exhaustive search finds nothing
    tuned_ratio: float
    estimates_cell: int
    estimates_pruned: int
    estimates_exhaustive: int


# -- candidate Cells -----------------------------------------------------------
def candidate_cells(gpus_requested: int, gpu_types: Sequence[str], layers: int,
                    counts: Sequence[int] | None = None) -> list[Cell]:
    """Counts N/2, N, 2N (Crius's; or the `counts` given) × stages 1, 2, 4, … ≤ min(count, layers)
    × GPU types: O(3·log N) per type."""
    if gpus_requested < 1 or layers < 1:
        raise ValueError(f"need gpus_requested ≥ 1 and layers ≥ 1, got {gpus_requested}, {layers}")
    if counts is None:
        counts = ([gpus_requested // 2] if gpus_requested % 2 == 0 else []) + [gpus_requested, 2 * gpus_requested]
    cells = []
    for gpu_type in gpu_types:
        for count in counts:
            stages = 1
            while stages <= min(count, layers):
                cells.append(Cell(gpu_type, count, stages))
                stages *= 2
    return cells


# -- stage formation -----------------------------------------------------------
def _layer_and_logit_flops(job: TrainingJob) -> tuple[float, float]:
    """Forward FLOPs per token of one layer and of the logit layer."""
    model = job.model
    if model.kind == "cnn":
        return 1.0, 0.0
    layer = 2.0 * model.matmul_weights_per_token() / model.layers + 4.0 * model.seq_len * model.hidden
    return layer, 2.0 * model.hidden * model.vocab


def _cut_layers(layers: int, stages: int, per_layer: float, logits: float) -> list[int]:
    """Contiguous layer counts minimising the largest stage's FLOPs (last stage carries the logits)."""
    if stages == 1:
        return [layers]
    best: tuple[float, float, int] | None = None
    for last in range(1, layers - stages + 2):
        q, r = divmod(layers - last, stages - 1)
        front = (q + (r > 0)) * per_layer
        tail = last * per_layer + logits
        key = (max(front, tail), -min(q * per_layer, tail), last)  # smallest max, then largest min
        if best is None or key < best:
            best = key
    assert best is not None
    last = best[2]
    q, r = divmod(layers - last, stages - 1)
    return [q + 1] * r + [q] * (stages - 1 - r) + [last]


def _pow2(x: float) -> int:
    return 1 << max(0, round(math.log2(x))) if x > 0 else 1


def _apportion(gpus: int, flops: list[float]) -> list[int]:
    """GPUs per stage ∝ FLOPs, in units of b·2^k (b the odd part of the equal share, so
    24 GPUs in 4 stages use 3, 6, 12, …), adjusted to sum to `gpus`."""
    k, total = len(flops), sum(flops)
    if gpus % k == 0 and all(round(gpus * f / total) == gpus // k for f in flops):
        return [gpus // k] * k  # balanced to within half a GPU per stage: the equal split
    unit = gpus // k if gpus % k == 0 else 1
    while unit % 2 == 0:
        unit //= 2
    units = gpus // unit
    ideal = [units * f / total for f in flops]
    alloc = [_pow2(x) for x in ideal]
    while sum(alloc) > units:  # halve the most over-provisioned stage
        i = max((j for j in range(k) if alloc[j] > 1), key=lambda j: alloc[j] / ideal[j])
        alloc[i] //= 2
    while (short := units - sum(alloc)) > 0:  # double the most under-provisioned stage that fits
        fits = [j for j in range(k) if alloc[j] <= short]
        if not fits:  # no power of two closes the gap: top up the neediest stage
            alloc[min(range(k), key=lambda j: alloc[j] / ideal[j])] += short
            break
        alloc[min(fits, key=lambda j: alloc[j] / ideal[j])] *= 2
    return [a * unit for a in alloc]


def form_stages(job: TrainingJob, gpus: int, stages: int) -> tuple[StagePart, ...]:
    """Cut the model into `stages` stages and give each GPUs in proportion to its FLOPs.

    Crius forms stages by mapping GPUs to operators in proportion to FLOPs and cutting
    at the smallest inter-operator communication. In a transformer every inter-layer
    cut carries the same s·b·h activation, so only balance decides: layers (equal
    FLOPs each) are cut into contiguous chunks minimising the largest stage, the last
    stage also carrying the logit layer (2·tokens·h·V forward, so it may get fewer
    layers; the first stage's embedding lookup is negligible). GPU counts follow the
    FLOPs, rounded to powers of two (the common GPU topology; times the odd part of the
    equal share when that is not a power of two) and adjusted to sum to `gpus`;
    balanced FLOPs on a multiple of `stages` GPUs give the equal split.
    """
    layers = job.model.layers
    if not 1 <= stages <= min(gpus, layers):
        raise ValueError(f"need 1 ≤ stages ≤ min(gpus, layers) = {min(gpus, layers)}, got {stages}")
    per_layer, logits = _layer_and_logit_flops(job)
    counts = _cut_layers(layers, stages, per_layer, logits)
    flops = [n * per_layer + (logits if i == stages - 1 else 0.0) for i, n in enumerate(counts)]
    alloc = _apportion(gpus, flops)
    return tuple(StagePart(g, n, i == 0, i == stages - 1) for i, (g, n) in enumerate(zip(alloc, counts)))


def _groups(parts: Sequence[StagePart]) -> list[tuple[StagePart, int]]:
    """Runs of identical consecutive stages, as (part, count)."""
    groups: list[tuple[StagePart, int]] = []
    for part in parts:
        if groups and groups[-1][0] == part:
            groups[-1] = (part, groups[-1][1] + 1)
        else:
            groups.append((part, 1))
    return groups


def cell_stage_specs(
    parts: Sequence[StagePart], layouts: Sequence[tuple[int, int]], hardware: Hardware | Sequence[Hardware]
) -> tuple[StageSpec, ...]:
    """StageSpecs for stages (grouped runs when `layouts` is per group) laid out as (dp, tp);
    `hardware` may differ per stage (mixed GPU types: the job runs at the slowest stage's pace)."""
    hws = [hardware] * len(parts) if isinstance(hardware, Hardware) else list(hardware)
    if len(layouts) == len(parts):
        units = [(p, 1, h) for p, h in zip(parts, hws)]
    else:
        groups = _groups(parts)
        starts = [sum(c for _, c in groups[:i]) for i in range(len(groups))]
        units = [(p, c, hws[s]) for (p, c), s in zip(groups, starts)]
    return tuple(
        StageSpec(hw, tp, dp, part.layers, part.first, part.last, count)
        for (part, count, hw), (dp, tp) in zip(units, layouts)
    )


def _micro_batch_counts(job: TrainingJob, dps: Sequence[int], all_counts: bool) -> list[int]:
    """Micro-batch counts m with every stage's micro-batch B/(m·dp) whole: largest first.

    The largest is B/lcm(dp) (= B // max dp when the dps are nested powers of two);
    `all_counts` adds the smaller ones (micro-batches up to MAX_MICRO_BATCH)."""
    lcm = math.lcm(*dps)
    if job.global_batch % lcm:
        return []
    counts, per_replica = [job.global_batch // lcm], 2 * lcm
    while all_counts and job.global_batch % per_replica == 0 and per_replica // min(dps) <= MAX_MICRO_BATCH:
        counts.append(job.global_batch // per_replica)
        per_replica *= 2
    return counts


def _plan_for(
    job: TrainingJob, specs: Sequence[StageSpec], pp: int, m: int, zero: int, recompute: str
) -> ParallelPlan:
    """A plan carrying pp, m (via micro_batch·dp), ZeRO and recomputation for explicit stages."""
    lead = max(specs, key=lambda s: s.dp)
    return ParallelPlan(lead.dp, lead.tp, pp, job.global_batch // (m * lead.dp), 1, zero, recompute)


def _better(a: Estimate | None, b: Estimate) -> bool:
    """Whether feasible `b` beats `a` (ties keep the earlier, simpler one)."""
    return a is None or b.iteration_s < a.iteration_s * (1 - 1e-12)


# -- grid-sampled Cell estimate ---------------------------------------------------
def estimate_cell(
    job: TrainingJob, cell: Cell, hardware: Hardware, estimator: Estimator | None = None
) -> CellEstimate:
    """Best of the DP-only / TP-only per-stage assemblies (Crius §5.1 grid sampling).

    Identical consecutive stages (same GPUs, layers, flags) take the same side: at a
    fixed micro-batch count the pipeline time depends only on the slowest and the summed
    stage times, so a mixed run is beaten by its faster side taken uniformly. That is
    exact for time; it can miss a mix only when the run's DP side alone sets the
    micro-batch count, or when memory (which depends on pipeline rank, priced at the
    run's first rank) admits a mix but not a uniform choice. Each assembly uses ZeRO-1
    (never worse than ZeRO-0 here) and no recomputation, retrying with full
    recomputation only when that does not fit (it is always slower).
    """
    if hardware.gpu_type != cell.gpu_type:
        raise ValueError(f"cell is on {cell.gpu_type}, hardware is {hardware.gpu_type}")
    est = estimator or default_estimator()
    if job.model.kind == "cnn" and cell.stages > 1:
        return CellEstimate(cell, (), (), None, "cnn models are modelled data-parallel only", 0)
    parts = form_stages(job, cell.gpus, cell.stages)
    groups = _groups(parts)
    options = []
    for part, _ in groups:
        sides = [("dp", (part.gpus, 1))]
        g = part.gpus
        if g > 1 and job.model.kind == "transformer" and g <= hardware.gpus_per_node and job.model.heads % g == 0:
            sides.append(("tp", (1, g)))
        options.append(sides)
    best: Estimate | None = None
    best_sides: tuple[str, ...] = ()
    used, reason = 0, ""
    for assembly in product(*options):
        specs = cell_stage_specs(parts, [layout for _, layout in assembly], hardware)
        counts = _micro_batch_counts(job, [s.dp for s in specs], all_counts=False)
        if not counts:
            reason = reason or f"global batch {job.global_batch} not divisible by the stages' DP sizes"
            continue
        for recompute in ("none", "full"):
            used += 1
            estimate = est.estimate_stages(job, specs, _plan_for(job, specs, cell.stages, counts[0], 1, recompute))
            if estimate.feasible:
                if _better(best, estimate):
                    best = estimate
                    best_sides = tuple(side for (side, _), (_, c) in zip(assembly, groups) for _ in range(c))
                break
            reason = estimate.reason if not reason or estimate.memory_gib_per_gpu < _gib(reason) else reason
    if best is None:
        return CellEstimate(cell, parts, (), None, reason or "no valid assembly", used)
    return CellEstimate(cell, parts, best_sides, best, "", used)


def _gib(reason: str) -> float:
    try:
        return float(reason.split(":")[1].split("GiB")[0])
    except (IndexError, ValueError):
        return math.inf


# -- Cell-guided tuning -----------------------------------------------------------
def _in_half(side: str | None, dp: int, tp: int) -> bool:
    """Crius §5.2: DP side keeps DP-only … half-hybrid (dp ≥ tp), TP side the rest (tp ≥ dp)."""
    return side is None or (dp >= tp if side == "dp" else tp >= dp)


def _uniform_side(sides: Sequence[str]) -> str | None:
    """One side for a uniform plan: the majority of the stages' preferences (None on a tie)."""
    dp = sum(s == "dp" for s in sides)
    return None if 2 * dp == len(sides) else ("dp" if 2 * dp > len(sides) else "tp")


def _layouts(job: TrainingJob, hardware: Hardware, gpus: int, side: str | None) -> list[tuple[int, int]]:
    """(dp, tp) for one stage: tp a power of two ≤ gpus per node dividing heads and `gpus`."""
    out, tp = [], 1
    while tp <= min(gpus, hardware.gpus_per_node):
        if gpus % tp == 0 and job.model.heads % tp == 0 and _in_half(side, gpus // tp, tp):
            out.append((gpus // tp, tp))
        tp *= 2
    return out


def _tune_uniform(
    job: TrainingJob, cell: Cell, hardware: Hardware, est: Estimator, side: str | None
) -> Iterator[Estimate]:
    for plan in candidate_plans(job, hardware, cell.gpus, Choices(pp=cell.stages)):
        if not _in_half(side, plan.dp, plan.tp):
            continue
        try:
            check_plan(job, plan, cell.gpus)
        except PlanError:
            continue
        yield est.estimate(job, hardware, plan)


def _tune_stages(
    job: TrainingJob, cell: Cell, parts: Sequence[StagePart], hardware: Hardware, est: Estimator,
    sides: Sequence[str | None],
) -> Iterator[Estimate]:  # fmt: skip
    groups = _groups(parts)
    starts = [sum(c for _, c in groups[:i]) for i in range(len(groups))]
    per_group = [_layouts(job, hardware, part.gpus, sides[s]) for (part, _), s in zip(groups, starts)]
    for layouts in product(*per_group):
        specs = cell_stage_specs(parts, layouts, hardware)
        for m in _micro_batch_counts(job, [s.dp for s in specs], all_counts=True):
            for zero, recompute in product((0, 1, 2, 3), RECOMPUTE_MODES):
                yield est.estimate_stages(job, specs, _plan_for(job, specs, cell.stages, m, zero, recompute))


def tune_cell(
    job: TrainingJob, cell_estimate: CellEstimate, hardware: Hardware, estimator: Estimator | None = None,
    prune: bool = True,
) -> TunedCell:  # fmt: skip
    """Full plan tuning inside the Cell (Crius §5.2); `prune` keeps each stage's preferred half.

    Equal stages search every uniform plan with pp = stages (`candidate_plans`, so vpp
    and selective recomputation too), pruned by the stages' majority side. Unequal stages
    search per-run (dp, tp) × micro-batch counts × recomputation × ZeRO 0-3, pruned per
    run. `prune=False` is the exhaustive baseline over the same space; so is tuning an
    infeasible Cell, which has no preferred sides.
    """
    est = estimator or default_estimator()
    cell, parts = cell_estimate.cell, cell_estimate.parts
    if not parts:
        return TunedCell(None, 0)
    sides: Sequence[str | None] = cell_estimate.sides if prune and cell_estimate.sides else [None] * len(parts)
    equal = len({(p.gpus, p.layers) for p in parts}) == 1 and job.model.layers % cell.stages == 0
    if equal:
        found = _tune_uniform(job, cell, hardware, est, _uniform_side([s for s in sides if s]) if any(sides) else None)
    else:
        found = _tune_stages(job, cell, parts, hardware, est, sides)
    best: Estimate | None = None
    used = 0
    for estimate in found:
        used += 1
        if estimate.feasible and _better(best, estimate):
            best = estimate
    return TunedCell(best, used)


# -- scheduling entry points ------------------------------------------------------
def build_cells(
    job: TrainingJob, gpus_requested: int, hardware_by_type: Mapping[str, Hardware], estimator: Estimator | None = None,
    counts: Sequence[int] | None = None,
) -> list[CellEstimate]:
    """Every candidate Cell estimated, best throughput first, infeasible last."""
    cells = candidate_cells(gpus_requested, list(hardware_by_type), job.model.layers, counts)
    estimates = [estimate_cell(job, c, hardware_by_type[c.gpu_type], estimator) for c in cells]
    return sorted(estimates, key=lambda e: (e.estimate is None, -e.tokens_per_s))


def compare_with_exhaustive(
    job: TrainingJob, cell: Cell, hardware: Hardware, estimator: Estimator | None = None
) -> CellComparison:
    """Throughput of the Cell's sampled plan and of the pruned tuning over the exhaustive
    best in the same Cell (Crius reports 93.4% on average), with the estimates each used."""
    est = estimator or default_estimator()
    sampled = estimate_cell(job, cell, hardware, est)
    pruned = tune_cell(job, sampled, hardware, est, prune=True)
    full = tune_cell(job, sampled, hardware, est, prune=False)
    best = full.tokens_per_s
    ratio = (lambda x: x / best) if best > 0 else (lambda x: math.nan)
    return CellComparison(
        ratio(sampled.tokens_per_s), ratio(pruned.tokens_per_s), sampled.estimates_used, pruned.estimates_used,
        full.estimates_used,
    )  # fmt: skip


__all__ = [
    "Cell", "CellComparison", "CellEstimate", "StagePart", "TunedCell", "build_cells", "candidate_cells",
    "cell_stage_specs", "compare_with_exhaustive", "estimate_cell", "form_stages", "tune_cell",
]  # fmt: skip
