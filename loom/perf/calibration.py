"""Estimator efficiency parameters, loaded from a data file with provenance.

The numbers live in ``data/calibration.yaml`` so a user can refit or override
them (``--calibration FILE``) without touching code; `bench/estimator.py --fit`
rewrites the fitted ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from loom.errors import LoomInputError
from loom.hardware.gpus import ARCHITECTURES, gpu_spec

_BUNDLED = Path(__file__).parent / "data" / "calibration.yaml"


@dataclass(frozen=True, slots=True)
class Calibration:
    """Efficiency factors (fractions in (0, 1]) and link constants."""

    gemm_efficiency: float
    link_efficiency: float
    memory_efficiency: float
    half_bw_intra_mb: float
    half_bw_inter_mb: float
    half_bw_p2p_mb: float
    latency_intra_us: float
    latency_inter_us: float
    minipod_loss_collective: float
    minipod_loss_p2p: float
    saturate_minipods: int
    memory_reserve_gib: float
    # ((architecture, precision), fraction): GEMM fraction of peak per GPU generation and precision,
    # fitted on that generation's measurements; a pair not listed uses `gemm_efficiency`
    gemm_by_generation: tuple[tuple[tuple[str, str], float], ...] = ()

    def gemm_fraction(self, gpu_type: str, precision: str) -> float:
        """Achievable fraction of `gpu_type`'s dense `precision` tensor peak for large GEMMs:
        its generation's fitted fraction for that precision (fp16 shares bf16's: the same
        tensor-core rate), else the generic `gemm_efficiency` (fitted on A100s)."""
        if self.gemm_by_generation:
            key = (_architecture(gpu_type), "bf16" if precision == "fp16" else precision)
            for pair, fraction in self.gemm_by_generation:
                if pair == key:
                    return fraction
        return self.gemm_efficiency

    def with_fit(self, gemm_efficiency: float, link_efficiency: float) -> Calibration:
        return replace(self, gemm_efficiency=gemm_efficiency, link_efficiency=link_efficiency)

    def with_generation(self, architecture: str, precision: str, fraction: float) -> Calibration:
        """A copy with (architecture, precision)'s GEMM fraction set (added if absent)."""
        table = dict(self.gemm_by_generation)
        table[(architecture, precision)] = fraction
        return replace(self, gemm_by_generation=tuple(sorted(table.items())))


@lru_cache(maxsize=256)
def _architecture(gpu_type: str) -> str:
    try:
        return gpu_spec(gpu_type).architecture
    except LoomInputError:  # a type outside gpus.yaml has no generation: the generic fraction
        return ""


_LAYOUT: dict[str, Any] = {
    "gemm_efficiency": "fraction",
    "link_efficiency": "fraction",
    "memory_efficiency": "fraction",
    "half_bandwidth_mb": {"intra_node": "positive", "inter_node_collective": "positive", "p2p": "positive"},
    "latency_us": {"intra_node": "nonnegative", "inter_node": "nonnegative"},
    "minipod_loss": {"collective": "loss", "p2p": "loss", "saturate_minipods": "count"},
    "memory_reserve_gib": "nonnegative",
}
_OPTIONAL = ("gemm_by_generation",)  # generation -> {precision: fraction}, see calibration.yaml
_GENERATION_PRECISIONS = ("bf16", "fp8")


def load_calibration(path: str | Path | None = None) -> Calibration:
    """Read and validate a calibration file (the bundled one by default)."""
    if path is None:
        return _bundled()
    return _parse(Path(path))


@lru_cache(maxsize=1)
def _bundled() -> Calibration:
    return _parse(_BUNDLED)


def _parse(path: Path) -> Calibration:
    source = str(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise LoomInputError(f"cannot read calibration file: {exc.strerror}", source=source) from exc
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        raise LoomInputError("not valid YAML", source=source, line=None if line is None else line + 1) from exc
    generations = _generations(raw.pop("gemm_by_generation", None) if isinstance(raw, dict) else None, source)
    values = _check(raw, _LAYOUT, source, "")
    return Calibration(
        gemm_efficiency=values["gemm_efficiency"],
        link_efficiency=values["link_efficiency"],
        memory_efficiency=values["memory_efficiency"],
        half_bw_intra_mb=values["half_bandwidth_mb.intra_node"],
        half_bw_inter_mb=values["half_bandwidth_mb.inter_node_collective"],
        half_bw_p2p_mb=values["half_bandwidth_mb.p2p"],
        latency_intra_us=values["latency_us.intra_node"],
        latency_inter_us=values["latency_us.inter_node"],
        minipod_loss_collective=values["minipod_loss.collective"],
        minipod_loss_p2p=values["minipod_loss.p2p"],
        saturate_minipods=int(values["minipod_loss.saturate_minipods"]),
        memory_reserve_gib=values["memory_reserve_gib"],
        gemm_by_generation=generations,
    )


def _generations(raw: object, source: str) -> tuple[tuple[tuple[str, str], float], ...]:
    """`gemm_by_generation`: {architecture: {precision: fraction}}; unknown names rejected."""
    if raw is None:
        return ()
    field = "gemm_by_generation"
    if not isinstance(raw, dict):
        raise LoomInputError("expected a mapping of GPU generation to {precision: fraction}", source=source,
                             field=field)
    table: dict[tuple[str, str], float] = {}
    for arch, fractions in raw.items():
        if arch not in ARCHITECTURES:
            raise LoomInputError(f"unknown GPU generation (allowed: {', '.join(ARCHITECTURES)})", source=source,
                                 field=f"{field}.{arch}")
        if not isinstance(fractions, dict) or not fractions:
            raise LoomInputError("expected a mapping of precision to fraction", source=source, field=f"{field}.{arch}")
        for precision, value in fractions.items():
            name = f"{field}.{arch}.{precision}"
            if precision not in _GENERATION_PRECISIONS:
                raise LoomInputError(f"unknown precision (allowed: {', '.join(_GENERATION_PRECISIONS)})",
                                     source=source, field=name)
            table[(arch, precision)] = _number(value, "fraction", source, name)
    return tuple(sorted(table.items()))


def _check(raw: object, layout: dict[str, Any], source: str, prefix: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise LoomInputError("expected a mapping", source=source, field=prefix.rstrip(".") or None)
    unknown = sorted(set(raw) - set(layout))
    if unknown:
        allowed = [*layout, *_OPTIONAL] if not prefix else list(layout)
        raise LoomInputError(f"unknown key (allowed: {', '.join(allowed)})", source=source, field=prefix + str(unknown[0]))
    values: dict[str, float] = {}
    for key, rule in layout.items():
        name = prefix + key
        if key not in raw:
            raise LoomInputError("missing", source=source, field=name)
        if isinstance(rule, dict):
            values.update(_check(raw[key], rule, source, name + "."))
        else:
            values[name] = _number(raw[key], rule, source, name)
    return values


def _number(value: object, rule: str, source: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LoomInputError(f"must be a number, got {value!r}", source=source, field=field)
    ok = {
        "fraction": 0 < value <= 1,
        "loss": 0 <= value < 1,
        "positive": value > 0,
        "nonnegative": value >= 0,
        "count": float(value).is_integer() and value >= 1,
    }[rule]
    if not ok:
        wanted = {
            "fraction": "in (0, 1]",
            "loss": "in [0, 1)",
            "positive": "> 0",
            "nonnegative": ">= 0",
            "count": "a whole number >= 1",
        }[rule]
        raise LoomInputError(f"must be {wanted}, got {value!r}", source=source, field=field)
    return float(value)
