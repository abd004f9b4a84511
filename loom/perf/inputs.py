"""What the estimator is asked about: a training job, its hardware, its placement.

All frozen and hashable, so estimates can be memoised on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.core.plan import RECOMPUTE_MODES, ParallelPlan
from loom.errors import LoomInputError
from loom.hardware.gpus import GpuSpec, gpu_spec
from loom.perf.comm import Links
from loom.perf.model import ModelSpec
from loom.perf.presets import preset

# fp8: FP8 matmuls (GpuSpec.tflops_fp8) except the attention core and the LM head, which FP8 recipes
# (Transformer Engine, DeepSeek-V3) keep in BF16 and the estimator prices at the BF16 peak
PRECISIONS = ("bf16", "fp16", "fp8")
PIPELINE_SPLITS = ("even", "uneven")  # see loom.perf.stages
DEFAULT_BATCH = 256  # a trace job's batch when its trace gives none


class PlanError(LoomInputError):
    """A parallel plan that cannot run this job at all (not merely out of memory)."""


@dataclass(frozen=True, slots=True)
class TrainingJob:
    """A model trained with a global batch (sequences; images for a cnn).

    Element sizes are set per communication group, so e.g. fp32 DP gradients
    with fp8 PP activations (Arnold's L20 cluster, Appendix E) can be priced.
    """

    model: ModelSpec
    global_batch: int
    precision: str = "bf16"  # compute precision: which peak applies
    grad_bytes: int = 2  # DP gradient element
    activation_bytes: int = 2  # PP send/recv element (1 = fp8 activations)
    tp_bytes: int = 2  # TP collective element
    flash_attention: bool = True  # False: s×s attention scores are materialised
    overlap_dp: bool = True  # DP gradient sync overlaps the last backward pass
    fused_kernels: bool = True  # False: eager unfused norms/rotary/activations (e.g. HF Transformers)
    optimizer_offload: bool = False  # optimizer step on the host (DeepSpeed ZeRO-Offload)
    # Sequence parallelism with TP (Korthikanti et al. 2022; Megatron's default since): norms and
    # dropout run on s/t tokens per rank, so their activations are split over TP too
    # (`loom.perf.memory`); TP's all-reduce becomes reduce-scatter + all-gather, the same bytes.
    sequence_parallel: bool = True
    # "uneven" (default): any layers ≥ pp, first and last stages get fewer when pp does not
    # divide the layers (`loom.perf.stages.split_layers`; Megatron-Core, Llama 3 405B's 7, 8×14, 7);
    # "even": layers must divide by pp (Megatron-LM's old rule, and loom's before issue 22)
    pipeline_split: str = "uneven"
    # MoE: expert capacity as a multiple of the balanced share (Switch/GShard's capacity factor).
    # 1.0 = dropless and balanced: every expert computes exactly its top_k share of the tokens;
    # c > 1 pads each expert's buffer to c × that share, so expert GEMMs and the all-to-all
    # carry c × the tokens (`loom.perf.moe`). Ignored for dense models.
    capacity_factor: float = 1.0
    # Megatron-Core's TP communication overlap (``--tp-comm-overlap``, Transformer Engine userbuffers):
    # TP collectives are split and pipelined with the GEMMs they feed, so only the part beyond the
    # stage's compute is exposed. Off by default (plain Megatron-LM, the Table 1 runs, FSDP stacks).
    overlap_tp: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.global_batch, bool) or not isinstance(self.global_batch, int) or self.global_batch <= 0:
            raise LoomInputError(f"must be a positive integer, got {self.global_batch!r}", field="global_batch")
        if self.precision not in PRECISIONS:
            raise LoomInputError(f"must be one of {', '.join(PRECISIONS)}, got {self.precision!r}", field="precision")
        if self.pipeline_split not in PIPELINE_SPLITS:
            raise LoomInputError(
                f"must be one of {', '.join(PIPELINE_SPLITS)}, got {self.pipeline_split!r}", field="pipeline_split"
            )
        for flag in ("sequence_parallel", "overlap_tp"):
            if not isinstance(getattr(self, flag), bool):
                raise LoomInputError(f"must be true or false, got {getattr(self, flag)!r}", field=flag)
        cf = self.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 1.0 <= cf <= 16.0:
            raise LoomInputError(
                f"must be a number from 1 (dropless, balanced) to 16, got {cf!r}", field="capacity_factor"
            )
        for field in ("grad_bytes", "activation_bytes", "tp_bytes"):
            if getattr(self, field) not in (1, 2, 4):
                raise LoomInputError(f"must be 1, 2 or 4 bytes, got {getattr(self, field)!r}", field=field)

    @property
    def tokens(self) -> int:
        """Tokens per iteration (images for a cnn)."""
        return self.global_batch * (self.model.seq_len if self.model.kind == "transformer" else 1)


def trace_batch(batch_size: int | None, default: int = DEFAULT_BATCH) -> int:
    """A trace job's batch (sequences, or images for a cnn): its own, else `default`."""
    return batch_size or default


def estimator_job(model: str, batch: int, gpus: int) -> tuple[TrainingJob, float]:
    """The estimator's job for a trace job of preset `model` and batch `batch` run on `gpus`
    GPUs, and the factor that turns its iteration time into the trace job's.

    The one batch rule, shared by the speed model that prices runs
    (`loom.sim.estimator_speed`) and every policy that predicts them: the global batch is
    `batch` rounded up to a multiple of `gpus`, so every data-parallel split divides it;
    the padded samples are priced out again by multiplying the iteration time by
    `scale = batch / global batch` (≤ 1). A caller pricing one job on several GPU counts
    with one global batch (Crius's Cells) passes one count for all, one they all divide
    where it can (see `loom.policies.crius_cells`).
    """
    global_batch = -(-batch // gpus) * gpus
    return TrainingJob(preset(model), global_batch), batch / global_batch


@dataclass(frozen=True, slots=True)
class Hardware:
    """GPU type plus the node it sits in; link numbers default to the GPU spec's."""

    gpu_type: str
    gpus_per_node: int = 8
    nic_gbps: float | None = None  # per-GPU scale-out, Gb/s (bits), as in gpus.yaml
    intra_node_gbps: float | None = None  # GB/s one direction

    def __post_init__(self) -> None:
        gpu_spec(self.gpu_type)  # UnknownNameError lists the known types
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node <= 0:
            raise LoomInputError(f"must be a positive integer, got {self.gpus_per_node!r}", field="gpus_per_node")
        for field in ("nic_gbps", "intra_node_gbps"):
            value = getattr(self, field)
            if value is not None and not value > 0:
                raise LoomInputError(f"must be > 0, got {value!r}", field=field)

    @property
    def spec(self) -> GpuSpec:
        return gpu_spec(self.gpu_type)

    def links(self) -> Links:
        spec = self.spec
        nic = spec.nic_gbps if self.nic_gbps is None else self.nic_gbps
        intra = spec.intra_node_gbps if self.intra_node_gbps is None else self.intra_node_gbps
        return Links(intra_node_gbps=intra, nic_gbps=nic / 8.0)

    def peak_tflops(self, precision: str) -> float:
        return self.spec.peak_tflops(precision)


@dataclass(frozen=True, slots=True)
class Placement:
    """How far the job's groups spread: minipods spanned by its widest DP and PP
    group and the oversubscription of the highest fabric tier they cross.
    The default is a job packed into one non-blocking minipod."""

    dp_minipods: int = 1
    pp_minipods: int = 1
    dp_oversubscription: float = 1.0
    pp_oversubscription: float = 1.0

    def __post_init__(self) -> None:
        for field in ("dp_minipods", "pp_minipods"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LoomInputError(f"must be a positive integer, got {value!r}", field=field)
        for field in ("dp_oversubscription", "pp_oversubscription"):
            if not getattr(self, field) >= 1.0:
                raise LoomInputError(f"must be >= 1, got {getattr(self, field)!r}", field=field)


PACKED = Placement()


def check_plan(job: TrainingJob, plan: ParallelPlan, gpus: int | None = None) -> None:
    """Raise `PlanError` naming the field when `plan` cannot run `job`."""
    model = job.model
    for field in ("dp", "tp", "pp", "micro_batch", "virtual_stages", "cp", "ep"):
        value = getattr(plan, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"must be a positive integer, got {value!r}", field=field)
    if gpus is not None and plan.world_size != gpus:
        raise PlanError(f"dp·tp·pp·cp = {plan.world_size} but the job has {gpus} GPUs", field="dp")
    if plan.zero_stage not in (0, 1, 2, 3):
        raise PlanError(f"must be 0, 1, 2 or 3, got {plan.zero_stage!r}", field="zero")
    if plan.recompute not in RECOMPUTE_MODES:
        raise PlanError(f"must be one of {', '.join(RECOMPUTE_MODES)}, got {plan.recompute!r}", field="recompute")
    if plan.zero_shard < 0 or (plan.zero_shard and (plan.dp * plan.cp) % plan.zero_shard):
        raise PlanError(f"zero shard group {plan.zero_shard} must divide dp·cp={plan.dp * plan.cp}", field="zero_shard")
    if model.kind == "cnn" and (plan.tp > 1 or plan.pp > 1 or plan.cp > 1):
        raise PlanError("cnn models are modelled data-parallel only (tp = pp = cp = 1)", field="tp")
    if plan.cp > 1:
        check_cp(model, plan.cp)
    if plan.ep > 1:
        check_ep(model, plan)
    check_tp(model, plan.tp)
    check_pipeline(model.layers, plan.pp, plan.virtual_stages, job.pipeline_split)
    if plan.virtual_stages > 1 and plan.pp == 1:
        raise PlanError("virtual pipeline stages need pp > 1", field="vpp")
    per_step = plan.micro_batch * plan.dp
    if job.global_batch % per_step:
        raise PlanError(
            f"global batch {job.global_batch} not divisible by micro-batch·dp = {plan.micro_batch}·{plan.dp}",
            field="global_batch",
        )
    if plan.virtual_stages > 1 and (job.global_batch // per_step) % plan.pp:
        raise PlanError("interleaved schedule needs micro-batches divisible by pp", field="vpp")


def check_cp(model: ModelSpec, cp: int) -> None:
    """Context parallelism splits each sequence into 2·cp chunks (Megatron-Core pairs chunk i
    with chunk 2·cp−1−i on rank i, so causal attention is balanced): seq_len must divide by 2·cp."""
    if cp > 1 and model.seq_len % (2 * cp):
        fits = [c for c in _divisors(model.seq_len // 2) if c > 1] or [1]
        raise PlanError(
            f"seq_len ({model.seq_len}) not divisible by 2·cp = {2 * cp} (context parallelism gives each rank "
            f"two balanced chunks); nearest: {_nearest('cp', cp, [1, *fits])}",
            field="cp",
        )


def check_ep(model: ModelSpec, plan: ParallelPlan) -> None:
    """Expert parallelism shards experts over ep of the dp·cp ranks (Megatron-Core folds EP into
    DP): ep must divide the experts and dp·cp, and needs an MoE model."""
    ep = plan.ep
    if ep == 1:
        return
    if not model.is_moe:
        raise PlanError(f"ep={ep} needs an MoE model (experts > 1); nearest: ep=1", field="ep")
    ranks = plan.dp * plan.cp
    if model.experts % ep or ranks % ep:
        fits = [e for e in _divisors(model.experts) if ranks % e == 0]
        raise PlanError(
            f"ep={ep} must divide experts ({model.experts}) and dp·cp ({ranks}): expert parallelism shards "
            f"the experts over data-parallel ranks; nearest: {_nearest('ep', ep, fits)}",
            field="ep",
        )


def check_tp(model: ModelSpec, tp: int) -> None:
    """Heads split over TP ranks; KV heads too, or replicated when tp > kv_heads (Megatron)."""
    if model.heads % tp:
        raise PlanError(f"heads ({model.heads}) not divisible by tp={tp}", field="tp")
    kv = model.kv_heads or model.heads
    if kv % tp and tp % kv:
        fits = [t for t in _divisors(model.heads) if not (kv % t and t % kv)]
        raise PlanError(
            f"kv_heads ({kv}) and tp={tp}: kv_heads must be divisible by tp, or tp by kv_heads (Megatron "
            f"replicates KV heads when tp > kv_heads); nearest: {_nearest('tp', tp, fits)}",
            field="tp",
        )


def check_pipeline(layers: int, pp: int, vpp: int, split: str = "uneven") -> None:
    """Every stage needs a layer; an even split needs layers divisible by pp; interleaving
    needs equal virtual stages (layers divisible by pp·vpp). Refusals name the nearest plan."""
    if pp > layers:
        raise PlanError(f"pp={pp} exceeds layers ({layers}): every stage needs a layer; nearest: pp={layers}",
                        field="pp")
    if layers % (pp * vpp) == 0:
        return
    if vpp > 1 and split == "uneven" and embedding_and_loss_split(layers, pp, vpp):
        return
    if vpp > 1:
        uneven = split == "uneven"
        vpps = [v for v in range(1, layers // pp + 1)
                if layers % (pp * v) == 0 or (uneven and (v == 1 or embedding_and_loss_split(layers, pp, v)))]
        pps = [p for p in range(2, layers // vpp + 1)
               if layers % (p * vpp) == 0 or (uneven and embedding_and_loss_split(layers, p, vpp))]
        options = [_nearest("vpp", vpp, vpps), _nearest("pp", pp, pps) + f" with vpp={vpp}" if pps else ""]
        raise PlanError(
            f"layers ({layers}) not divisible by pp·vpp = {pp}·{vpp} (interleaving needs equal virtual stages, or "
            f"layers + 2 divisible by pp·vpp with the embedding and the loss counted as a layer each); "
            f"nearest: {' or '.join(o for o in options if o)}",
            field="pp",
        )
    if split == "even":
        raise PlanError(
            f"layers ({layers}) not divisible by pp={pp}; nearest: {_nearest('pp', pp, _divisors(layers))}, "
            "or pipeline_split='uneven' (first and last stages get fewer layers)",
            field="pp",
        )


def embedding_and_loss_split(layers: int, pp: int, vpp: int) -> bool:
    """Megatron-Core's interleaved split that counts the embedding and the loss as a layer each
    (``--account-for-embedding-in-pipeline-split``, ``--account-for-loss-in-pipeline-split``): valid
    when layers + 2 divides into pp·vpp virtual stages of at least 2, the first and the last one
    layer short (Llama 3.1 405B: 126 layers on pp 8 × vpp 8, 2 per virtual stage). Per physical
    stage that is `loom.perf.stages.split_layers`' uneven split (15, 16×6, 15), so it is priced as one."""
    chunks = pp * vpp
    return (layers + 2) % chunks == 0 and (layers + 2) // chunks >= 2


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest(name: str, value: int, options: list[int]) -> str:
    """'name=a or name=b': the valid options just below and above `value`."""
    below = [o for o in options if o < value][-1:]
    above = [o for o in options if o > value][:1]
    return " or ".join(f"{name}={o}" for o in below + above) or f"{name}=1"
