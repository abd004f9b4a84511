"""Load ../shared/calibration/h100_era.csv: measured tokens/s/GPU of H100-era training runs.

Each row becomes the estimator's inputs — `ModelSpec`, `TrainingJob`, `Hardware`,
`ParallelPlan` — plus the measured tokens/s per GPU (the common unit the table's
README recommends, caveat 1: TFLOP/s and MFU conventions differ between sources).
A malformed cell is a `LoomInputError` naming the file, line and column. A
well-formed row the estimator cannot express yet (MLA attention, a head size
other than hidden/heads, context or expert parallelism before the estimator
has them, no tokens/s measured) is kept as an `Excluded` row with the reason, so
reports count it instead of dropping it.

Interpretation rules (each from the README's column definitions):

- Megatron-style stacks (NeMo, Megatron-Core/-Bridge/-LM): `micro_batch` is the
  pipeline micro-batch, the distributed optimizer is on (ZeRO-1; NeMo and
  Megatron-Bridge recipes default to it), sequence parallelism with tp > 1,
  fused kernels, recomputation "none" when the column is blank (their perf
  recipes recompute nothing unless stated).
- FSDP stacks (torchtitan, MaxText, LLM Foundry, NeMo AutoModel, Megatron-FSDP):
  ZeRO-3 over `dp` (MaxText's "FSDP=a x DP=b": shards of a, `zero_shard`), and
  `micro_batch` is the per-device local batch, as the README defines.
- torchtitan runs eager PyTorch unless its table row or note says torch.compile
  or async TP, which needs it (`fused_kernels=False`: norms, rotary, SiLU·up
  unfused, as HF Transformers).
- torchtitan with pp > 1: the local batch runs as pp pipeline micro-batches
  (its default `pipeline_parallel_microbatches` = the number of stages), 1F1B.
- Blank `global_batch` (two torchtitan rows): micro_batch · dp · grad_accum.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, fields
from pathlib import Path

from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.hardware.gpus import resolve_gpu_type
from loom.perf.inputs import Hardware, PlanError, TrainingJob, check_plan
from loom.perf.model import ModelSpec

COLUMNS = (
    "id", "core", "system", "gpu_type", "gpus", "model", "arch", "layers", "hidden", "ffn_hidden", "heads",
    "kv_heads", "num_experts", "topk", "seq_len", "vocab", "global_batch", "micro_batch", "grad_accum", "tp", "pp",
    "vpp", "cp", "ep", "dp", "sharding", "precision", "recompute", "tokens_per_s_per_gpu", "note", "source_table",
)  # fmt: skip

# System column prefix -> (short name for reports, FSDP-style batch/sharding semantics).
SYSTEMS = (
    ("NeMo AutoModel", "NeMo AutoModel", True),
    ("NeMo", "NeMo", False),  # NeMo 1.0 / 2.0 / Megatron-Core containers
    ("Megatron-Bridge", "Megatron-Bridge", False),
    ("Megatron-LM", "Megatron-LM", False),
    ("MaxText", "MaxText", True),
    ("torchtitan", "torchtitan", True),
    ("LLM Foundry", "LLM Foundry", True),
    ("HAI-LLM", "HAI-LLM", False),
)

# TrainingJob knobs a system's published recipes turn on, applied as soon as TrainingJob has
# them (the estimator is asked for them in issue 22; until then these rows are priced without):
# `overlap_tp`: Megatron-Core's tp_comm_overlap (userbuffers) pipelines the TP all-gather and
# reduce-scatter with the GEMMs that consume them; NeMo's and Megatron-Bridge's H100 perf
# recipes enable it whenever tp > 1.
SYSTEM_KNOBS: dict[str, dict[str, object]] = {
    "NeMo": {"overlap_tp": True},
    "Megatron-Bridge": {"overlap_tp": True},
    "Megatron-LM": {"overlap_tp": True},
}

# Model-name prefix -> architecture flags and the true attention head size (None: hidden/heads).
# From the configs the README cites (Megatron-Bridge providers, NeMo YAML, grok-1 run.py, MPT yamls).
FAMILIES: tuple[tuple[str, dict[str, object], int | None], ...] = (
    ("GPT3", {"mlp": "gelu", "norm": "layernorm", "position": "learned", "bias": True, "tied_embeddings": True}, None),
    # Llama 2/3/3.1: SwiGLU, RMSNorm, RoPE, no biases, untied LM head
    ("Llama", {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False, "tied_embeddings": False}, None),
    # Nemotron-4: squared-ReLU MLP (two matrices), LayerNorm, RoPE, no biases, untied
    ("Nemotron4", {"mlp": "gelu", "norm": "layernorm", "position": "rope", "bias": False, "tied_embeddings": False},
     None),
    ("Mixtral", {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False, "tied_embeddings": False},
     None),
    # Grok-1: gated-GELU experts (three matrices), RMSNorm, RoPE, InOutEmbed (tied)
    ("Grok-1", {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False, "tied_embeddings": True}, None),
    # Qwen3-MoE: head_dim 128 whatever hidden/heads is
    ("Qwen3", {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False, "tied_embeddings": False}, 128),
    # GPT-OSS: head_dim 64 with hidden 2880 and 64 heads
    ("GPT-OSS", {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": True, "tied_embeddings": False}, 64),
    ("DeepSeek-V3", {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False,
                     "tied_embeddings": False}, None),
    # MPT: GeLU 4h MLP, LayerNorm without bias, ALiBi (no position weights), tied
    ("MPT", {"mlp": "gelu", "norm": "layernorm", "position": "none", "bias": False, "tied_embeddings": True}, None),
)


@dataclass(frozen=True, slots=True)
class EraRun:
    """One measured run the estimator can express."""

    row_id: int
    line: int
    core: bool
    system: str  # short name (SYSTEMS)
    gpu_type: str  # gpus.yaml entry
    model: str
    gpus: int
    job: TrainingJob
    plan: ParallelPlan
    tokens_per_s_per_gpu: float

    @property
    def hardware(self) -> Hardware:
        return Hardware(self.gpu_type)


@dataclass(frozen=True, slots=True)
class Excluded:
    """A well-formed row left out of the fit, with why."""

    row_id: int
    line: int
    core: bool
    system: str
    gpu_type: str
    model: str
    reason: str


class _Skip(Exception):
    """A row the estimator cannot express: becomes `Excluded`."""


def load_h100_era(path: str | Path) -> tuple[list[EraRun], list[Excluded]]:
    """Every row of h100_era.csv: (runs to fit and check, excluded rows with reasons)."""
    source = str(path)
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise LoomInputError("missing column", source=source, line=1, field=missing[0])
            runs: list[EraRun] = []
            excluded: list[Excluded] = []
            for row in reader:
                line = reader.line_num  # the row's last physical line (quoted cells may span lines)
                _row(row, _Cells(row, source, line), runs, excluded)
            return runs, excluded
    except OSError as exc:
        raise LoomInputError(f"cannot read: {exc.strerror}", source=source) from exc


class _Cells:
    """Typed access to one row's cells; errors name the file, line and column."""

    def __init__(self, row: dict[str, str], source: str, line: int) -> None:
        self.row, self.source, self.line = row, source, line

    def error(self, column: str, message: str) -> LoomInputError:
        return LoomInputError(message, source=self.source, line=self.line, field=column)

    def text(self, column: str) -> str:
        return (self.row.get(column) or "").strip()

    def int(self, column: str, *, lead: bool = False, blank: int | None = None) -> int:
        """A positive integer; `lead`: the cell's leading integer ("50257 (GPT2BPE...)")."""
        text = self.text(column)
        if not text and blank is not None:
            return blank
        match = re.match(r"\d+", text) if lead else re.fullmatch(r"\d+", text)
        if not match or int(match.group()) <= 0:
            raise self.error(column, f"must be a positive integer, got {text!r}")
        return int(match.group())

    def number(self, column: str) -> float:
        text = self.text(column)
        try:
            value = float(text)
        except ValueError:
            raise self.error(column, f"not a number: {text!r}") from None
        if not value > 0:
            raise self.error(column, f"must be > 0, got {text!r}")
        return value


def _row(row: dict[str, str], cells: _Cells, runs: list[EraRun], excluded: list[Excluded]) -> None:
    row_id = cells.int("id")
    core = cells.text("core")
    if core not in ("0", "1"):
        raise cells.error("core", f"must be 0 or 1, got {core!r}")
    system, fsdp = _system(cells)
    gpu_type = resolve_gpu_type(cells.text("gpu_type"), source=cells.source, line=cells.line)
    head = (row_id, cells.line, core == "1", system, gpu_type, cells.text("model"))
    try:
        runs.append(EraRun(*head, gpus=cells.int("gpus"), **_inputs(cells, system, fsdp)))
    except _Skip as skip:
        excluded.append(Excluded(*head, reason=str(skip)))


def _system(cells: _Cells) -> tuple[str, bool]:
    text = cells.text("system")
    for prefix, name, fsdp in SYSTEMS:
        if text.startswith(prefix):
            return name, fsdp
    raise cells.error("system", f"unknown system {text!r} (known: {', '.join(p for p, _, _ in SYSTEMS)})")


def _inputs(cells: _Cells, system: str, fsdp: bool) -> dict[str, object]:
    """job, plan and measured tokens/s/GPU of one row (raises `_Skip` when not expressible)."""
    model = _model(cells)
    plan_fields = _plan_fields(cells, fsdp)
    gpus = cells.int("gpus")
    world = plan_fields["dp"] * plan_fields["tp"] * plan_fields["pp"] * plan_fields.get("cp", 1)
    if world != gpus:
        raise cells.error("dp", f"tp·pp·cp·dp = {world} but the row has {gpus} GPUs")
    if not cells.text("tokens_per_s_per_gpu"):
        raise _Skip("no tokens/s/GPU in the source (TFLOP/s only, in the source's own FLOP convention: caveat 1)")
    measured = cells.number("tokens_per_s_per_gpu")
    batch = cells.int("global_batch", lead=True, blank=0)
    if batch == 0:  # README: the local batch on every FSDP rank, no accumulation
        batch = cells.int("micro_batch") * plan_fields["dp"] * cells.int("grad_accum", blank=1)
    knobs = {k: v for k, v in SYSTEM_KNOBS.get(system, {}).items() if k in _knobs(TrainingJob)}
    job = TrainingJob(
        model, batch, precision=_precision(cells), fused_kernels=_fused(cells),
        sequence_parallel=plan_fields["tp"] > 1, **knobs,  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        plan = ParallelPlan(**plan_fields)
    except TypeError:  # a knob this ParallelPlan does not have yet
        raise _Skip("needs " + ", ".join(k for k in plan_fields if k not in _knobs(ParallelPlan))) from None
    try:
        check_plan(job, plan, gpus)
    except PlanError as exc:  # a layout the estimator refuses (e.g. Megatron's embedding-as-a-stage split)
        raise _Skip(f"estimator refuses the plan: {exc.located()}") from None
    return {"job": job, "plan": plan, "tokens_per_s_per_gpu": measured}


def _knobs(cls: type) -> set[str]:
    """The fields a dataclass has: rows use a knob as soon as the estimator grows it."""
    return {f.name for f in fields(cls)}


def _model(cells: _Cells) -> ModelSpec:
    name = cells.text("model")
    family = next((f for f in FAMILIES if name.startswith(f[0])), None)
    if family is None:
        raise cells.error("model", f"unknown model family {name!r} (known: {', '.join(f[0] for f in FAMILIES)})")
    _, flags, head_dim = family
    if name.startswith("GPT-OSS"):
        raise _Skip("sliding-window (128-token) attention on alternate layers is not a ModelSpec attention kind")
    kv = cells.text("kv_heads")
    if kv.startswith("MLA"):
        raise _Skip("multi-head latent attention (MLA) is not a ModelSpec attention kind")
    layers, hidden, heads = cells.int("layers"), cells.int("hidden"), cells.int("heads")
    extra: dict[str, object] = {}
    if head_dim is not None and head_dim * heads != hidden:
        if "head_dim" not in _knobs(ModelSpec):
            raise _Skip(f"head size {head_dim} ≠ hidden/heads = {hidden}/{heads}: ModelSpec has no head_dim")
        extra["head_dim"] = head_dim
    arch = cells.text("arch")
    if arch not in ("dense", "moe"):
        raise cells.error("arch", f"must be dense or moe, got {arch!r}")
    experts = cells.int("num_experts") if arch == "moe" else 1
    try:
        return ModelSpec(
            name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=cells.int("kv_heads"),
            ffn_hidden=cells.int("ffn_hidden"), seq_len=cells.int("seq_len"), vocab=cells.int("vocab", lead=True),
            experts=experts, top_k=cells.int("topk") if experts > 1 else 1, **flags, **extra,  # type: ignore[arg-type]
        )  # fmt: skip
    except LoomInputError as exc:  # ModelSpec's field, named by the CSV column it came from
        column = {"experts": "num_experts", "top_k": "topk"}.get(exc.field or "", exc.field or "model")
        raise cells.error(column, exc.message) from None


def _plan_fields(cells: _Cells, fsdp: bool) -> dict[str, int | str]:
    """ParallelPlan keyword arguments; cp and ep only when the row uses them."""
    dp = cells.int("dp")
    vpp_text = cells.text("vpp")
    if vpp_text and not vpp_text.isdigit() and vpp_text != "n/a":
        raise _Skip(f"pipeline schedule {vpp_text!r} is not 1F1B or interleaved")
    if not vpp_text and "interleaved" in cells.text("source_table").lower():
        raise _Skip("interleaved 1F1B with the stages per rank not stated")
    sharding = cells.text("sharding")
    zero, shard = (3, 0) if fsdp or "FSDP" in sharding else (1, 0)
    if match := re.match(r"(?:ici )?FSDP=(\d+) x (?:dcn )?DP=(\d+)", sharding):
        shard = int(match.group(1)) if int(match.group(2)) > 1 else 0
    pp, micro_batch = cells.int("pp"), cells.int("micro_batch", blank=1)
    if fsdp and pp > 1:  # torchtitan's default: the local batch in as many micro-batches as stages
        if micro_batch % pp:
            raise _Skip(f"local batch {micro_batch} does not split into pp={pp} pipeline micro-batches")
        micro_batch //= pp
    plan: dict[str, int | str] = {
        "dp": dp, "tp": cells.int("tp"), "pp": pp, "micro_batch": micro_batch,
        "virtual_stages": int(vpp_text) if vpp_text.isdigit() else 1,
        "zero_stage": zero, "zero_shard": shard, "recompute": _recompute(cells),
    }  # fmt: skip
    if (cp := cells.int("cp", blank=1)) > 1:
        plan["cp"] = cp
    ep_text = cells.text("ep")
    if not ep_text:
        raise _Skip("expert-parallel degree not stated ('-' in the source)")
    if (ep := cells.int("ep")) > 1:
        plan["ep"] = ep
    return plan


def _precision(cells: _Cells) -> str:
    text = cells.text("precision").lower()
    for prefix, precision in (("fp8", "fp8"), ("amp_fp8", "fp8"), ("bf16", "bf16"), ("amp_bf16", "bf16")):
        if text.startswith(prefix):
            return precision
    raise cells.error("precision", f"must start with fp8, amp_fp8, bf16 or amp_bf16, got {text!r}")


def _recompute(cells: _Cells) -> str:
    text = cells.text("recompute").lower()
    if not text:
        return "none"
    word = re.split(r"[\s(]", text, maxsplit=1)[0]
    if word in ("none", "selective", "full"):
        return word
    if text.startswith("remat_policy="):  # MaxText: "minimal*" saves the matmul outputs, recomputes the rest
        return "selective"
    raise cells.error("recompute", f"must start with none, selective or full, got {text!r}")


def _fused(cells: _Cells) -> bool:
    """Fused elementwise kernels: everything but eager torchtitan. A torchtitan row is compiled
    when its table row or note says torch.compile, or async TP (which torchtitan runs only
    under torch.compile)."""
    if not cells.text("system").startswith("torchtitan"):
        return True
    text = f"{cells.text('source_table')} {cells.text('note')}".lower()
    if "no torch.compile" in text:
        return False
    return "compile" in text or "async tp" in text or "asynctp" in text
