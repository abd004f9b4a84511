"""`loom estimate` and `loom plan`: price a training job's parallel plans.

Invalid input (unknown GPU, bad model flags, a plan that cannot run the job)
prints one red line and exits 2; a job that does not fit in memory exits 1.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table

from loom.cli.common import busy
from loom.cli.errors import err_console, user_errors
from loom.errors import LoomInputError

if TYPE_CHECKING:  # imported where used: the estimator is not needed by the commands that do not price plans
    from loom.perf.search import Choices

console = Console()


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


class Precision(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


class PlanMode(str, Enum):
    auto = "auto"


class FfnType(str, Enum):
    gelu = "gelu"
    swiglu = "swiglu"


class PipelineSplit(str, Enum):
    even = "even"
    uneven = "uneven"


# Flags shared by both commands.
GpuType = Annotated[str, typer.Option("--gpu-type", help="GPU type (e.g. A100-80GB, H100).")]
Gpus = Annotated[int, typer.Option("--gpus", min=1, help="Number of GPUs.")]
GlobalBatch = Annotated[int, typer.Option("--global-batch", min=1, help="Global batch (sequences).")]
Model = Annotated[str | None, typer.Option("--model", help="Model preset (e.g. gpt3-175b, llama2-70b).")]
Layers = Annotated[int | None, typer.Option("--layers", min=1, help="Custom model: layers.")]
Hidden = Annotated[int | None, typer.Option("--hidden", min=1, help="Custom model: hidden size.")]
Heads = Annotated[int | None, typer.Option("--heads", min=1, help="Custom model: attention heads.")]
Seq = Annotated[int | None, typer.Option("--seq", min=1, help="Custom model: sequence length.")]
Vocab = Annotated[int | None, typer.Option("--vocab", min=1, help="Custom model: vocabulary size.")]
FfnHidden = Annotated[int | None, typer.Option("--ffn-hidden", min=1, help="Custom model: FFN size (default 4·hidden).")]
KvHeads = Annotated[int | None, typer.Option("--kv-heads", min=1,
                                             help="Custom model: KV heads (GQA; 1 = MQA; default = heads).")]
FfnTypeOpt = Annotated[FfnType | None, typer.Option("--ffn-type", help="Custom model: FFN kind (default gelu).")]
Untied = Annotated[bool, typer.Option("--untied-embeddings", help="Custom model: separate LM-head weights.")]
SplitOpt = Annotated[PipelineSplit, typer.Option(
    "--pipeline-split", help="uneven (default): any layers ≥ pp, first/last stages get fewer when pp does not divide them; "
                            "even: layers must divide by pp.")]
NoSeqPar = Annotated[bool, typer.Option(
    "--no-sequence-parallel", help="Without sequence parallelism: norm/dropout activations replicated over TP.")]
MicroBatch = Annotated[int | None, typer.Option("--micro-batch", min=1, help="Micro-batch (searched if omitted).")]
Tp = Annotated[int | None, typer.Option("--tp", min=1, help="Tensor-parallel size.")]
Cp = Annotated[int | None, typer.Option("--cp", min=1, help="Context-parallel size: each sequence split over cp ranks "
                                        "(ring attention); GPUs = dp·tp·pp·cp. Searched if omitted with --plan auto.")]
Ep = Annotated[int | None, typer.Option("--ep", min=1, help="Expert-parallel size (MoE): experts sharded over ep of the "
                                        "dp·cp ranks. Searched if omitted with --plan auto.")]
Experts = Annotated[int | None, typer.Option("--experts", min=1, help="Custom model: experts per MoE layer (1 = dense).")]
TopK = Annotated[int | None, typer.Option("--top-k", min=1, help="Custom model: experts each token is routed to.")]
CapacityFactor = Annotated[float, typer.Option(
    "--capacity-factor", help="MoE expert capacity / balanced share (1.0: dropless, balanced; pads expert compute and "
                              "all-to-all).")]
OverlapTp = Annotated[bool, typer.Option(
    "--overlap-tp", help="Megatron-Core's TP communication overlap: TP collectives exposed only beyond the compute.")]
DistOpt = Annotated[bool, typer.Option(
    "--distributed-optimizer", help="Megatron's distributed optimizer: optimizer state sharded over DP (= --zero 1).")]
Pp = Annotated[int | None, typer.Option("--pp", min=1, help="Pipeline-parallel size.")]
Dp = Annotated[int | None, typer.Option("--dp", min=1, help="Data-parallel size (default GPUs/(tp·pp)).")]
Vpp = Annotated[int | None, typer.Option("--vpp", min=1, help="Virtual pipeline stages (interleaving).")]
Zero = Annotated[int | None, typer.Option("--zero", min=0, max=3, help="ZeRO stage 0-3 (searched if omitted).")]
RecomputeOpt = Annotated[Recompute | None, typer.Option("--recompute", help="Activation recomputation (searched if omitted).")]
PlanOpt = Annotated[PlanMode | None, typer.Option("--plan", help="'auto': search every knob not pinned.")]
GpusPerNode = Annotated[int, typer.Option("--gpus-per-node", min=1, help="GPUs per node.")]
NicGbps = Annotated[float | None, typer.Option("--nic-gbps", help="Per-GPU scale-out bandwidth, Gb/s.")]
PrecisionOpt = Annotated[Precision, typer.Option("--precision", help="Compute precision.")]
NoFlash = Annotated[bool, typer.Option("--no-flash-attention", help="Materialise s×s attention scores.")]
GradBytes = Annotated[int, typer.Option("--grad-bytes", min=1, max=4, help="DP gradient element size (4 = fp32).")]
ActBytes = Annotated[int, typer.Option("--activation-bytes", min=1, max=4,
                                       help="PP activation element size (1 = fp8).")]
DpMinipods = Annotated[int, typer.Option("--dp-minipods", min=1, help="Minipods the widest DP group spans.")]
PpMinipods = Annotated[int, typer.Option("--pp-minipods", min=1, help="Minipods the widest PP group spans.")]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
Top = Annotated[int, typer.Option("--top", min=1, help="How many plans to list.")]
Cells = Annotated[bool, typer.Option("--cells/--no-cells", help="Also list Crius Cells (N/2, N, 2N GPUs × stages).")]

CUSTOM_FLAGS = ("--layers", "--hidden", "--heads", "--seq", "--vocab")
# optional custom-model flags -> ModelSpec fields (None / False: the field's default)
SHAPE_FLAGS = {"--ffn-hidden": "ffn_hidden", "--kv-heads": "kv_heads", "--ffn-type": "mlp",
               "--untied-embeddings": "tied_embeddings", "--experts": "experts", "--top-k": "top_k"}


def shape_options(ffn_hidden: int | None, kv_heads: int | None, ffn_type: FfnType | None,
                  untied: bool, experts: int | None = None, top_k: int | None = None) -> dict[str, Any]:
    """The optional custom-model flags given, keyed by flag (what `build_model` takes)."""
    given = {"--ffn-hidden": ffn_hidden, "--kv-heads": kv_heads,
             "--ffn-type": ffn_type.value if ffn_type else None, "--untied-embeddings": False if untied else None,
             "--experts": experts, "--top-k": top_k}
    return {flag: value for flag, value in given.items() if value is not None}


def _command_inputs(model: Any, layers: Any, hidden: Any, heads: Any, seq: Any, vocab: Any, options: dict[str, Any],
                    gpu_type: str, gpus_per_node: int, nic_gbps: Any, global_batch: int, precision: Precision,
                    no_flash: bool, grad_bytes: int, activation_bytes: int, dp_minipods: int, pp_minipods: int,
                    knobs: Choices, split: PipelineSplit = PipelineSplit.uneven,
                    sequence_parallel: bool = True, capacity_factor: float = 1.0,
                    overlap_tp: bool = False) -> tuple[Any, Any, Any, Choices]:
    """What `estimate` and `plan` share: the job, hardware, group spread and pinned knobs."""
    spec = build_model(model, {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq, "vocab": vocab},
                       options)
    job, hardware = build_inputs(gpu_type, gpus_per_node, nic_gbps, spec, global_batch, precision, no_flash,
                                 grad_bytes, activation_bytes, split, sequence_parallel, capacity_factor, overlap_tp)
    return job, hardware, build_placement(dp_minipods, pp_minipods), knobs


def _choices(tp: int | None, pp: int | None, dp: int | None, micro_batch: int | None, vpp: int | None,
             zero: int | None, recompute: Recompute | None, cp: int | None, ep: int | None,
             distributed_optimizer: bool) -> Choices:
    """The pinned knobs; --distributed-optimizer is Megatron's name for ZeRO-1 (optimizer state
    sharded over the dp·cp ranks), so it pins zero 1 and refuses another --zero."""
    from loom.perf.search import Choices

    if distributed_optimizer:
        if zero not in (None, 1):
            raise LoomInputError(f"--distributed-optimizer is --zero 1; it cannot be combined with --zero {zero}",
                                 field="--distributed-optimizer")
        zero = 1
    return Choices(tp, pp, dp, micro_batch, vpp, zero, recompute.value if recompute else None, cp=cp, ep=ep)


def _unset(knobs: Any) -> list[str]:
    """Plan knobs not given on the command line (searched)."""
    return [name for name in ("tp", "pp", "dp", "micro_batch", "vpp", "zero", "recompute", "cp", "ep")
            if getattr(knobs, name) is None]


def build_model(model: str | None, shape: dict[str, int | None], options: dict[str, Any] | None = None) -> Any:
    """A preset (`--model`) or a custom shape (`--layers ... --vocab`, plus the optional
    `SHAPE_FLAGS` given in `options`), never both: a preset is its published shape."""
    from loom.perf.model import ModelSpec
    from loom.perf.presets import preset

    options = options or {}
    given = [flag for flag, value in zip(CUSTOM_FLAGS, shape.values()) if value is not None]
    if model is not None:
        if given or options:
            raise LoomInputError(f"--model cannot be combined with {', '.join(given + list(options))}", field="--model")
        return preset(model)
    missing = [flag for flag, value in zip(CUSTOM_FLAGS, shape.values()) if value is None]
    if missing:
        hint = f"; missing {', '.join(missing)}" if given else ""
        raise LoomInputError(f"give --model PRESET or all of {', '.join(CUSTOM_FLAGS)}{hint}", field="--model")
    fields = {SHAPE_FLAGS[flag]: value for flag, value in options.items()}
    try:
        return ModelSpec(name="custom", **shape, **fields)  # type: ignore[arg-type]
    except LoomInputError as exc:  # name the flag, not the field
        flag = next((f for f, name in SHAPE_FLAGS.items() if name == exc.field), None)
        raise LoomInputError(exc.message, field=flag or exc.field) from None


def build_inputs(gpu_type: str, gpus_per_node: int, nic_gbps: float | None, model: Any, global_batch: int,
                 precision: Precision, no_flash: bool, grad_bytes: int = 2, activation_bytes: int = 2,
                 split: PipelineSplit = PipelineSplit.uneven, sequence_parallel: bool = True,
                 capacity_factor: float = 1.0, overlap_tp: bool = False) -> tuple[Any, Any]:
    from loom.perf.inputs import Hardware, TrainingJob

    hardware = Hardware(gpu_type, gpus_per_node=gpus_per_node, nic_gbps=nic_gbps)
    try:
        job = TrainingJob(model, global_batch, precision=precision.value, flash_attention=not no_flash,
                          grad_bytes=grad_bytes, activation_bytes=activation_bytes, pipeline_split=split.value,
                          sequence_parallel=sequence_parallel, capacity_factor=capacity_factor, overlap_tp=overlap_tp)
    except LoomInputError as exc:  # name the flag
        flag = "--capacity-factor" if exc.field == "capacity_factor" else exc.field
        raise LoomInputError(exc.message, field=flag) from None
    return job, hardware


def build_placement(dp_minipods: int, pp_minipods: int) -> Any:
    from loom.perf.inputs import Placement

    return Placement(dp_minipods=dp_minipods, pp_minipods=pp_minipods)


def _check_pinned(job: Any, gpus: int, knobs: Choices) -> None:
    """Reject pinned tp/pp/vpp/cp/ep that no plan for this job could use, naming the flag."""
    from loom.perf.inputs import PlanError, check_cp, check_pipeline, check_tp

    tp, pp, vpp, cp = knobs.tp or 1, knobs.pp or 1, knobs.vpp or 1, knobs.cp or 1
    check_tp(job.model, tp)
    check_pipeline(job.model.layers, pp, vpp, job.pipeline_split)
    check_cp(job.model, cp)
    if gpus % (tp * pp * cp * (knobs.dp or 1)):
        raise PlanError(f"tp·pp·cp·dp = {tp * pp * cp * (knobs.dp or 1)} does not divide {gpus} GPUs", field="tp")
    ep, experts = knobs.ep or 1, job.model.experts
    if ep > 1 and experts == 1:
        raise PlanError(f"--ep {ep} needs an MoE model (--experts > 1 or an MoE preset); nearest: --ep 1", field="ep")
    if experts % ep:
        nearest = max(e for e in range(1, ep) if experts % e == 0)
        raise PlanError(f"--ep {ep} must divide the experts ({experts}); nearest: --ep {nearest}", field="ep")


def _search(job: Any, hardware: Any, gpus: int, knobs: Choices, top: int, placement: Any = None) -> Any:
    from loom.perf.inputs import PlanError
    from loom.perf.search import search_plans

    with busy(f"searching plans on {gpus} GPUs…"):
        result = search_plans(job, hardware, gpus, choices=knobs, top=top,
                              placement=placement or build_placement(1, 1))
    if not result.considered:
        raise PlanError(result.reason, field="plan")
    return result


def _fixed_knobs(job: Any, gpus: int, knobs: Choices) -> Choices:
    """Without --plan auto: tp, pp, vpp, cp, ep default to 1 and dp to GPUs/(tp·pp·cp); check the plan."""
    from loom.core.plan import ParallelPlan
    from loom.perf.inputs import check_plan
    from loom.perf.search import Choices

    tp, pp, vpp, cp, ep = knobs.tp or 1, knobs.pp or 1, knobs.vpp or 1, knobs.cp or 1, knobs.ep or 1
    dp = knobs.dp or gpus // (tp * pp * cp)
    trial = ParallelPlan(dp, tp, pp, knobs.micro_batch or 1, vpp, knobs.zero or 0, knobs.recompute or "none", 0, cp, ep)
    check_plan(job, trial, gpus)  # PlanError naming the field
    return Choices(tp, pp, dp, knobs.micro_batch, vpp, knobs.zero, knobs.recompute, cp=cp, ep=ep)


def resolve(job: Any, hardware: Any, gpus: int, knobs: Choices, auto: bool, placement: Any = None
            ) -> tuple[Any, str, list[str]]:
    """(estimate or None, reason when nothing fits, knobs that were searched)."""
    from loom.core.plan import ParallelPlan
    from loom.perf.estimator import default_estimator

    _check_pinned(job, gpus, knobs)
    if not auto:
        knobs = _fixed_knobs(job, gpus, knobs)
    searched = _unset(knobs)
    if searched:
        result = _search(job, hardware, gpus, knobs, top=1, placement=placement)
        return result.best, result.reason, searched
    values = [getattr(knobs, name) for name in ("dp", "tp", "pp", "micro_batch", "vpp", "zero", "recompute")]
    plan = ParallelPlan(*values, cp=knobs.cp or 1, ep=knobs.ep or 1)
    estimate = default_estimator().estimate(job, hardware, plan, placement or build_placement(1, 1))
    return estimate, estimate.reason, []


def _fmt_row(e: Any) -> list[str]:
    return [f"{e.iteration_s:,.3f}", f"{e.tokens_per_s:,.0f}", f"{e.tflops_per_gpu:,.1f}", f"{e.mfu:.1%}",
            f"{e.memory_gib_per_gpu:,.1f}"]


def _print_estimate(job: Any, hardware: Any, estimate: Any, searched: list[str]) -> None:
    plan = estimate.plan
    table = Table(title=f"{job.model.name} on {estimate.gpus} × {hardware.gpu_type}", show_header=False)

    def mark(*names: str) -> str:
        return " (searched)" if set(names) & set(searched) else ""

    rows = [("plan", plan.describe()), ("dp · tp · pp", f"{plan.dp} · {plan.tp} · {plan.pp}{mark('dp', 'tp', 'pp')}"),
            ("micro-batch", f"{plan.micro_batch}{mark('micro_batch')}"),
            ("virtual stages", f"{plan.virtual_stages}{mark('vpp')}"), ("ZeRO stage", f"{plan.zero_stage}{mark('zero')}"),
            ("recompute", f"{plan.recompute}{mark('recompute')}"),
            ("layers per stage", _describe_split(_stage_layers(job, plan)))]
    if plan.cp > 1 or plan.ep > 1 or job.model.is_moe or job.model.seq_len >= 8192:
        rows.insert(2, ("cp · ep", f"{plan.cp} · {plan.ep}{mark('cp', 'ep')}"))
    rows += list(zip(("iteration s", "tokens/s", "TFLOP/s per GPU (model)", "MFU", "memory GiB/GPU"), _fmt_row(estimate)))
    rows += [("hardware TFLOP/s per GPU", f"{estimate.hardware_tflops_per_gpu:,.1f}"),
             ("feasible", "yes" if estimate.feasible else f"no: {estimate.reason}")]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    breakdown = Table("cause", "seconds", "share", title="iteration breakdown")
    for cause, seconds in estimate.breakdown:
        breakdown.add_row(cause, f"{seconds:,.4f}", f"{seconds / estimate.iteration_s:.1%}")
    console.print(breakdown)


def _stage_layers(job: Any, plan: Any) -> tuple[int, ...]:
    """Layers on each pipeline stage, first to last (`loom.perf.stages.split_layers`)."""
    from loom.perf.stages import split_layers

    return split_layers(job.model.layers, plan.pp)


def _describe_split(counts: tuple[int, ...]) -> str:
    """'7, 8×14, 7': runs of equal stages compressed, so 126 layers on 16 stages read at a glance."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ", ".join(f"{n}×{c}" if c > 1 else str(n) for n, c in runs)


def _fail(reason: str) -> None:
    err_console.print(f"[bold red]infeasible:[/] {reason}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@user_errors
def estimate(
    gpu_type: GpuType, gpus: Gpus, global_batch: GlobalBatch, model: Model = None, layers: Layers = None,
    hidden: Hidden = None, heads: Heads = None, seq: Seq = None, vocab: Vocab = None, ffn_hidden: FfnHidden = None,
    kv_heads: KvHeads = None, ffn_type: FfnTypeOpt = None, untied_embeddings: Untied = False,
    experts: Experts = None, top_k: TopK = None, capacity_factor: CapacityFactor = 1.0,
    pipeline_split: SplitOpt = PipelineSplit.uneven, no_sequence_parallel: NoSeqPar = False,
    micro_batch: MicroBatch = None, tp: Tp = None, pp: Pp = None, dp: Dp = None, vpp: Vpp = None, zero: Zero = None,
    cp: Cp = None, ep: Ep = None, distributed_optimizer: DistOpt = False, overlap_tp: OverlapTp = False,
    recompute: RecomputeOpt = None, plan: PlanOpt = None, gpus_per_node: GpusPerNode = 8, nic_gbps: NicGbps = None,
    precision: PrecisionOpt = Precision.bf16, no_flash_attention: NoFlash = False, as_json: AsJson = False,
    grad_bytes: GradBytes = 2, activation_bytes: ActBytes = 2, dp_minipods: DpMinipods = 1,
    pp_minipods: PpMinipods = 1,
) -> None:
    """Iteration time, throughput, MFU and memory of one plan; omitted knobs are searched."""

    job, hardware, placement, knobs = _command_inputs(
        model, layers, hidden, heads, seq, vocab,
        shape_options(ffn_hidden, kv_heads, ffn_type, untied_embeddings, experts, top_k),
        gpu_type, gpus_per_node, nic_gbps, global_batch, precision, no_flash_attention, grad_bytes, activation_bytes,
        dp_minipods, pp_minipods, _choices(tp, pp, dp, micro_batch, vpp, zero, recompute, cp, ep, distributed_optimizer),
        pipeline_split, not no_sequence_parallel, capacity_factor, overlap_tp)
    best, reason, searched = resolve(job, hardware, gpus, knobs, plan is PlanMode.auto, placement)
    if as_json:
        out = best.as_dict() if best is not None else {"feasible": False, "reason": reason}
        if best is not None:
            out["stage_layers"] = list(_stage_layers(job, best.plan))
        typer.echo(json.dumps({**out, "searched": searched}, indent=2))
        if best is None or not best.feasible:
            raise typer.Exit(1)
        return
    if best is None:
        _fail(reason)
    _print_estimate(job, hardware, best, searched)
    if not best.feasible:
        _fail(best.reason)


CELLS_NOTE = ("z: ZeRO stage; sampled: the Crius grid sample that ranks Cells (per stage DP-only or TP-only, "
              "ZeRO-1, full recomputation only when that does not fit); tuned: the fastest plan on the Cell's GPUs with "
              "pp = its stages, i.e. `loom plan --gpus G --pp S`'s first (same plan, same time as the plan table; "
              "not for Cells whose stages are unequal)")


def _cell_rows(job: Any, hardware: Any, gpus: int, placement: Any) -> list[tuple[Any, Any]]:
    """Crius Cells for N/2, N, 2N GPUs × stages, best sampled first: (grid-sampled
    `CellEstimate`, the tuned `Estimate`, or None when nothing fits or the stages are unequal)."""
    from loom.perf.cells import build_cells
    from loom.perf.search import Choices, fastest_plan

    def tuned(c: Any) -> Any:
        if not c.parts or _unequal(c):
            return None
        return fastest_plan(job, hardware, c.cell.gpus, placement=placement, choices=Choices(pp=c.cell.stages))

    return [(c, tuned(c)) for c in build_cells(job, gpus, {hardware.gpu_type: hardware})]


def _unequal(c: Any) -> bool:
    """Whether a Cell's stages differ in GPUs or layers (no uniform plan matches it)."""
    return len({(p.gpus, p.layers) for p in c.parts}) > 1


def _knobs(plan: Any) -> str:
    """'dp64·tp1·pp1 mb1 z2' (+ ' full' / ' sel' recomputation): a plan, compactly."""
    zero = f"z{plan.zero_stage}" + (f"/{plan.zero_shard}" if plan.zero_shard else "")
    recompute = {"none": "", "selective": " sel"}.get(plan.recompute, f" {plan.recompute}")
    return f"{plan} mb{plan.micro_batch} {zero}{recompute}"


def _short_reason(reason: str) -> str:
    """'out of memory: 262.7 GiB per GPU needed …' → 'OOM 263G'."""
    if reason.startswith("out of memory:"):
        return f"OOM {float(reason.split(':')[1].split('GiB')[0]):.0f}G"
    return "batch ∤ DP" if reason.startswith("global batch") else reason


def _sampled_cells(c: Any) -> tuple[str, str]:
    """(sampled sides and recomputation, sampled iter s) of one Cell."""
    e = c.estimate
    if e is None:
        return "-", _short_reason(c.reason)
    sides = _compact(list(c.sides)).removeprefix("all ")
    return sides + ("" if e.plan.recompute == "none" else f" {e.plan.recompute}"), f"{e.iteration_s:.3f}"


def _tuned_cells(c: Any, tuned: Any) -> tuple[str, str]:
    """(tuned plan, tuned iter s) of one Cell."""
    if tuned is None:
        return ("unequal stages", "-") if _unequal(c) else ("-", "no fit" if c.parts else "-")
    return _knobs(tuned.plan), f"{tuned.iteration_s:.3f}"


def _cells_note(placement: Any) -> str:
    from loom.perf.inputs import PACKED

    return CELLS_NOTE + ("; sampled Cells are priced packed in one minipod" if placement != PACKED else "")


def _cells_table(rows: list[tuple[Any, Any]], hardware: Any, gpus: int) -> Table:
    from rich import box

    number = {"justify": "right", "no_wrap": True}
    fold = {"no_wrap": True, "overflow": "ellipsis", "max_width": 7}
    table = Table(Column("GPUs×\nstages", no_wrap=True, min_width=7), Column("GPUs/\nstage", **fold),
                  Column("layers/\nstage", **fold), Column("sampled\nsides", **fold),
                  Column("sampled\niter s", **number, min_width=8), Column("tuned plan", min_width=14),
                  Column("tuned\niter s", **number, min_width=7), box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0),
                  show_edge=False, title=f"Crius Cells for {gpus} requested {hardware.gpu_type} GPUs")
    for c, tuned in rows:
        table.add_row(f"{c.cell.gpus}×{c.cell.stages}", _compact([p.gpus for p in c.parts]),
                      _compact([p.layers for p in c.parts]), *_sampled_cells(c), *_tuned_cells(c, tuned))
    return table


@user_errors
def plan(
    gpu_type: GpuType, gpus: Gpus, global_batch: GlobalBatch, model: Model = None, layers: Layers = None,
    hidden: Hidden = None, heads: Heads = None, seq: Seq = None, vocab: Vocab = None, ffn_hidden: FfnHidden = None,
    kv_heads: KvHeads = None, ffn_type: FfnTypeOpt = None, untied_embeddings: Untied = False,
    experts: Experts = None, top_k: TopK = None, capacity_factor: CapacityFactor = 1.0,
    pipeline_split: SplitOpt = PipelineSplit.uneven, no_sequence_parallel: NoSeqPar = False,
    micro_batch: MicroBatch = None, tp: Tp = None, pp: Pp = None, dp: Dp = None, vpp: Vpp = None, zero: Zero = None,
    cp: Cp = None, ep: Ep = None, distributed_optimizer: DistOpt = False, overlap_tp: OverlapTp = False,
    recompute: RecomputeOpt = None, top: Top = 10, gpus_per_node: GpusPerNode = 8, nic_gbps: NicGbps = None,
    precision: PrecisionOpt = Precision.bf16, no_flash_attention: NoFlash = False, as_json: AsJson = False,
    cells: Cells = True, grad_bytes: GradBytes = 2, activation_bytes: ActBytes = 2, dp_minipods: DpMinipods = 1,
    pp_minipods: PpMinipods = 1,
) -> None:
    """The fastest feasible plans (every knob not pinned is searched), best first."""

    job, hardware, placement, knobs = _command_inputs(
        model, layers, hidden, heads, seq, vocab,
        shape_options(ffn_hidden, kv_heads, ffn_type, untied_embeddings, experts, top_k),
        gpu_type, gpus_per_node, nic_gbps, global_batch, precision, no_flash_attention, grad_bytes, activation_bytes,
        dp_minipods, pp_minipods, _choices(tp, pp, dp, micro_batch, vpp, zero, recompute, cp, ep, distributed_optimizer),
        pipeline_split, not no_sequence_parallel, capacity_factor, overlap_tp)
    _check_pinned(job, gpus, knobs)
    result = _search(job, hardware, gpus, knobs, top=top, placement=placement)
    if not result.top:
        _nothing_fits(job, hardware, gpus, knobs, placement, result, as_json)
    with busy("pricing Cells (sampled and tuned)…"):
        rows = _cell_rows(job, hardware, gpus, placement) if cells else None
    if as_json:
        typer.echo(json.dumps(_plan_json(result, rows), indent=2))
    else:
        _print_plans(job, hardware, gpus, result, rows, placement)


def _compact(values: list[Any]) -> str:
    """'8' for one stage, 'all 4' when equal, else '8/4/4'."""
    if len(values) > 1 and len(set(values)) == 1:
        return f"all {values[0]}"
    return "/".join(str(v) for v in values)


def _cells_json(rows: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
    return [
        {"gpus": c.cell.gpus, "stages": c.cell.stages, "stage_gpus": [p.gpus for p in c.parts],
         "stage_layers": [p.layers for p in c.parts], "sides": list(c.sides),
         "estimate": c.estimate.as_dict() if c.estimate else None, "reason": c.reason,
         "tuned": tuned.as_dict() if tuned else None}
        for c, tuned in rows
    ]


def _plan_json(result: Any, rows: list[tuple[Any, Any]] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"considered": result.considered, "feasible": result.feasible, "reason": result.reason,
                            "plans": [e.as_dict() for e in result.top]}
    if rows is not None:
        body["cells"] = _cells_json(rows)
    return body


def _print_plans(job: Any, hardware: Any, gpus: int, result: Any, rows: list[tuple[Any, Any]] | None,
                 placement: Any) -> None:
    numbers = [Column(h, justify="right", no_wrap=True) for h in ("iter s", "tokens/s", "TFLOP/s/GPU", "MFU", "GiB/GPU")]
    table = Table("#", "tuned plan", *numbers,
                  title=f"{job.model.name} on {gpus} × {hardware.gpu_type}: top {len(result.top)}")
    for rank, e in enumerate(result.top, 1):
        table.add_row(str(rank), e.plan.describe(), *_fmt_row(e))
    console.print(table)
    console.print(f"{result.considered:,} plans considered, {result.feasible:,} feasible", highlight=False)
    if rows is not None:
        console.print(_cells_table(rows, hardware, gpus))
        console.print(_cells_note(placement), style="dim", highlight=False)


# -- when nothing fits: the one-line answer and the smallest change that fits ------------
KNOB_FLAGS = {"tp": "--tp", "pp": "--pp", "dp": "--dp", "micro_batch": "--micro-batch", "vpp": "--vpp",
              "zero": "--zero", "recompute": "--recompute", "cp": "--cp", "ep": "--ep"}
MAX_GPU_FACTOR = 64  # look for a GPU count that fits up to 64 × the one asked for


def _fits(job: Any, hardware: Any, gpus: int, knobs: Choices, placement: Any) -> bool:
    from loom.perf.search import any_plan_fits

    return any_plan_fits(job, hardware, gpus, placement=placement, choices=knobs)


def _fewest_gpus(job: Any, hardware: Any, gpus: int, knobs: Choices, placement: Any) -> int | None:
    """The fewest GPUs (> `gpus`, multiples of min(gpus, GPUs per node)) on which a plan fits:
    doubling to bracket it, then stepping through the bracket (at most 64 steps)."""
    lo, hi = gpus, 2 * gpus
    while not _fits(job, hardware, hi, knobs, placement):
        if hi >= MAX_GPU_FACTOR * gpus:
            return None
        lo, hi = hi, 2 * hi
    unit = min(gpus, hardware.gpus_per_node)
    step = max(unit, (hi - lo) // 64 // unit * unit)
    return next((n for n in range(lo + step, hi, step) if _fits(job, hardware, n, knobs, placement)), hi)


def _smallest_fix(job: Any, hardware: Any, gpus: int, knobs: Choices, placement: Any) -> tuple[str, Any] | None:
    """(the change, the fastest plan after it): unpinning the fewest knobs given on the command
    line (the fastest such choice), else the fewest more GPUs (with those knobs, else without);
    None when none of these fits."""
    from dataclasses import replace
    from itertools import combinations

    from loom.perf.search import Choices, fastest_plan

    pinned = [name for name in KNOB_FLAGS if getattr(knobs, name) is not None]
    for size in range(1, len(pinned) + 1):
        frees = [(names, replace(knobs, **dict.fromkeys(names))) for names in combinations(pinned, size)]
        fits = [(names, fastest_plan(job, hardware, gpus, placement=placement, choices=free))
                for names, free in frees if _fits(job, hardware, gpus, free, placement)]
        if fits:
            names, best = min(fits, key=lambda found: found[1].iteration_s)
            return "without " + ", ".join(f"{KNOB_FLAGS[n]} {getattr(knobs, n)}" for n in names), best
    unpinned = " without " + ", ".join(KNOB_FLAGS[n] for n in pinned)
    for free, also in ((replace(knobs, dp=None), ""), (Choices(zero_shard=knobs.zero_shard), unpinned)):
        if (more := _fewest_gpus(job, hardware, gpus, free, placement)) is not None:  # a pinned dp fixes the count
            return f"--gpus {more}{also}", fastest_plan(job, hardware, more, placement=placement, choices=free)
        if not pinned:
            break
    return None


def _fix_text(fix: tuple[str, Any] | None, gpus: int) -> str:
    if fix is None:
        return f"nothing fits on up to {MAX_GPU_FACTOR * gpus} GPUs of this type either"
    change, e = fix
    return (f"smallest change that fits: {change} ({e.plan.describe()}, {e.iteration_s:,.3f} s per iteration, "
            f"{e.memory_gib_per_gpu:.1f} GiB/GPU)")


def _nothing_fits(job: Any, hardware: Any, gpus: int, knobs: Choices, placement: Any, result: Any,
                  as_json: bool) -> None:
    """No plan fits: the reason and the smallest change that would fit (no tables); exit 1."""
    fix = _smallest_fix(job, hardware, gpus, knobs, placement)
    if as_json:
        body = _plan_json(result, None)
        body["fix"] = None if fix is None else {"change": fix[0], "plan": fix[1].as_dict()}
        typer.echo(json.dumps(body, indent=2))
        raise typer.Exit(1)
    console.print(f"{result.considered:,} plans considered, 0 feasible", highlight=False)
    _fail(f"{result.reason}; {_fix_text(fix, gpus)}")


def register(app: typer.Typer) -> None:
    """Add `estimate` and `plan` as top-level commands of `loom`."""
    app.command("estimate")(estimate)
    app.command("plan")(plan)
