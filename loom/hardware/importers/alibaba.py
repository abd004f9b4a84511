"""Alibaba inventories: `alibaba-nodes:PATH` (v2023 openb_node_list) and `pai-machines:PATH` (v2020).

Neither trace publishes switches. Both are grouped as docs/CLUSTERS.md
documents: one pod per SKU (GPU model × GPUs per node), racks of 16 nodes in
name order, 100 Gb/s 1:1 links. CPU-only nodes (0 GPUs) are skipped: Loom
schedules GPU jobs only, and a 0-GPU node would only dilute spread metrics.
GPU model names map to spec names through data/gpu_aliases.yaml.
"""

from __future__ import annotations

import csv
import io
import tarfile
from pathlib import Path

from loom.errors import LoomInputError
from loom.hardware.clusters import IMPORTERS
from loom.hardware.importers._common import (
    INVENTORY_TIERS,
    group_inventory,
    positive_int,
    read_text,
    resolve_gpu_type,
)
from loom.hardware.topology import Topology

V2023_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
V2020_COLUMNS = ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu")
# In v2020 a plain "V100" is listed next to "V100M32", so it is the 16 GB part;
# elsewhere (and in gpus.yaml) plain V100 means the 32 GB SXM2.
PAI_OVERRIDES = {"V100": "V100-16GB"}


def load_alibaba_nodes(spec: str, name: str | None = None) -> Topology:
    path = spec
    rows = list(csv.reader(io.StringIO(read_text(path, "node list"))))
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    if not rows:
        raise LoomInputError(f"file is empty; expected header {','.join(V2023_COLUMNS)}", source=path)
    header = [h.strip() for h in rows[0]]
    for col in ("sn", "gpu", "model"):
        if col not in header:
            raise LoomInputError(f"missing column (header is {','.join(header)})", source=path, line=1, field=col)
    unknown = [h for h in header if h not in V2023_COLUMNS]
    if unknown:
        raise LoomInputError(f"unknown column (known: {', '.join(V2023_COLUMNS)})", source=path, line=1,
                             field=unknown[0])
    col = {h: i for i, h in enumerate(header)}
    nodes = _collect(rows[1:], 2, path, col["sn"], col["gpu"], col["model"], len(header),
                     ("sn", "gpu", "model"))
    return Topology.build(name or Path(path).name.split(".")[0], INVENTORY_TIERS, group_inventory(nodes),
                          minipod_tier="pod", source=path,
                          description=f"Alibaba GPU inventory from {Path(path).name} (CPU-only nodes skipped); "
                                      "pods per SKU, racks of 16")


def load_pai_machines(spec: str, name: str | None = None) -> Topology:
    """Headerless pai_machine_spec CSV, plain or inside the published .tar.gz."""
    path = spec
    text, member = _read_maybe_tar(path)
    source = f"{path}:{member}" if member else path
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    start = 1
    if rows and [c.strip() for c in rows[0]] == list(V2020_COLUMNS):
        rows, start = rows[1:], 2  # tolerate a header row
    if not rows:
        raise LoomInputError(f"no machines; expected headerless rows {','.join(V2020_COLUMNS)}", source=source)
    nodes = _collect(rows, start, source, 0, 4, 1, len(V2020_COLUMNS), ("machine", "cap_gpu", "gpu_type"),
                     PAI_OVERRIDES)
    return Topology.build(name or Path(path).name.split(".")[0], INVENTORY_TIERS, group_inventory(nodes),
                          minipod_tier="pod", source=source,
                          description=f"Alibaba PAI machines from {Path(path).name} (CPU-only machines skipped); "
                                      "pods per SKU, racks of 16")


def _collect(rows: list[list[str]], first_line: int, source: str, name_col: int, gpu_col: int, model_col: int,
             width: int, fields: tuple[str, str, str],
             overrides: dict[str, str] | None = None) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    seen: dict[str, int] = {}
    for lineno, row in enumerate(rows, start=first_line):
        if not any(c.strip() for c in row):
            continue
        if len(row) != width:
            raise LoomInputError(f"expected {width} columns, got {len(row)}", source=source, line=lineno)
        host = row[name_col].strip()
        if not host:
            raise LoomInputError("empty node name", source=source, line=lineno, field=fields[0])
        if host in seen:
            raise LoomInputError(f"node '{host}' already listed on line {seen[host]}", source=source, line=lineno,
                                 field=fields[0])
        seen[host] = lineno
        raw = row[gpu_col].strip()
        if raw.endswith(".0"):
            raw = raw[:-2]
        gpus = positive_int(raw, source=source, line=lineno, field=fields[1], allow_zero=True)
        if gpus == 0:
            continue  # CPU-only node: skipped (documented)
        model = row[model_col].strip()
        model = (overrides or {}).get(model, model)
        gpu_type = resolve_gpu_type(model, source=source, line=lineno, field=fields[2])
        out.append((host, gpu_type, gpus))
    if not out:
        raise LoomInputError("no GPU nodes in the file", source=source)
    return out


def _read_maybe_tar(path: str) -> tuple[str, str | None]:
    p = Path(path)
    if not p.name.endswith((".tar.gz", ".tgz", ".tar")):
        return read_text(p, "machine spec"), None
    try:
        with tarfile.open(p) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".csv")]
            if len(members) != 1:
                raise LoomInputError(f"expected exactly one .csv inside the archive, found {len(members)}",
                                     source=str(p))
            data = tar.extractfile(members[0])
            assert data is not None
            return data.read().decode("utf-8-sig"), members[0].name
    except (OSError, tarfile.TarError) as exc:
        raise LoomInputError(f"cannot read archive: {exc}", source=str(p)) from None
    except UnicodeDecodeError:
        raise LoomInputError("CSV inside the archive is not UTF-8 text", source=str(p)) from None


IMPORTERS.add("alibaba-nodes", load_alibaba_nodes)
IMPORTERS.add("pai-machines", load_pai_machines)
