"""Named clusters and the `--cluster NAME | FORMAT:PATH` resolver."""

from __future__ import annotations

import csv
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.topology import NodeDef, Tier, Topology
from loom.paths import shared_traces_dir
from loom.registry import Registry

ClusterFactory = Callable[[], Topology]
CLUSTERS: Registry[ClusterFactory] = Registry("cluster", "loom.clusters")
IMPORTERS: Registry[Callable[[str], Topology]] = Registry("cluster format", "loom.cluster_formats")


@lru_cache(maxsize=32)
def load_cluster(spec: str) -> Topology:
    """Resolve a bare name through the registry, or `FORMAT:PATH` through an importer."""
    fmt, sep, path = spec.partition(":")
    if sep and fmt in IMPORTERS:
        return IMPORTERS.get(fmt)(path)
    if sep and fmt not in CLUSTERS:
        raise LoomInputError(f"unknown cluster format '{fmt}' (known: {', '.join(IMPORTERS.names()) or 'none'})",
                             field="cluster")
    return CLUSTERS.get(spec)()


# --------------------------------------------------------------------- philly
PHILLY_RACK_SIZE = 16
PHILLY_TIERS = (
    Tier("core", bandwidth_gbps=100.0, latency_us=3.0),
    Tier("pod", bandwidth_gbps=100.0, latency_us=2.0),
    Tier("rack", bandwidth_gbps=100.0, latency_us=1.0),
)
PHILLY_GPU_BY_MEMORY = {"12GB": "P100", "24GB": "P40"}


def philly_from_machine_list(path: str | Path) -> Topology:
    """Philly's 552 servers, grouped as documented in docs/CLUSTERS.md.

    The public list gives only GPU count and memory per server. Philly kept its
    2-GPU (12 GB) and 8-GPU (24 GB) servers in separate pools, so each SKU is a
    pod; inside a pod servers are racked 16 at a time in numeric id order.
    """
    path = Path(path)
    rows: list[tuple[int, str, int, str]] = []
    try:
        text = path.read_text().splitlines()
    except OSError as exc:
        raise LoomInputError(f"cannot read machine list: {exc.strerror}", source=str(path)) from None
    for lineno, line in enumerate(text[1:], start=2):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            raise LoomInputError(f"expected 3 columns, got {len(parts)}", source=str(path), line=lineno)
        name, gpus, mem = parts
        if not name.startswith("m") or not name[1:].isdigit():
            raise LoomInputError(f"machine id '{name}' is not of the form m<number>", source=str(path),
                                 line=lineno, field="machineId")
        if not gpus.isdigit() or int(gpus) < 1:
            raise LoomInputError(f"GPU count '{gpus}' is not a positive integer", source=str(path), line=lineno,
                                 field="number of GPUs")
        if mem not in PHILLY_GPU_BY_MEMORY:
            raise LoomInputError(f"unknown GPU memory '{mem}' (known: {', '.join(PHILLY_GPU_BY_MEMORY)})",
                                 source=str(path), line=lineno, field="single GPU mem")
        rows.append((int(name[1:]), name, int(gpus), PHILLY_GPU_BY_MEMORY[mem]))
    rows.sort()
    defs = []
    rack_fill: dict[str, int] = {}
    for _, name, gpus, gpu_type in rows:
        pod = f"pod-{gpu_type.lower()}x{gpus}"
        k = rack_fill.get(pod, 0)
        rack_fill[pod] = k + 1
        defs.append(NodeDef(name, ("core", pod, f"rack{k // PHILLY_RACK_SIZE:02d}"), gpu_type, gpus))
    return Topology.build("philly", PHILLY_TIERS, defs, minipod_tier="pod", source=str(path),
                          description="Microsoft Philly (2017): 552 servers, 2- and 8-GPU pools")


@CLUSTERS.register("philly")
def philly() -> Topology:
    return philly_from_machine_list(shared_traces_dir() / "philly" / "cluster_machine_list")


# ---------------------------------------------------------------- arnold i-iii
ARNOLD_SETTINGS = {"arnold-i": (3, 18), "arnold-ii": (5, 438), "arnold-iii": (11, 1019)}


def _arnold(name: str, minipods: int, nodes: int) -> ClusterFactory:
    def factory() -> Topology:
        return clos(name, minipods=minipods, nodes=nodes, gpus_per_node=8, gpu_type="H800",
                    description=f"Arnold Table 1: {minipods} minipods, {nodes} nodes × 8 H800")

    return factory


for _name, (_pods, _nodes) in ARNOLD_SETTINGS.items():
    CLUSTERS.add(_name, _arnold(_name, _pods, _nodes))
