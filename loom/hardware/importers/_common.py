"""Helpers shared by the cluster importers: query suffixes, GPU aliases, files."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote


from loom.errors import LoomInputError
from loom.hardware.gpus import gpu_aliases, resolve_gpu_type  # noqa: F401  (re-exported for importers)
from loom.hardware.topology import MAX_GPUS_PER_NODE, NodeDef, Tier


def split_query(spec: str, allowed: Iterable[str]) -> tuple[str, dict[str, str]]:
    """`hosts.csv?gpu_type=H100&gpus_per_node=8` → ("hosts.csv", {...}).

    Only the text after the last `?` is a query; unknown keys are errors so a
    typo never silently falls back to a default.
    """
    allowed = tuple(allowed)
    path, sep, query = spec.rpartition("?")
    if not sep:
        return spec, {}
    params: dict[str, str] = {}
    for part in query.split("&"):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = unquote(key.strip())
        if not eq or not key:
            raise LoomInputError(f"query parameter '{part}' is not KEY=VALUE", source=path, field="query")
        if key not in allowed:
            raise LoomInputError(f"unknown query parameter (allowed: {', '.join(allowed) or 'none'})",
                                 source=path, field=key)
        if key in params:
            raise LoomInputError("query parameter given twice", source=path, field=key)
        params[key] = unquote(value.strip())
    return path, params


def positive_int(text: str, *, source: str, field: str, line: int | None = None, allow_zero: bool = False,
                 maximum: int = MAX_GPUS_PER_NODE) -> int:
    """A GPU count (by default): digits only, from 1 (or 0) to `maximum`."""
    value = text.strip()
    if not re.fullmatch(r"\d+", value) or (int(value) == 0 and not allow_zero) or int(value) > maximum:
        kind = "non-negative" if allow_zero else "positive"
        raise LoomInputError(f"expected a {kind} integer up to {maximum:,}, got '{text}'", source=source, line=line,
                             field=field)
    return int(value)


def read_text(path: str | Path, what: str) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise LoomInputError(f"cannot read {what}: {exc.strerror or exc}", source=str(p)) from None
    except UnicodeDecodeError:
        raise LoomInputError(f"{what} is not UTF-8 text", source=str(p)) from None


def natural_key(name: str) -> tuple:
    """Sort `n2` before `n10`."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


# Tiers for inventories that publish no switch topology (Alibaba): the same
# 100 Gb/s, 1:1, 3/2/1 µs fabric docs/CLUSTERS.md assumes for Philly.
INVENTORY_TIERS = (
    Tier("core", bandwidth_gbps=100.0, latency_us=3.0),
    Tier("pod", bandwidth_gbps=100.0, latency_us=2.0),
    Tier("rack", bandwidth_gbps=100.0, latency_us=1.0),
)
INVENTORY_RACK_SIZE = 16


def group_inventory(rows: list[tuple[str, str, int]]) -> list[NodeDef]:
    """(name, gpu_type, gpus) → nodes under core → pod per SKU → racks of 16.

    A SKU is (GPU type, GPUs per node); inside a pod, nodes are sorted by name
    (numbers compared numerically) and racked 16 at a time.
    """
    defs = []
    fill: dict[str, int] = {}
    for name, gpu_type, gpus in sorted(rows, key=lambda r: natural_key(r[0])):
        pod = f"pod-{gpu_type.lower()}x{gpus}"
        k = fill.get(pod, 0)
        fill[pod] = k + 1
        defs.append(NodeDef(name, ("core", pod, f"rack{k // INVENTORY_RACK_SIZE:02d}"), gpu_type, gpus))
    return defs


def default_tiers(names: list[str], bandwidth_gbps: float = 400.0) -> tuple[Tier, ...]:
    """Documented defaults: 400 Gb/s, 1:1 at every tier; 1 µs per tier, more towards the top."""
    depth = len(names)
    return tuple(Tier(n, bandwidth_gbps=bandwidth_gbps, latency_us=float(depth - i)) for i, n in enumerate(names))
