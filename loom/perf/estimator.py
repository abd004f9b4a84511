"""Iteration time of a training job for a plan on given GPUs and placement.

One pipeline stage's micro-batch takes compute + exposed TP collectives + PP
sends. Compute is GEMM FLOPs at a calibrated fraction of the tensor peak plus
memory-bound traffic (norms, activations, softmax: proxied by the activation
bytes each layer writes and reads) at a fraction of HBM bandwidth. The
pipeline runs m micro-batches at the pace of its slowest stage and fills and
drains once (1F1B; the interleaved schedule divides the fill by v). DP gradient
sync (Arnold Appendix C volumes) follows, overlapped with the last backward
pass when the framework does so, then the optimizer step.

Stages are explicit (`StageSpec`), so unequal stages (Crius) and stages on
different GPU types run through the same code: the job runs at the pace of its
slowest stage.

Context parallelism (`loom.perf.context`) divides a rank's tokens by cp and adds
ring attention's exposed K/V exchange; expert parallelism (`loom.perf.moe`)
shards experts and adds the all-to-all; DP and ZeRO collectives, with ZeRO-3's
prefetch, are `loom.perf.sync`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from loom.core.plan import ParallelPlan
from loom.hardware.gpus import GpuSpec
from loom.perf.calibration import Calibration, load_calibration
from loom.perf.comm import BusBandwidthComm, CommModel, GroupShape, Links
from loom.perf.context import ring_attention_s
from loom.perf.flops import flops_per_iteration
from loom.perf.inputs import (
    PACKED,
    Hardware,
    Placement,
    PlanError,
    TrainingJob,
    check_plan,
)
from loom.perf.memory import (
    GIB,
    stage_memory_bytes,
    zero_shards,
)
from loom.perf.model import ModelSpec
from loom.perf.moe import (
    all_to_all_s,
    expert_dp_shape,
    expert_params_per_layer,
)
from loom.perf.plan_cache import PlanCache, default_plan_cache
from loom.perf.stages import StageSpec, uniform_stages
from loom.perf.sync import dp_sync, zero3_exposed
from loom.perf.work import stage_work

OPTIMIZER_BYTES_PER_PARAM = 28.0  # Adam step: read fp32 master/m/v + grad, write them + bf16 weights
# Host side of optimizer offload, per GPU: DDR bandwidth share (~400 GB/s per
# 2-socket node / 8 GPUs at ~50%) and the PCIe Gen4 x16 link for grads/weights.
HOST_MEMORY_GBPS_PER_GPU = 25.0
PCIE_GBPS = 25.0
MAX_MEMO_STAGES = 1 << 14  # distinct stages remembered per job and placement


@dataclass(frozen=True, slots=True)
class _ModelNumbers:
    """Per-model constants, computed once per ModelSpec."""

    total_params: float
    weights_per_layer: float  # matmul weights a token passes per layer
    params_per_layer: float
    embedding: float  # input embedding (+ learned positions)
    final_norm: float


@lru_cache(maxsize=4096)
def _model_numbers(model: ModelSpec) -> _ModelNumbers:
    total = float(model.total_params())
    if model.kind == "cnn":
        return _ModelNumbers(total, 0.0, 0.0, 0.0, 0.0)
    embedding = model.vocab * model.hidden + (model.seq_len * model.hidden if model.position == "learned" else 0)
    return _ModelNumbers(
        total_params=total,
        weights_per_layer=model.matmul_weights_per_token() / model.layers,
        params_per_layer=(total - model.embedding_params() - model.norm_params()) / model.layers,
        embedding=float(embedding),
        final_norm=float(model.norm_params()),
    )


@lru_cache(maxsize=4096)
def _hardware_numbers(hardware: Hardware) -> tuple[GpuSpec, Links]:
    return hardware.spec, hardware.links()


@lru_cache(maxsize=4096)
def _iteration_flops(model: ModelSpec, global_batch: int, recompute: str) -> float:
    return flops_per_iteration(model, global_batch, recompute)


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a plan achieves; `feasible` is False (with `reason`) when it does not fit."""

    plan: ParallelPlan
    gpu_type: str
    gpus: int
    iteration_s: float
    tokens_per_s: float
    tflops_per_gpu: float  # model FLOPs (no recomputation) per GPU per second, TFLOP/s
    hardware_tflops_per_gpu: float  # including recomputed FLOPs
    mfu: float
    memory_gib_per_gpu: float
    feasible: bool
    reason: str
    breakdown: tuple[tuple[str, float], ...]  # seconds per iteration by cause

    def as_dict(self) -> dict[str, object]:
        return {
            "iteration_s": self.iteration_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "memory_gib_per_gpu": self.memory_gib_per_gpu,
            "feasible": self.feasible,
            "reason": self.reason,
            "gpu_type": self.gpu_type,
            "gpus": self.gpus,
            "plan": {
                "dp": self.plan.dp,
                "tp": self.plan.tp,
                "pp": self.plan.pp,
                "micro_batch": self.plan.micro_batch,
                "vpp": self.plan.virtual_stages,
                "zero": self.plan.zero_stage,
                "zero_shard": self.plan.zero_shard,
                "recompute": self.plan.recompute,
                "cp": self.plan.cp,
                "ep": self.plan.ep,
            },
            "breakdown_s": dict(self.breakdown),
        }


@dataclass(frozen=True, slots=True)
class _StageTime:
    micro_batch_s: float  # one micro-batch, forward + backward (+ recompute), incl. exposed comm
    compute_s: float
    tp_s: float
    cp_s: float  # exposed ring attention
    ep_s: float  # expert all-to-all
    p2p_s: float
    backward_s: float
    dp_s: float  # gradient sync after the last micro-batch (before overlap)
    optimizer_s: float
    memory_bytes: float


@dataclass(frozen=True, slots=True)
class _Timing:
    times: list[tuple[StageSpec, _StageTime]]
    micro_batches: int
    slowest: float  # micro-batch time of the slowest stage
    pipeline: float
    embedding_sync: float
    iteration: float


# A stage's micro-batch work: (compute, its backward share, TP + CP + EP collectives, TP, CP, EP)
_Work = tuple[float, float, float, float, float, float]
# A stage's sync: (parameters per GPU, gradient sync, ZeRO-3 forward gathers, optimizer step,
# ZeRO-3 backward gathers + reduce-scatters, expert parameters per GPU among the first)
_Sync = tuple[float, float, float, float, float, float]


@dataclass(slots=True)
class _StageMemo:
    """Stage quantities shared by the plans of one job and placement."""

    stage_ids: dict[StageSpec, int] = field(default_factory=dict)  # the keys below name stages by id
    compute: dict[tuple[int, int, str], _Work] = field(default_factory=dict)
    send: dict[tuple[int, int], float] = field(default_factory=dict)
    sync: dict[tuple[int, int, int], _Sync] = field(default_factory=dict)
    embedding: dict[tuple[int, Hardware], float] = field(default_factory=dict)

    def clear(self) -> None:
        for table in (self.stage_ids, self.compute, self.send, self.sync, self.embedding):
            table.clear()


class Estimator:
    """Prices plans; memoised so simulations can ask millions of times."""

    def __init__(self, calibration: Calibration | None = None, comm: CommModel | None = None, cache_size: int = 1 << 18,
                 plan_cache: PlanCache | None = None):
        self.calibration = calibration or load_calibration()
        self.comm: CommModel = comm or BusBandwidthComm(self.calibration)
        # plan searches' answers on disk (`loom.perf.plan_cache`): the one given, else ``LOOM_PLAN_CACHE``'s
        # when the communication model is the default (its calibration is part of the key; a custom model is not)
        self.plan_cache = plan_cache if plan_cache is not None or comm is not None else default_plan_cache()
        self.estimate = lru_cache(maxsize=cache_size)(self.estimate_uncached)  # type: ignore[method-assign]
        self._memo = lru_cache(maxsize=256)(self._new_memo)

    def _new_memo(self, job: TrainingJob, placement: Placement) -> _StageMemo:
        return _StageMemo()

    def estimate(self, job: TrainingJob, hardware: Hardware, plan: ParallelPlan, placement: Placement = PACKED) -> Estimate:
        return self.estimate_uncached(job, hardware, plan, placement)

    def estimate_uncached(
        self, job: TrainingJob, hardware: Hardware, plan: ParallelPlan, placement: Placement = PACKED
    ) -> Estimate:
        """Estimate for a uniform plan (`PlanError` if the plan cannot run the job)."""
        check_plan(job, plan)
        return self.estimate_stages(job, uniform_stages(job, hardware, plan), plan, placement)

    def estimate_stages(
        self, job: TrainingJob, stages: tuple[StageSpec, ...], plan: ParallelPlan, placement: Placement = PACKED
    ) -> Estimate:
        """Estimate for explicit stages; `plan` gives pp, micro-batches (via
        micro_batch·dp), vpp, ZeRO and recomputation."""
        return self._result(job, stages, plan, self._timing(job, stages, plan, placement))

    def price(
        self, job: TrainingJob, hardware: Hardware, plan: ParallelPlan, placement: Placement = PACKED
    ) -> tuple[float, float, str]:
        """What a plan search ranks by, without building the `Estimate`:
        (iteration_s, memory_gib_per_gpu, reason), equal to those fields of
        `estimate(...)` (reason is empty when the plan fits). The caller has
        checked the plan (`check_plan`)."""
        timing = self._timing(job, uniform_stages(job, hardware, plan), plan, placement)
        memory, reason = self._fit(timing.times)
        return timing.iteration, memory / GIB, reason

    def floors(
        self, job: TrainingJob, hardware: Hardware, plans: list[ParallelPlan], placement: Placement = PACKED,
        *, any_variant: bool = False,
    ) -> list[float]:
        """Per plan, a lower bound on `price(...)[0]` at a fraction of its cost, for plan
        searches to skip plans that cannot beat the best one priced so far.

        It is `_timing` without pipeline sends, embedding sync and all but the first
        stage's DP tail. Each stage's micro-batch is compute + TP/CP/EP collectives + exposed
        ZeRO-3 gathers (sends ≥ 0 left out); the pipeline formula only grows with any
        stage's micro-batch time (m·max + (Σ count·t − max)/v, m, v ≥ 1); the tail is
        the largest stage's, ≥ the first stage's, whose overlap window (its own last
        backward) does not depend on sends.

        With `any_variant`, a bound for every ZeRO stage and recomputation mode of each plan's
        shape (tp, pp, dp, micro-batch, vpp) at once: recomputation "none" (the least compute
        and TP collectives of the three modes) and neither ZeRO-3 gathers nor the DP tail
        (both ≥ 0), so a search can skip whole shapes before bounding their variants."""
        memo = self._memo(job, placement)
        if len(memo.stage_ids) > MAX_MEMO_STAGES:
            memo.clear()
        shapes: dict[tuple[int, ...], tuple[tuple[StageSpec, int], ...]] = {}  # (tp, dp, pp, cp, ep) → stages, ids
        out = []
        for plan in plans:
            micro_batches = job.global_batch // (plan.micro_batch * plan.dp)
            if (stages := shapes.get(shape := (plan.tp, plan.dp, plan.pp, plan.cp, plan.ep))) is None:
                stages = shapes[shape] = tuple((stage, memo.stage_ids.setdefault(stage, len(memo.stage_ids)))
                                               for stage in uniform_stages(job, hardware, plan))
            slowest = total = 0.0
            tail = -1.0
            recompute = "none" if any_variant else plan.recompute
            for stage, sid in stages:
                mb = job.global_batch // (micro_batches * stage.dp)
                if (work := memo.compute.get(key := (sid, mb, recompute))) is None:
                    work = memo.compute[key] = self._memo_compute(job, stage, mb, recompute, memo)
                if any_variant:
                    slowest = max(slowest, work[0] + work[2])
                    total += (work[0] + work[2]) * stage.count
                    tail = 0.0
                    continue
                if (sync := memo.sync.get(key := (sid, plan.zero_stage, plan.zero_shard))) is None:
                    sync = memo.sync[key] = self._stage_sync(job, stage, plan.zero_stage, plan.zero_shard, placement)
                compute = work[0]
                micro_batch_s = compute + work[2]
                if sync[2] or sync[4]:  # ZeRO-3
                    micro_batch_s += zero3_exposed(compute, work[1], sync[2], sync[4])
                slowest = max(slowest, micro_batch_s)
                total += micro_batch_s * stage.count
                if tail < 0:  # the first stage: rank 0
                    tail = max(0.0, sync[1] - (work[1] if job.overlap_dp else 0.0)) + sync[3]
            out.append(micro_batches * slowest + (total - slowest) / plan.virtual_stages + tail)
        return out

    def fits(self, job: TrainingJob, hardware: Hardware, plan: ParallelPlan, placement: Placement = PACKED) -> bool:
        """Whether the plan fits in memory: exactly `price`'s verdict, without its timing."""
        micro_batches = job.global_batch // (plan.micro_batch * plan.dp)
        memo = self._memo(job, placement)
        rank = 0
        for stage in uniform_stages(job, hardware, plan):  # uniform stages: the plan is each stage's plan
            sync = self._stage_parts(job, stage, plan, micro_batches, placement, memo)[3]
            usable = _hardware_numbers(stage.hardware)[0].memory_gib - self.calibration.memory_reserve_gib
            if stage_memory_bytes(job, plan, sync[0], stage.layers, rank, stage.last, sync[5]) / GIB > usable:
                return False
            rank += stage.count
        return True

    def _stage_parts(
        self, job: TrainingJob, stage: StageSpec, plan: ParallelPlan, micro_batches: int, placement: Placement,
        memo: _StageMemo,
    ) -> tuple[float, float, float, _Sync]:
        """(compute, backward, TP collectives, `_stage_sync`) of a stage, from the memo."""
        mb = job.global_batch // (micro_batches * stage.dp)
        sid = memo.stage_ids.setdefault(stage, len(memo.stage_ids))
        key = (sid, mb, plan.recompute)
        if (work := memo.compute.get(key)) is None:
            work = memo.compute[key] = self._memo_compute(job, stage, mb, plan.recompute, memo)
        if (sync := memo.sync.get(key := (sid, plan.zero_stage, plan.zero_shard))) is None:
            sync = memo.sync[key] = self._stage_sync(job, stage, plan.zero_stage, plan.zero_shard, placement)
        return work[0], work[1], work[2], sync

    def _timing(
        self, job: TrainingJob, stages: tuple[StageSpec, ...], plan: ParallelPlan, placement: Placement
    ) -> _Timing:
        micro_batches = job.global_batch // (plan.micro_batch * plan.dp)
        memo = self._memo(job, placement)
        if len(memo.stage_ids) > MAX_MEMO_STAGES:  # bound memory (Crius cells make many stage shapes)
            memo.clear()
        times = []
        rank = 0
        for stage in stages:
            times.append((stage, self._stage_time(job, stage, plan, placement, micro_batches, rank, memo)))
            rank += stage.count
        slowest = max(t.micro_batch_s for _, t in times)
        total = sum(t.micro_batch_s * s.count for s, t in times)
        pipeline = micro_batches * slowest + (total - slowest) / plan.virtual_stages
        tail = max(t.dp_s + t.optimizer_s for _, t in times)
        embedding_sync = self._embedding_sync(job, stages, plan, placement, memo)
        iteration = pipeline + tail + embedding_sync
        return _Timing(times, micro_batches, slowest, pipeline, embedding_sync, iteration)

    # -- one stage ----------------------------------------------------------
    def _stage_time(
        self,
        job: TrainingJob,
        stage: StageSpec,
        plan: ParallelPlan,
        placement: Placement,
        micro_batches: int,
        rank: int,
        memo: _StageMemo,
    ) -> _StageTime:
        mb = job.global_batch // (micro_batches * stage.dp)
        sid = memo.stage_ids.setdefault(stage, len(memo.stage_ids))  # hash the stage once
        key = (sid, mb, plan.recompute)
        if (work := memo.compute.get(key)) is None:
            work = memo.compute[key] = self._memo_compute(job, stage, mb, plan.recompute, memo)
        compute, backward, comm_s, tp_s, cp_s, ep_s = work
        p2p_s = 0.0
        pp = plan.pp
        if pp > 1:
            if (send := memo.send.get(key := (sid, mb))) is None:
                send = memo.send[key] = self._stage_send(job, stage, mb, placement)
            p2p_s = 2 * plan.virtual_stages * send
        if (sync := memo.sync.get(key := (sid, plan.zero_stage, plan.zero_shard))) is None:
            sync = memo.sync[key] = self._stage_sync(job, stage, plan.zero_stage, plan.zero_shard, placement)
        params, dp_s, zero3_fwd, optimizer_s, zero3_bwd, expert_params = sync
        # 1F1B drains from the last stage: stage r finishes its last backward r
        # backward slots before the first stage, so its gradient sync starts
        # that much earlier (and overlaps its own last backward pass if allowed).
        window = rank * (backward + p2p_s / 2) + (backward if job.overlap_dp else 0.0)
        dp_s = max(0.0, dp_s - window)
        micro_batch_s = compute + comm_s + p2p_s
        if zero3_fwd or zero3_bwd:
            micro_batch_s += zero3_exposed(compute, backward, zero3_fwd, zero3_bwd)
        stage_plan = plan
        if (stage.dp, stage.tp, mb, stage.cp, stage.ep) != (plan.dp, plan.tp, plan.micro_batch, plan.cp, plan.ep):
            stage_plan = ParallelPlan(
                dp=stage.dp, tp=stage.tp, pp=pp, micro_batch=mb, virtual_stages=plan.virtual_stages,
                zero_stage=plan.zero_stage, recompute=plan.recompute, zero_shard=plan.zero_shard, cp=stage.cp,
                ep=stage.ep,
            )  # fmt: skip  (unequal stages)
        memory = stage_memory_bytes(job, stage_plan, params, stage.layers, rank, stage.last, expert_params)
        return _StageTime(micro_batch_s, compute, tp_s, cp_s, ep_s, p2p_s, backward, dp_s, optimizer_s, memory)

    # The parts of a stage's time below depend on a few of the plan's knobs
    # only, so they are memoised (per job and placement, see `_StageMemo`)
    # and shared across the plans a search prices.
    def _stage_compute(
        self, job: TrainingJob, stage: StageSpec, mb: int, recompute: str
    ) -> _Work:
        """(compute, backward share of it, exposed collectives, of which TP, CP ring, EP all-to-all)
        for one micro-batch."""
        hw, cal = stage.hardware, self.calibration
        spec, links = _hardware_numbers(hw)
        gemm, traffic, backward_share, bf16_gemm = stage_work(job, stage, mb, recompute,
                                                              _model_numbers(job.model).weights_per_layer)
        flop_s = attention_flop_s = spec.peak_tflops(job.precision) * 1e12 * cal.gemm_fraction(spec.name, job.precision)
        if job.precision == "fp8":  # FP8 recipes run the attention core and the LM head in BF16
            attention_flop_s = spec.peak_tflops("bf16") * 1e12 * cal.gemm_fraction(spec.name, "bf16")
            gemm_s = (gemm - bf16_gemm) / flop_s + bf16_gemm / attention_flop_s
        else:
            gemm_s = gemm / flop_s
        compute = gemm_s + traffic / (spec.memory_bw_gbps * 1e9 * cal.memory_efficiency)
        tp_s = cp_s = 0.0
        if stage.cp > 1:  # this rank's forward attention core of one layer: s/cp queries × s keys
            attention = 4.0 * mb * job.model.seq_len**2 * job.model.attention_width / (stage.tp * stage.cp)
            cp_s = ring_attention_s(self.comm, links, job, stage, mb, recompute, attention / attention_flop_s)
        if stage.tp > 1:
            model = job.model
            tokens = mb * model.seq_len / stage.cp if stage.cp > 1 else mb * model.seq_len
            # 4 all-reduces per layer (2 forward, 2 backward; +2 re-run forward with full recomputation).
            # With sequence parallelism each is a reduce-scatter + all-gather instead: on a ring the two move
            # (n−1)/n·S each, the all-reduce's 2(n−1)/n·S, so it is priced the same (one start-up latency).
            calls = 4 + (2 if recompute == "full" else 0)
            group = GroupShape(size=stage.tp, per_node=min(stage.tp, hw.gpus_per_node))
            tp_s = stage.layers * calls * self.comm.all_reduce(tokens * model.hidden * job.tp_bytes, group, links)
            if job.overlap_tp:  # Megatron-Core's tp_comm_overlap: hidden behind the GEMMs, the excess shows
                tp_s = max(0.0, tp_s - compute)
        return compute, compute * backward_share, tp_s + cp_s, tp_s, cp_s, 0.0

    def _memo_compute(self, job: TrainingJob, stage: StageSpec, mb: int, recompute: str, memo: _StageMemo) -> _Work:
        """`_stage_compute` plus the all-to-all; the ep variants of a stage share its EP-free work
        (memoised under the ep = 1 twin), since only the all-to-all differs (`loom.perf.moe`)."""
        if stage.ep == 1:
            return self._stage_compute(job, stage, mb, recompute)
        twin = StageSpec(stage.hardware, stage.tp, stage.dp, stage.layers, stage.first, stage.last, stage.count, stage.cp)
        tid = memo.stage_ids.setdefault(twin, len(memo.stage_ids))
        if (base := memo.compute.get(key := (tid, mb, recompute))) is None:
            base = memo.compute[key] = self._stage_compute(job, twin, mb, recompute)
        ep_s = all_to_all_s(self.comm, _hardware_numbers(stage.hardware)[1], job, stage, mb, recompute)
        return base[0], base[1], base[2] + ep_s, base[3], base[4], ep_s

    def _stage_send(self, job: TrainingJob, stage: StageSpec, mb: int, placement: Placement) -> float:
        """One activation send between pipeline stages."""
        model = job.model
        tokens = mb * model.seq_len / stage.cp if stage.cp > 1 else mb * model.seq_len
        same_node = stage.gpus < stage.hardware.gpus_per_node
        group = GroupShape(
            size=2,
            per_node=2 if same_node else 1,
            minipods=placement.pp_minipods,
            oversubscription=placement.pp_oversubscription,
        )
        message = tokens * model.hidden * job.activation_bytes / stage.tp
        return self.comm.send(message, group, _hardware_numbers(stage.hardware)[1])

    def _stage_sync(
        self, job: TrainingJob, stage: StageSpec, zero_stage: int, zero_shard: int, placement: Placement
    ) -> _Sync:
        """(parameters per GPU, gradient sync before overlap, ZeRO-3 forward gathers per
        micro-batch, optimizer step, ZeRO-3 backward gathers and reduce-scatters, expert
        parameters per GPU): dense weights synced over dp·cp, experts over dp·cp/ep."""
        cal = self.calibration
        params = dense = self._stage_params(job, stage) / stage.tp
        links = _hardware_numbers(stage.hardware)[1]
        ranks = stage.dp * stage.cp
        per_node = max(1, min(ranks, stage.hardware.gpus_per_node // stage.tp))
        experts = 0.0
        if stage.ep > 1:  # experts / ep on this rank (`loom.perf.moe`)
            all_experts = stage.layers * expert_params_per_layer(job.model) / stage.tp
            experts = all_experts / stage.ep
            dense = params - all_experts
            params = dense + experts
        dp_s, zero3_fwd, zero3_bwd = dp_sync(self.comm, links, job, placement, dense, zero_stage, zero_shard, ranks,
                                             per_node, stage.layers)
        updated = dense / (zero_shard or ranks) if zero_stage >= 1 else dense
        if experts:
            expert_shard = zero_shards(ParallelPlan(dp=stage.dp, cp=stage.cp, ep=stage.ep, zero_shard=zero_shard))[1]
            expert_ranks, expert_per_node = expert_dp_shape(stage)
            sync = dp_sync(self.comm, links, job, placement, experts, zero_stage, expert_shard if zero_shard else 0,
                           expert_ranks, expert_per_node, stage.layers)
            dp_s, zero3_fwd, zero3_bwd = dp_s + sync[0], zero3_fwd + sync[1], zero3_bwd + sync[2]
            updated += experts / expert_shard if zero_stage >= 1 else experts
        if job.optimizer_offload:  # fp32 grads down, bf16 weights up, Adam on the host
            optimizer_s = updated * (
                OPTIMIZER_BYTES_PER_PARAM / (HOST_MEMORY_GBPS_PER_GPU * 1e9) + 6.0 / (PCIE_GBPS * 1e9)
            )
        else:
            spec = _hardware_numbers(stage.hardware)[0]
            optimizer_s = OPTIMIZER_BYTES_PER_PARAM * updated / (spec.memory_bw_gbps * 1e9 * cal.memory_efficiency)
        return params, dp_s, zero3_fwd, optimizer_s, zero3_bwd, experts

    def _stage_params(self, job: TrainingJob, stage: StageSpec) -> float:
        model = job.model
        numbers = _model_numbers(model)
        if model.kind == "cnn":
            return numbers.total_params
        params = stage.layers * numbers.params_per_layer
        if stage.tp > model.kv_heads:  # replicated KV heads (per GPU after the caller's / tp)
            params += stage.layers * model.kv_replicated_weights(stage.tp) * stage.tp
        embedding = numbers.embedding
        if stage.first:
            params += embedding
        if stage.last:
            params += numbers.final_norm + (embedding if (model.tied_embeddings and not stage.first) else 0)
            if not model.tied_embeddings:
                params += model.vocab * model.hidden
        return params

    def _embedding_sync(
        self, job: TrainingJob, stages: tuple[StageSpec, ...], plan: ParallelPlan, placement: Placement, memo: _StageMemo
    ) -> float:
        """Tied input/output embeddings on different stages all-reduce their gradients."""
        model = job.model
        if plan.pp == 1 or model.kind == "cnn" or not model.tied_embeddings:
            return 0.0
        first = stages[0]
        embedding = memo.embedding
        if (sync := embedding.get(key := (first.tp, first.hardware))) is None:
            sync = embedding[key] = self._embedding_all_reduce(job, first.tp, first.hardware, placement)
        return sync

    def _embedding_all_reduce(self, job: TrainingJob, tp: int, hardware: Hardware, placement: Placement) -> float:
        model = job.model
        group = GroupShape(size=2, per_node=1, minipods=placement.pp_minipods, oversubscription=placement.pp_oversubscription)
        return self.comm.all_reduce(model.vocab * model.hidden / tp * job.grad_bytes, group, _hardware_numbers(hardware)[1])

    # -- result -------------------------------------------------------------
    def _result(self, job: TrainingJob, stages: tuple[StageSpec, ...], plan: ParallelPlan, timing: _Timing) -> Estimate:
        times, micro_batches, slowest, pipeline = timing.times, timing.micro_batches, timing.slowest, timing.pipeline
        embedding_sync, iteration = timing.embedding_sync, timing.iteration
        gpus = sum(s.gpus * s.count for s in stages)
        model_flops = _iteration_flops(job.model, job.global_batch, "none")
        hw_flops = _iteration_flops(job.model, job.global_batch, plan.recompute)
        tflops = model_flops / iteration / gpus / 1e12
        peak = max(s.hardware.peak_tflops(job.precision) for s in stages)
        worst = max(times, key=lambda st: st[1].micro_batch_s)[1]
        breakdown = (
            ("compute", micro_batches * worst.compute_s),
            ("tp_comm", micro_batches * worst.tp_s),
            ("pp_comm", micro_batches * worst.p2p_s),
            ("bubble", pipeline - micro_batches * slowest),
            ("dp_exposed", max(t.dp_s for _, t in times) + embedding_sync),
            ("optimizer", max(t.optimizer_s for _, t in times)),
        )
        if plan.cp > 1 or plan.ep > 1:  # dense plans keep their six causes
            breakdown += (("cp_comm", micro_batches * worst.cp_s), ("ep_comm", micro_batches * worst.ep_s))
        memory, reason = self._fit(times)
        feasible = not reason
        gpu_types = sorted({s.hardware.gpu_type for s in stages})
        return Estimate(
            plan=plan,
            gpu_type="+".join(gpu_types),
            gpus=gpus,
            iteration_s=iteration,
            tokens_per_s=job.tokens / iteration,
            tflops_per_gpu=tflops,
            hardware_tflops_per_gpu=hw_flops / iteration / gpus / 1e12,
            mfu=tflops / peak,
            memory_gib_per_gpu=memory / GIB,
            feasible=feasible,
            reason=reason,
            breakdown=breakdown,
        )

    def _fit(self, times: list[tuple[StageSpec, _StageTime]]) -> tuple[float, str]:
        """(peak bytes per GPU, why the first stage that does not fit fails, or "")."""
        memory = max(t.memory_bytes for _, t in times)
        for stage, t in times:
            available = _hardware_numbers(stage.hardware)[0].memory_gib - self.calibration.memory_reserve_gib
            if t.memory_bytes / GIB > available:
                return memory, (
                    f"out of memory: {t.memory_bytes / GIB:.1f} GiB per GPU needed on a {stage.hardware.gpu_type} "
                    f"stage, {available:.1f} GiB usable"
                )
        return memory, ""


_DEFAULT: Estimator | None = None


def default_estimator() -> Estimator:
    """A shared, memoised estimator with the bundled calibration."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Estimator()
    return _DEFAULT


__all__ = ["Estimate", "Estimator", "PlanError", "StageSpec", "default_estimator", "uniform_stages"]
