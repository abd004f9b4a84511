"""Microsoft Philly inventories (grouping in docs/CLUSTERS.md).

- `philly:PATH` — `cluster_machine_list` (machineId, number of GPUs, single GPU
  mem): 12 GB GPUs → P100, 24 GB → P40.
- `philly-revised:PATH[?gpu_type=P40]` — `revised_machine_list.csv` (a third
  party's re-estimate of GPUs per server: index, machineId, number of GPUs); it
  gives no GPU model, so one type is assumed for all (default P40); servers
  re-estimated at 0 GPUs are left out.

Both group servers as pods per SKU and racks of 16 in id order, like every
inventory without published switches (`group_inventory`).
"""

from __future__ import annotations

from pathlib import Path

from loom.errors import LoomInputError
from loom.hardware.clusters import IMPORTERS
from loom.hardware.importers._common import INVENTORY_TIERS, group_inventory, read_text, resolve_gpu_type, split_query
from loom.hardware.topology import MAX_GPUS_PER_NODE, Topology

PHILLY_GPU_BY_MEMORY = {"12GB": "P100", "24GB": "P40"}


def _machine_rows(path: Path, columns: int, skip_index: bool, allow_zero: bool = False):
    """(line, machine id, GPU count, remaining cells) per data row, validated."""
    text = read_text(path, "machine list").splitlines()
    for lineno, line in enumerate(text[1:], start=2):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != columns:
            raise LoomInputError(f"expected {columns} columns, got {len(parts)}", source=str(path), line=lineno)
        if skip_index:
            parts = parts[1:]
        name, gpus, *rest = parts
        if not name.startswith("m") or not name[1:].isdigit():
            raise LoomInputError(f"machine id '{name}' is not of the form m<number>", source=str(path),
                                 line=lineno, field="machineId")
        if not gpus.isdigit() or not (0 if allow_zero else 1) <= int(gpus) <= MAX_GPUS_PER_NODE:
            raise LoomInputError(f"GPU count '{gpus}' is not a positive integer", source=str(path), line=lineno,
                                 field="number of GPUs")
        yield lineno, name, int(gpus), rest


def philly_from_machine_list(path: str | Path) -> Topology:
    path = Path(path)
    rows = []
    seen: set[str] = set()
    for lineno, name, gpus, (mem,) in _machine_rows(path, 3, skip_index=False):
        if mem not in PHILLY_GPU_BY_MEMORY:
            raise LoomInputError(f"unknown GPU memory '{mem}' (known: {', '.join(PHILLY_GPU_BY_MEMORY)})",
                                 source=str(path), line=lineno, field="single GPU mem")
        _unique(name, seen, path, lineno)
        rows.append((name, PHILLY_GPU_BY_MEMORY[mem], gpus))
    return Topology.build("philly", INVENTORY_TIERS, group_inventory(rows), minipod_tier="pod", source=str(path),
                          description="Microsoft Philly (2017): 552 servers, 2- and 8-GPU pools")


def philly_revised(spec: str) -> Topology:
    raw, params = split_query(spec, ("gpu_type",))
    path = Path(raw)
    gpu_type = resolve_gpu_type(params.get("gpu_type", "P40"), source=str(path), field="gpu_type")
    rows = []
    seen: set[str] = set()
    for lineno, name, gpus, _ in _machine_rows(path, 3, skip_index=True, allow_zero=True):
        _unique(name, seen, path, lineno)
        if gpus:  # servers re-estimated at 0 GPUs are left out
            rows.append((name, gpu_type, gpus))
    return Topology.build("philly-revised", INVENTORY_TIERS, group_inventory(rows), minipod_tier="pod",
                          source=str(path), description=f"Philly revised GPU counts, all {gpu_type}")


def _unique(name: str, seen: set[str], path: Path, lineno: int) -> None:
    if name in seen:
        raise LoomInputError(f"machine '{name}' appears twice", source=str(path), line=lineno, field="machineId")
    seen.add(name)


IMPORTERS.add("philly", philly_from_machine_list)
IMPORTERS.add("philly-revised", philly_revised)
