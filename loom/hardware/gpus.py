"""Per-type GPU specifications, read from a cited data file.

The numbers live in `data/gpus.yaml`, next to the datasheet URLs they came
from, so they can be audited without reading code. This module only validates
that file and serves it: speed and network models should never hard-code a
TFLOP/s or bandwidth figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from loom.errors import LoomInputError, UnknownNameError, did_you_mean


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Vendor peak numbers for one GPU type; units are documented in gpus.yaml."""

    name: str
    tflops_bf16: float
    tflops_fp16: float
    memory_gib: float
    memory_bw_gbps: float
    intra_node_gbps: float
    nic_gbps: float
    source: tuple[str, ...]
    notes: str = ""
    tflops_fp8: float = 0.0  # dense FP8 tensor TFLOP/s; 0 = no FP8 tensor cores (FP8 runs at the BF16 peak)
    # GPU generation ("ampere", "hopper", ...): the calibration's per-generation GEMM fractions key on it
    architecture: str = ""

    def peak_tflops(self, precision: str) -> float:
        """Dense tensor peak for a compute precision ("bf16", "fp16", "fp8")."""
        if precision == "fp8" and self.tflops_fp8 > 0:
            return self.tflops_fp8
        return self.tflops_fp16 if precision == "fp16" else self.tflops_bf16


_NUMERIC = ("tflops_bf16", "tflops_fp16", "memory_gib", "memory_bw_gbps", "intra_node_gbps", "nic_gbps")
_REQUIRED = (*_NUMERIC, "source")
_OPTIONAL_NUMERIC = ("tflops_fp8",)  # absent = 0: the GPU has no FP8 tensor cores
ARCHITECTURES = ("pascal", "volta", "turing", "ampere", "ada", "hopper")  # optional `architecture` values
_ALLOWED = frozenset((*_REQUIRED, *_OPTIONAL_NUMERIC, "notes", "architecture"))


def load_gpu_specs(path: str | Path | None = None) -> dict[str, GpuSpec]:
    """Load and validate a GPU table; the bundled one unless `path` is given.

    Every problem is a `LoomInputError` naming the file, the line and the
    `TYPE.field`, because a silently wrong spec skews every simulated result.
    """
    if path is None:
        return dict(_bundled_specs())  # a copy, so callers cannot corrupt the cache
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise LoomInputError(f"cannot read GPU spec file: {exc.strerror or exc}", source=str(p)) from None
    return _parse(text, str(p))


def gpu_spec(name: str) -> GpuSpec:
    """Look up a type in the bundled table, suggesting near misses on a typo."""
    specs = _bundled_specs()
    try:
        return specs[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown GPU type '{name}' (known: {', '.join(sorted(specs))}){did_you_mean(name, specs)}"
        ) from None


@lru_cache(maxsize=1)
def _bundled_specs() -> dict[str, GpuSpec]:
    resource = files("loom.hardware") / "data" / "gpus.yaml"
    return _parse(resource.read_text(encoding="utf-8"), str(resource))


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when built with it: the same nodes, ~10x faster


def _parse(text: str, source: str) -> dict[str, GpuSpec]:
    # Walk the node tree rather than yaml.safe_load's plain dicts: nodes keep
    # line numbers for every error, and duplicate keys (which safe_load would
    # silently overwrite) stay visible.
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise LoomInputError("file is empty; expected a mapping of GPU type to spec", source=source)
        if not isinstance(root, yaml.MappingNode):
            raise LoomInputError("expected a mapping of GPU type to spec", source=source, line=_line(root))
        specs: dict[str, GpuSpec] = {}
        for key_node, value_node in root.value:
            name = loader.construct_object(key_node, deep=True)
            if not isinstance(name, str) or not name.strip():
                raise LoomInputError(
                    f"GPU type name must be a non-empty string, got {name!r}", source=source, line=_line(key_node)
                )
            if name in specs:
                raise LoomInputError("duplicate GPU type", source=source, line=_line(key_node), field=name)
            specs[name] = _parse_entry(loader, name, value_node, source)
        return specs
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise LoomInputError(
            f"invalid YAML: {problem}", source=source, line=mark.line + 1 if mark is not None else None
        ) from None
    finally:
        loader.dispose()


def _parse_entry(loader: yaml.SafeLoader, name: str, node: yaml.Node, source: str) -> GpuSpec:
    if not isinstance(node, yaml.MappingNode):
        raise LoomInputError("expected a mapping of spec fields", source=source, line=_line(node), field=name)
    values: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        where = f"{name}.{key}"
        if key not in _ALLOWED:
            raise LoomInputError(
                f"unknown field (allowed: {', '.join(sorted(_ALLOWED))})",
                source=source, line=_line(key_node), field=where,
            )
        if key in values:
            raise LoomInputError("duplicate field", source=source, line=_line(key_node), field=where)
        values[key] = loader.construct_object(value_node, deep=True)
        lines[key] = _line(value_node)

    missing = [f for f in _REQUIRED if f not in values]
    if missing:
        raise LoomInputError(
            f"missing required field(s): {', '.join(missing)}",
            source=source, line=_line(node), field=f"{name}.{missing[0]}",
        )

    for f in _NUMERIC:
        v = values[f]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise LoomInputError(
                f"must be a positive number, got {v!r}", source=source, line=lines[f], field=f"{name}.{f}"
            )

    for f in _OPTIONAL_NUMERIC:
        v = values.get(f, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise LoomInputError(
                f"must be a number >= 0, got {v!r}", source=source, line=lines[f], field=f"{name}.{f}"
            )

    src = values["source"]
    if not isinstance(src, list) or not src or not all(isinstance(s, str) and s.strip() for s in src):
        raise LoomInputError(
            f"must be a non-empty list of URL strings, got {src!r}",
            source=source, line=lines["source"], field=f"{name}.source",
        )

    notes = values.get("notes")
    if notes is None:
        notes = ""
    elif not isinstance(notes, str):
        raise LoomInputError(
            f"must be text, got {notes!r}", source=source, line=lines["notes"], field=f"{name}.notes"
        )

    architecture = values.get("architecture", "")
    if architecture and architecture not in ARCHITECTURES:
        raise LoomInputError(
            f"must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}",
            source=source, line=lines["architecture"], field=f"{name}.architecture",
        )

    return GpuSpec(
        name=name,
        **{f: float(values[f]) for f in _NUMERIC},
        **{f: float(values.get(f, 0.0)) for f in _OPTIONAL_NUMERIC},
        source=tuple(s.strip() for s in src),
        notes=notes.strip(),
        architecture=architecture,
    )


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


@lru_cache(maxsize=1)
def gpu_aliases() -> dict[str, str]:
    """Model names used by public traces (data/gpu_aliases.yaml) → spec names."""
    resource = files("loom.hardware") / "data" / "gpu_aliases.yaml"
    data = yaml.safe_load(resource.read_text(encoding="utf-8")) or {}
    return {str(k): str(v) for k, v in data.items()}


def resolve_gpu_type(name: str, *, source: str | None, line: int | None = None, field: str = "gpu_type") -> str:
    """A spec name from gpus.yaml, or an alias from gpu_aliases.yaml; else a located error."""
    known = load_gpu_specs()
    name = name.strip()
    if name in known:
        return name
    aliases = gpu_aliases()
    if name in aliases:
        return aliases[name]
    by_lower = {k.lower(): v for k, v in {**{k: k for k in known}, **aliases}.items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    hint = did_you_mean(name, [*known, *aliases])
    raise LoomInputError(f"unknown GPU type '{name}' (known: {', '.join(sorted(known))}){hint}",
                         source=source, line=line, field=field)
