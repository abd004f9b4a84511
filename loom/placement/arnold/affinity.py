"""DP/PP affinity (α, β) from a characterisation database (Arnold §4, DESIGN.md §4).

Each profiled job in `data/affinity.yaml` records its GPU type, its volume
ratios ``r1 = mb·v_w/(v_d+v_p)`` (compute-to-communication) and
``r2 = v_d/v_p`` (DP to PP traffic), and its gains from DP-aligned (``j_dp``)
and PP-aligned (``j_pp``) placement. A new job takes the nearest profiled job
in (log r1, log r2), among those of its GPU type when there are any, and
``α = j_dp/(j_dp+j_pp)``, ``β = 1 − α`` (α = 0.5 when both gains are 0).

Volumes (Arnold Appendix C, in elements; multiply by bytes per element):

- ``v_w``: weights per GPU, ``activated parameters / (tp·pp)`` (what each GPU
  computes with per token; = all parameters for a dense model);
- ``v_d``: DP volume per GPU of the largest (first/last) stage:
  ``(E + (l/pp)·L) / tp`` with ``E`` the embedding (`ModelSpec.embedding_params`,
  ``h·(V+s)`` for a GPT with learned positions) and ``L`` the per-layer term
  ``4h² + 2h + 8h² + 7h`` of Eq. 12, generalised as attention weights + 2h plus
  MLP weights + 7h; an MoE layer's MLP term counts all experts plus the router;
- ``v_p``: PP volume per micro-batch, ``2·mb·s·h``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import date
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import yaml

from loom.errors import LoomInputError
from loom.perf.model import ModelSpec

REQUIRED = ("name", "gpu_type", "r1", "r2", "j_dp", "j_pp", "source")
OPTIONAL = ("model", "dp", "tp", "pp", "micro_batch", "grad_bytes", "activation_bytes", "notes")


@dataclass(frozen=True, slots=True)
class AffinityEntry:
    """One profiled job: where it sits in (r1, r2) and its measured gains."""

    name: str
    gpu_type: str
    r1: float
    r2: float
    j_dp: float  # relative gain of DP-aligned placement (0.014 = +1.4%)
    j_pp: float  # relative gain of PP-aligned placement
    source: str
    model: str | None = None
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    micro_batch: int | None = None
    grad_bytes: int | None = None
    activation_bytes: int | None = None
    notes: str | None = None

    @property
    def alpha(self) -> float:
        total = self.j_dp + self.j_pp
        return 0.5 if total <= 0 else self.j_dp / total

    @property
    def beta(self) -> float:
        return 1.0 - self.alpha

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}


# ------------------------------------------------------------------ volumes
def _layer_term(model: ModelSpec) -> float:
    """Per-layer DP elements of Eq. 12 (``12h² + 9h`` for a GPT layer with f = 4h)."""
    h = model.hidden
    attention = model.attention_weights() + 2 * h
    dense = model.mlp_weights() + 7 * h
    moe = model.experts * model.mlp_weights() + model.router_params() + 7 * h
    return attention + (model.dense_layers * dense + model.moe_layers * moe) / model.layers


def volumes(model: ModelSpec, tp: int, pp: int, micro_batch: int, grad_bytes: int = 1,
            activation_bytes: int = 1) -> tuple[float, float, float]:
    """(v_w, v_d, v_p) per GPU; elements unless bytes per element are given."""
    for field, value in (("tp", tp), ("pp", pp), ("micro_batch", micro_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LoomInputError(f"must be a positive integer, got {value!r}", field=field)
    if model.kind != "transformer":
        raise LoomInputError(f"Appendix C volumes are for transformers; '{model.name}' is a {model.kind}",
                             field="model")
    v_w = model.activated_params() / (tp * pp)
    v_d = (model.embedding_params() + model.layers / pp * _layer_term(model)) / tp * grad_bytes
    v_p = 2.0 * micro_batch * model.seq_len * model.hidden * activation_bytes
    return float(v_w), float(v_d), float(v_p)


def ratios(model: ModelSpec, tp: int, pp: int, micro_batch: int, grad_bytes: int = 1,
           activation_bytes: int = 1) -> tuple[float, float]:
    """(r1, r2) = (mb·v_w/(v_d+v_p), v_d/v_p)."""
    v_w, v_d, v_p = volumes(model, tp, pp, micro_batch, grad_bytes, activation_bytes)
    return micro_batch * v_w / (v_d + v_p), v_d / v_p


# ----------------------------------------------------------------- database
def load_affinity(path: str | Path | None = None) -> tuple[AffinityEntry, ...]:
    """Validated entries of an affinity file (the bundled one by default)."""
    if path is None:
        return _bundled()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise LoomInputError(f"cannot read affinity file: {exc.strerror or exc}", source=str(p)) from None
    return parse_affinity(text, str(p))


@lru_cache(maxsize=1)
def _bundled() -> tuple[AffinityEntry, ...]:
    resource = files("loom.placement.arnold") / "data" / "affinity.yaml"
    return parse_affinity(resource.read_text(encoding="utf-8"), str(resource))


def parse_affinity(text: str, source: str) -> tuple[AffinityEntry, ...]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LoomInputError(f"invalid YAML: {getattr(exc, 'problem', exc)}", source=source,
                             line=mark.line + 1 if mark else None) from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise LoomInputError("expected a mapping with a list under 'entries'", source=source, field="entries")
    nodes = _entry_nodes(root)
    out, names = [], set()
    for i, raw in enumerate(data["entries"]):
        line = nodes[i].start_mark.line + 1 if i < len(nodes) else None
        out.append(_entry(raw, i, source, line))
        if out[-1].name in names:
            raise LoomInputError(f"entry '{out[-1].name}' appears twice", source=source, line=line,
                                 field=f"entries[{i}].name")
        names.add(out[-1].name)
    if not out:
        raise LoomInputError("the affinity database has no entries", source=source, field="entries")
    return tuple(out)


def _entry_nodes(root: yaml.Node | None) -> list[yaml.Node]:
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "entries" and isinstance(value, yaml.SequenceNode):
                return list(value.value)
    return []


def _entry(raw: object, i: int, source: str, line: int | None) -> AffinityEntry:
    def fail(field: str, message: str) -> LoomInputError:
        return LoomInputError(message, source=source, line=line, field=f"entries[{i}].{field}")

    if not isinstance(raw, dict):
        raise fail("name", f"each entry must be a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(REQUIRED) - set(OPTIONAL), key=str)
    if unknown:
        raise fail(str(unknown[0]), f"unknown field (known: {', '.join(REQUIRED + OPTIONAL)})")
    for field in REQUIRED:
        if field not in raw:
            raise fail(field, "missing required field")
    for field in ("name", "gpu_type", "source"):
        if not isinstance(raw[field], str) or not raw[field].strip():
            raise fail(field, f"must be a non-empty string, got {raw[field]!r}")
    for field in ("r1", "r2"):
        value = raw[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise fail(field, f"must be a positive number, got {value!r}")
    for field in ("j_dp", "j_pp"):
        value = raw[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise fail(field, f"must be a number ≥ 0 (relative gain), got {value!r}")
    for field in ("dp", "tp", "pp", "micro_batch", "grad_bytes", "activation_bytes"):
        value = raw.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise fail(field, f"must be a positive integer, got {value!r}")
    for field in ("model", "notes"):
        if raw.get(field) is not None and not isinstance(raw[field], str):
            raise fail(field, f"must be a string, got {raw[field]!r}")
    values = {k: raw.get(k) for k in REQUIRED + OPTIONAL}
    for field in ("r1", "r2", "j_dp", "j_pp"):
        values[field] = float(values[field])
    return AffinityEntry(**values)


def affinity_for(gpu_type: str | None, r1: float, r2: float,
                 entries: tuple[AffinityEntry, ...] | None = None) -> tuple[float, float, AffinityEntry]:
    """(α, β, nearest entry) in (log r1, log r2); same GPU type first if any."""
    for field, value in (("r1", r1), ("r2", r2)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise LoomInputError(f"must be a positive number, got {value!r}", field=field)
    entries = load_affinity() if entries is None else entries
    same = [e for e in entries if e.gpu_type == gpu_type]
    pool = same or list(entries)
    x, y = math.log(r1), math.log(r2)
    best = min(pool, key=lambda e: (math.log(e.r1) - x) ** 2 + (math.log(e.r2) - y) ** 2)
    return best.alpha, best.beta, best


# ---------------------------------------------------------------- profiling
def profile_with_estimator(model: ModelSpec | str, gpu_type: str, tp: int, pp: int, dp: int, *,
                           micro_batch: int = 1, global_batch: int | None = None, grad_bytes: int = 2,
                           activation_bytes: int = 2, gpus_per_node: int = 8, name: str | None = None,
                           source: str | None = None) -> AffinityEntry:
    """A database entry from the estimator: gains of DP-aligned (DP groups in one
    minipod, PP across two) and PP-aligned (PP groups in one, DP across two)
    placement over the cross-minipod-both baseline (both across two minipods),
    each clamped at 0. `global_batch` defaults to 4·pp micro-batches per replica.
    r1, r2 use the same bytes per element as the estimate."""
    from loom.core.plan import ParallelPlan
    from loom.perf import preset
    from loom.perf.estimator import default_estimator
    from loom.perf.inputs import Hardware, Placement, TrainingJob

    spec = preset(model) if isinstance(model, str) else model
    gb = global_batch if global_batch is not None else dp * micro_batch * 4 * pp
    job = TrainingJob(spec, gb, grad_bytes=grad_bytes, activation_bytes=activation_bytes)
    hardware = Hardware(gpu_type, gpus_per_node=gpus_per_node)
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp, micro_batch=micro_batch)
    est = default_estimator()
    base = est.estimate(job, hardware, plan, Placement(dp_minipods=2, pp_minipods=2)).iteration_s
    dp_aligned = est.estimate(job, hardware, plan, Placement(dp_minipods=1, pp_minipods=2)).iteration_s
    pp_aligned = est.estimate(job, hardware, plan, Placement(dp_minipods=2, pp_minipods=1)).iteration_s
    r1, r2 = ratios(spec, tp, pp, micro_batch, grad_bytes, activation_bytes)
    return AffinityEntry(
        name=name or f"{spec.name}-{gpu_type}-dp{dp}tp{tp}pp{pp}mb{micro_batch}",
        gpu_type=gpu_type,
        r1=r1,
        r2=r2,
        j_dp=max(0.0, base / dp_aligned - 1.0),
        j_pp=max(0.0, base / pp_aligned - 1.0),
        source=source or f"loom.perf estimator, {date.today().isoformat()}",
        model=spec.name,
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch=micro_batch,
        grad_bytes=grad_bytes,
        activation_bytes=activation_bytes,
    )
