"""Plan search: every valid (dp, tp, pp, cp, ep, micro-batch, vpp, ZeRO, recomputation)
for a job on N GPUs of one type, best by throughput.

Any knob can be pinned (`Choices`); the rest are searched. Tensor parallelism
is searched within a node only (powers of two dividing the heads); a pinned
`tp` may span nodes. Ties go to the simpler plan: lower ZeRO stage, less
recomputation, fewer virtual stages.

Context parallelism is searched over cp ∈ {1, 2, 4, 8} for sequences of at least
`LONG_SEQUENCE` tokens (where Megatron-Core recipes use it); shorter sequences
search cp = 1 only, and cp ∈ {2, 4, 8} only when no plan with cp = 1 fits in
memory. Expert parallelism is searched for MoE models over the divisors of the
experts that divide dp·cp (EP adds no GPUs). Dense models with short sequences
thus search exactly the plans they did before cp and ep existed. Pinning tp = pp = 1
asks for data parallelism only (the policies' "plain DP" checks, written before cp and
ep existed), so cp and ep are then 1 unless pinned as well (`Choices.data_parallel_only`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from loom.core.plan import RECOMPUTE_MODES, ParallelPlan
from loom.perf.estimator import Estimate, Estimator, default_estimator
from loom.perf.inputs import (
    PACKED,
    Hardware,
    Placement,
    PlanError,
    TrainingJob,
    check_plan,
)
from loom.perf.memory import GIB

MAX_MICRO_BATCH = 16
VIRTUAL_STAGES = (1, 2, 3, 4, 6, 8)
CONTEXT_PARALLEL = (1, 2, 4, 8)
LONG_SEQUENCE = 8192  # cp is searched from this sequence length on (else only when nothing fits)


@dataclass(frozen=True, slots=True)
class Choices:
    """Pinned plan knobs; None means 'search it'."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    vpp: int | None = None
    zero: int | None = None
    recompute: str | None = None
    zero_shard: int = 0
    cp: int | None = None
    ep: int | None = None

    @property
    def data_parallel_only(self) -> bool:
        """tp and pp pinned to 1: no model parallelism, so unpinned cp and ep are 1, not searched."""
        return self.tp == 1 and self.pp == 1


@dataclass(frozen=True, slots=True)
class SearchResult:
    best: Estimate | None  # fastest feasible plan, None if nothing fits
    top: tuple[Estimate, ...]  # fastest feasible plans, best first
    considered: int
    feasible: int
    reason: str  # why nothing fits (empty when something does)


def candidate_plans(job: TrainingJob, hardware: Hardware, gpus: int, choices: Choices = Choices(),
                    fallback: bool = False) -> Iterator[ParallelPlan]:
    """Valid plans for `gpus` GPUs (validity only: memory is the estimator's call). With cp
    unpinned and a short sequence, the cp = 1 plans; `fallback`: the cp > 1 ones the search
    tries when none of those fits (`cp_fallback`)."""
    zeros, recomputes = _variant_knobs(choices)
    for shape in _candidate_shapes(job, hardware, gpus, choices, fallback):
        yield from _variants(_shape_plan(shape, zeros[0], recomputes[0], choices.zero_shard), zeros, recomputes)


def cp_fallback(est: Estimator, job: TrainingJob, hardware: Hardware, gpus: int, choices: Choices) -> bool:
    """Whether to search cp > 1 when nothing fits with cp = 1: a short sequence with cp unpinned
    (a long one had every cp already), and model states that could fit at all. Context
    parallelism only divides activations; the least model state any plan holds per GPU is
    16 bytes per parameter over all GPUs (ZeRO-3: weights, gradients and optimizer state
    sharded over dp·cp, the rest over tp·pp; 4 with the optimizer offloaded), so when that
    exceeds the memory, no cp helps and the fallback is skipped (it bounds the search's cost
    on the many jobs too big for their GPUs)."""
    model = job.model
    if choices.cp is not None or model.kind == "cnn" or model.seq_len >= LONG_SEQUENCE or choices.data_parallel_only:
        return False
    if not any(c > 1 and gpus % c == 0 and model.seq_len % (2 * c) == 0 for c in CONTEXT_PARALLEL):
        return False
    least_states = (4.0 if job.optimizer_offload else 16.0) * model.total_params() / gpus
    return least_states / GIB <= hardware.spec.memory_gib - est.calibration.memory_reserve_gib


Shape = tuple[int, int, int, int, int, int, int]  # dp, tp, pp, micro-batch, vpp, cp, ep


def _shape_plan(shape: Shape, zero: int, recompute: str, zero_shard: int) -> ParallelPlan:
    dp, tp, pp, mb, vpp, cp, ep = shape
    return ParallelPlan(dp, tp, pp, mb, vpp, zero, recompute, zero_shard, cp, ep)


def _candidate_shapes(job: TrainingJob, hardware: Hardware, gpus: int, choices: Choices,
                      fallback: bool = False) -> Iterator[Shape]:
    """(dp, tp, pp, micro-batch, vpp, cp, ep) of the candidates, in `candidate_plans` order; each
    shape's ZeRO × recomputation variants (`_variant_knobs`) follow one another there.
    `fallback`: the cp > 1 shapes of a short sequence (`cp_fallback`)."""
    model = job.model
    for tp in _tp_options(job, hardware, gpus, choices):
        for cp in _cp_options(job, gpus // tp, choices, fallback):
            for pp in _pp_options(job, gpus // (tp * cp), choices):
                dp = gpus // (tp * pp * cp)
                if choices.dp is not None and dp != choices.dp:
                    continue
                if job.global_batch % dp:
                    continue
                for mb in _micro_batches(job.global_batch // dp, choices):
                    micro_batches = job.global_batch // (mb * dp)
                    for vpp in _vpp_options(model.layers, pp, micro_batches, choices):
                        for ep in _ep_options(job, dp * cp, choices):
                            yield dp, tp, pp, mb, vpp, cp, ep


def _variant_knobs(choices: Choices) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """ZeRO stages and recomputation modes searched (outer, inner)."""
    return ((0, 1, 2, 3) if choices.zero is None else (choices.zero,),
            RECOMPUTE_MODES if choices.recompute is None else (choices.recompute,))


def search_plans(
    job: TrainingJob,
    hardware: Hardware,
    gpus: int,
    *,
    placement: Placement = PACKED,
    choices: Choices = Choices(),
    top: int = 5,
    estimator: Estimator | None = None,
) -> SearchResult:
    """Price every candidate plan and keep the fastest feasible ones."""
    est = estimator or default_estimator()
    # Rank on the priced numbers; build full estimates for the plans returned only.
    feasible: list[tuple[ParallelPlan, float, float]] = []  # plan, iteration_s, memory_gib_per_gpu
    considered = 0
    first_reason = ""
    plans = candidate_plans(job, hardware, gpus, choices)
    for fallback in (False, True):
        if fallback:  # nothing fits with cp = 1: context parallelism for a short sequence
            if feasible or not cp_fallback(est, job, hardware, gpus, choices):
                break
            plans = candidate_plans(job, hardware, gpus, choices, fallback=True)
        for plan in plans:
            try:
                check_plan(job, plan, gpus)
            except PlanError:
                continue
            considered += 1
            iteration_s, memory_gib, why = est.price(job, hardware, plan, placement)
            if not why:
                feasible.append((plan, iteration_s, memory_gib))
            elif not first_reason or memory_gib < _memory_of(first_reason):
                first_reason = why
    feasible.sort(key=lambda priced: _rank(*priced))
    if not considered:
        reason = f"no valid plan for {gpus} GPUs with {_describe(choices)}"
    elif not feasible:
        reason = f"no plan fits in memory; the smallest needs: {first_reason}"
    else:
        reason = ""
    fastest = tuple(est.estimate(job, hardware, plan, placement) for plan, _, _ in feasible[:top])
    best = None
    if feasible:
        best = fastest[0] if fastest else est.estimate(job, hardware, feasible[0][0], placement)
    return SearchResult(best, fastest, considered, len(feasible), reason)


def fastest_plan(
    job: TrainingJob,
    hardware: Hardware,
    gpus: int,
    *,
    placement: Placement = PACKED,
    choices: Choices = Choices(),
    estimator: Estimator | None = None,
    or_unfit: bool = False,
) -> Estimate | None:
    """`search_plans(...).best` by branch and bound: the same plan, found by pricing
    only plans that fit in memory and whose floor (`Estimator.floors`) could still
    beat the best plan priced so far, in floor order; ties in `_rank` go to
    candidate order, as in `search_plans`. With `or_unfit`, when no plan fits: the
    plan of least iteration time (first in candidate order among equals; its
    estimate has `feasible` False) instead of None. Answers are kept in the estimator's
    `plan_cache` when it has one (`loom.perf.plan_cache`)."""
    est = estimator or default_estimator()
    cache, key = est.plan_cache, ""
    if cache is not None:
        key = cache.key("fastest_plan", est.calibration, type(est.comm).__qualname__, job, hardware, gpus, placement,
                        choices, or_unfit)
        found, plan = cache.get(key)
        if found:
            return None if plan is None else est.estimate(job, hardware, plan, placement)
    best = _search(est, job, hardware, gpus, placement, choices, or_unfit)
    if cache is not None:
        cache.put(key, best)
    return None if best is None else est.estimate(job, hardware, best, placement)


def any_plan_fits(job: TrainingJob, hardware: Hardware, gpus: int, *, placement: Placement = PACKED,
                  choices: Choices = Choices(), estimator: Estimator | None = None) -> bool:
    """Whether `search_plans(...).best` exists, i.e. some valid plan fits in memory, asked of
    `Estimator.fits` shape by shape (`_may_fit`); no plan is priced."""
    est = estimator or default_estimator()
    zeros, recomputes = _variant_knobs(choices)
    fallbacks = (False, True) if cp_fallback(est, job, hardware, gpus, choices) else (False,)
    return any(_may_fit(est, job, hardware, plan, placement, zeros, recomputes)
               for fallback in fallbacks for _, plan in _valid_shapes(job, hardware, gpus, choices, fallback))


def _valid_shapes(job: TrainingJob, hardware: Hardware, gpus: int, choices: Choices,
                  fallback: bool = False) -> Iterator[tuple[int, ParallelPlan]]:
    """(candidate index of its first variant, that variant) of each shape (all knobs but ZeRO
    and recomputation) `check_plan` accepts — validity does not depend on those two."""
    zeros, recomputes = _variant_knobs(choices)
    width = len(zeros) * len(recomputes)  # variants per shape: candidate index = shape ordinal × width + offset
    valid: dict[tuple[int, ...], bool] = {}
    for ordinal, shape in enumerate(_candidate_shapes(job, hardware, gpus, choices, fallback)):
        plan = _shape_plan(shape, zeros[0], recomputes[0], choices.zero_shard)
        if (ok := valid.get(key := shape[1:])) is None:  # dp follows from tp, pp and cp
            try:
                check_plan(job, plan, gpus)
                ok = valid[key] = True
            except PlanError:
                ok = valid[key] = False
        if ok:
            yield ordinal * width, plan


def _variants(plan: ParallelPlan, zeros: tuple[int, ...], recomputes: tuple[str, ...]) -> list[ParallelPlan]:
    """A shape's plans in candidate order (ZeRO outer, recomputation inner)."""
    dp, tp, pp, mb, vpp, shard = plan.dp, plan.tp, plan.pp, plan.micro_batch, plan.virtual_stages, plan.zero_shard
    cp, ep = plan.cp, plan.ep
    return [ParallelPlan(dp, tp, pp, mb, vpp, zero, recompute, shard, cp, ep) for zero in zeros
            for recompute in recomputes]


def _may_fit(est: Estimator, job: TrainingJob, hardware: Hardware, plan: ParallelPlan, placement: Placement,
             zeros: tuple[int, ...], recomputes: tuple[str, ...]) -> bool:
    """Whether any variant of the plan's shape fits in memory: ZeRO stages only shrink memory,
    so the highest searched one under each recomputation mode (full recomputation is not
    always the least)."""
    return any(est.fits(job, hardware, variant, placement) for variant in _variants(plan, (max(zeros),), recomputes))


def _search(est: Estimator, job: TrainingJob, hardware: Hardware, gpus: int, placement: Placement, choices: Choices,
            or_unfit: bool) -> ParallelPlan | None:
    """Valid shapes in order of a bound on all their variants (`Estimator.floors(any_variant=True)`);
    a shape's variants are made and bounded only when the search reaches it. When none fits, the
    cp > 1 shapes of a short sequence (`cp_fallback`), as `search_plans` does; `or_unfit` then
    takes the fastest of the first shapes."""
    primary = _shape_search(est, job, hardware, gpus, placement, choices, False)
    best = primary(True)
    if best is None and cp_fallback(est, job, hardware, gpus, choices):
        best = _shape_search(est, job, hardware, gpus, placement, choices, True)(True)
    if best is None and or_unfit:
        best = primary(False)
    return best


def _shape_search(est: Estimator, job: TrainingJob, hardware: Hardware, gpus: int, placement: Placement,
                  choices: Choices, fallback: bool) -> Callable[[bool], ParallelPlan | None]:
    """Branch and bound over the first shapes or (`fallback`) the cp fallback's: called with True,
    the best plan that fits; with False, the fastest ignoring memory (bounds shared by both)."""
    zeros, recomputes = _variant_knobs(choices)
    shapes = list(_valid_shapes(job, hardware, gpus, choices, fallback))
    bounds = est.floors(job, hardware, [plan for _, plan in shapes], placement, any_variant=True)
    order = sorted(zip(bounds, range(len(shapes))), key=lambda b: (b[0], shapes[b[1]][0]))
    bounded: dict[int, list[tuple[float, int, ParallelPlan]]] = {}  # shape → its plans by (floor, index)

    def variants(shape: int) -> list[tuple[float, int, ParallelPlan]]:
        if (found := bounded.get(shape)) is None:
            first, plan = shapes[shape]
            plans = _variants(plan, zeros, recomputes)
            floors = est.floors(job, hardware, plans, placement)
            found = bounded[shape] = sorted(zip(floors, range(first, first + len(plans)), plans),
                                            key=lambda b: (b[0], b[1]))
        return found

    def may_fit(shape: int) -> bool:
        return _may_fit(est, job, hardware, shapes[shape][1], placement, zeros, recomputes)

    return lambda fit: _branch_and_bound(est, job, hardware, placement, order, variants, may_fit if fit else None)


def _branch_and_bound(est: Estimator, job: TrainingJob, hardware: Hardware, placement: Placement,
                      shapes: list[tuple[float, int]],
                      variants: Callable[[int], list[tuple[float, int, ParallelPlan]]],
                      may_fit: Callable[[int], bool] | None) -> ParallelPlan | None:
    """Best plan by `_rank` among plans that fit (given `may_fit(shape)`: False when none of a
    shape's plans fits), else (`may_fit` None) by iteration time alone. `shapes`: (bound on all
    its plans, shape), by bound; `variants(shape)`: its plans as (floor, candidate index, plan)
    by floor. A plan whose floor exceeds the best time by more than rounding (ranks round to
    1e-9 s) and float noise ranks strictly worse, as does every later one in either order;
    ties go to the lower candidate index, whatever the order."""
    fit = may_fit is not None
    best: tuple[tuple[float, ...], int, ParallelPlan] | None = None
    for bound, shape in shapes:
        if best is not None and bound > best[0][0] * (1 + 1e-12) + (2e-9 if fit else 0.0):
            break
        if may_fit is not None and not may_fit(shape):
            continue
        for floor, index, plan in variants(shape):
            if best is not None and floor > best[0][0] * (1 + 1e-12) + (2e-9 if fit else 0.0):
                break
            if fit and not est.fits(job, hardware, plan, placement):
                continue
            iteration_s, memory_gib, _ = est.price(job, hardware, plan, placement)
            rank = _rank(plan, iteration_s, memory_gib) if fit else (iteration_s,)
            if best is None or (rank, index) < (best[0], best[1]):
                best = (rank, index, plan)
    return None if best is None else best[2]


def _rank(plan: ParallelPlan, iteration_s: float, memory_gib_per_gpu: float) -> tuple[float, int, int, int, float]:
    return (
        round(iteration_s, 9),
        plan.zero_stage,
        RECOMPUTE_MODES.index(plan.recompute),
        plan.virtual_stages,
        memory_gib_per_gpu,
    )


def _memory_of(reason: str) -> float:
    try:
        return float(reason.split(":")[1].split("GiB")[0])
    except (IndexError, ValueError):
        return float("inf")


def _cp_options(job: TrainingJob, ranks: int, choices: Choices, fallback: bool) -> list[int]:
    """cp: the pinned one; else 1, 2, 4, 8 dividing the ranks and 2·cp the sequence, for a long
    sequence; else 1 (and only cp > 1 in the `fallback` search); 1 for data parallelism only."""
    if choices.cp is not None:
        return [choices.cp] if ranks % choices.cp == 0 else []
    model = job.model
    if model.kind == "cnn" or choices.data_parallel_only:
        return [1]
    long = model.seq_len >= LONG_SEQUENCE
    if not (long or fallback):
        return [1]
    return [c for c in CONTEXT_PARALLEL if ranks % c == 0 and model.seq_len % (2 * c) == 0
            and (c > 1 or long) and not (fallback and c == 1)]


def _ep_options(job: TrainingJob, ranks: int, choices: Choices) -> list[int]:
    """ep: the pinned one; else, for an MoE model, the divisors of the experts dividing dp·cp
    (1 for data parallelism only)."""
    if choices.ep is not None:
        return [choices.ep]
    experts = job.model.experts
    if experts == 1 or choices.data_parallel_only:
        return [1]
    return [e for e in range(1, min(experts, ranks) + 1) if experts % e == 0 and ranks % e == 0]


def _tp_options(job: TrainingJob, hardware: Hardware, gpus: int, choices: Choices) -> list[int]:
    if choices.tp is not None:
        return [choices.tp] if gpus % choices.tp == 0 else []
    if job.model.kind == "cnn":
        return [1]
    options, tp = [], 1
    while tp <= min(gpus, hardware.gpus_per_node):
        if gpus % tp == 0 and job.model.heads % tp == 0 and _kv_splits(job.model.kv_heads, tp):
            options.append(tp)
        tp *= 2
    return options


def _pp_options(job: TrainingJob, ranks: int, choices: Choices) -> list[int]:
    if choices.pp is not None:
        return [choices.pp] if ranks % choices.pp == 0 else []
    if job.model.kind == "cnn":
        return [1]
    layers, uneven = job.model.layers, job.pipeline_split == "uneven"
    return [pp for pp in range(1, min(ranks, layers) + 1) if ranks % pp == 0 and (uneven or layers % pp == 0)]


def _kv_splits(kv_heads: int | None, tp: int) -> bool:
    """KV heads split over tp ranks, or replicated (tp a multiple of them): `check_tp`'s rule."""
    return kv_heads is None or kv_heads % tp == 0 or tp % kv_heads == 0


def _micro_batches(per_replica: int, choices: Choices) -> list[int]:
    if choices.micro_batch is not None:
        return [choices.micro_batch] if per_replica % choices.micro_batch == 0 else []
    options, mb = [], 1
    while mb <= min(per_replica, MAX_MICRO_BATCH):
        if per_replica % mb == 0:
            options.append(mb)
        mb *= 2
    return options


def _vpp_options(layers: int, pp: int, micro_batches: int, choices: Choices) -> list[int]:
    """Interleaving needs equal virtual stages (layers divisible by pp·v); v = 1 is always
    offered (an uneven split is the plan's validity check, `check_pipeline`)."""
    if choices.vpp is not None:
        return [choices.vpp]
    if pp == 1:
        return [1]
    return [
        v for v in VIRTUAL_STAGES if v == 1 or (layers % (pp * v) == 0 and micro_batches % pp == 0)
    ]


def _describe(choices: Choices) -> str:
    pinned = [f"{k}={v}" for k, v in (
        ("tp", choices.tp), ("pp", choices.pp), ("dp", choices.dp), ("micro_batch", choices.micro_batch),
        ("vpp", choices.vpp), ("zero", choices.zero), ("recompute", choices.recompute), ("cp", choices.cp),
        ("ep", choices.ep),
    ) if v is not None]  # fmt: skip
    return ", ".join(pinned) or "no pinned knobs"
