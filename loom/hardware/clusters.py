"""Named clusters and the `--cluster NAME | FORMAT:PATH` resolver."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.hardware.topology import Tier, Topology
from loom.paths import shared_traces_dir
from loom.registry import Registry

ClusterFactory = Callable[[], Topology]
CLUSTERS: Registry[ClusterFactory] = Registry("cluster", "loom.clusters")
IMPORTERS: Registry[Callable[[str], Topology]] = Registry(
    "cluster format",
    "loom.cluster_formats",
    builtin_modules=(
        "loom.hardware.importers.yaml_spec",
        "loom.hardware.importers.tiers_csv",
        "loom.hardware.importers.slurm",
        "loom.hardware.importers.philly",
        "loom.hardware.importers.alibaba",
        "loom.hardware.importers.zhejianglab",
    ),
)


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


@CLUSTERS.register("philly")
def philly() -> Topology:
    from loom.hardware.importers.philly import philly_from_machine_list

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


# ------------------------------------------------- trace clusters (importers)
# Groupings for clusters whose traces publish no switches are documented in
# docs/CLUSTERS.md; the importers live in loom/hardware/importers/.
@CLUSTERS.register("alibaba-v2023")
def alibaba_v2023() -> Topology:
    from loom.hardware.importers.alibaba import load_alibaba_nodes

    return load_alibaba_nodes(str(shared_traces_dir() / "alibaba" / "gpu-v2023" / "openb_node_list_gpu_node.csv"),
                              name="alibaba-v2023")


@CLUSTERS.register("alibaba-v2020")
def alibaba_v2020() -> Topology:
    from loom.hardware.importers.alibaba import load_pai_machines

    return load_pai_machines(str(shared_traces_dir() / "alibaba" / "gpu-v2020" / "pai_machine_spec.tar.gz"),
                             name="alibaba-v2020")


@CLUSTERS.register("zhejianglab")
def zhejianglab() -> Topology:
    from loom.hardware.importers.zhejianglab import load_zhejianglab

    return load_zhejianglab(str(shared_traces_dir() / "zhejianglab" / "cluster_2000_A100_topology.csv"),
                            name="zhejianglab")


# Crius (EuroSys'26) simulated cluster, 1,280 GPUs: (spec name, nodes, GPUs per node).
ARENA_POOLS = (("A100-40GB", 80, 4), ("V100", 20, 16), ("A40", 160, 2), ("A10", 160, 2))


@CLUSTERS.register("arena-1280")
def arena_1280() -> Topology:
    from loom.hardware.importers._common import INVENTORY_TIERS, group_inventory

    rows = [(f"{t.split('-')[0].lower()}-{k:03d}", t, g) for t, n, g in ARENA_POOLS for k in range(n)]
    return Topology.build("arena-1280", INVENTORY_TIERS, group_inventory(rows), minipod_tier="pod",
                          description="Crius/Arena simulated cluster: 1,280 GPUs of 4 types, one pod per type")


# Acme (Shanghai AI Lab, NSDI'24): homogeneous 8x A100-SXM 80GB nodes on 200 Gb/s
# HDR InfiniBand; minipods of at most 128 nodes, 16 nodes per leaf (clos()).
ACME_TIERS = (
    Tier("core", bandwidth_gbps=200.0, latency_us=3.0),
    Tier("minipod", bandwidth_gbps=200.0, latency_us=2.0),
    Tier("leaf", bandwidth_gbps=200.0, latency_us=1.0),
)
ACME_SETTINGS = {"acme-kalos": (302, "Kalos: 302 nodes x 8 A100-80GB (2,416 GPUs)"),
                 "acme-seren": (286, "Seren: 286 nodes x 8 A100-80GB (2,288 GPUs)")}


def _acme(name: str, nodes: int, description: str) -> ClusterFactory:
    def factory() -> Topology:
        minipods = -(-nodes // 128)
        return clos(name, minipods=minipods, nodes=nodes, gpus_per_node=8, gpu_type="A100-80GB",
                    nodes_per_leaf=16, tiers=ACME_TIERS, description=f"Acme {description}")

    return factory


for _name, (_nodes, _desc) in ACME_SETTINGS.items():
    CLUSTERS.add(_name, _acme(_name, _nodes, _desc))
