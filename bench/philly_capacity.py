"""Why simulated Philly queues are shorter than recorded: capacity sensitivity.

The real Philly cluster had on average 423 of its 552 servers in service
(`philly/philly_node_sequence.csv`, column `total`). This replays the full
trace with FCFS / EASY / SJF + best-fit on the full cluster and on the same
fraction of every pool, and prints the queueing delays side by side with the
recorded ones (`acme/cluster_summary.csv`, Philly row).

    python bench/philly_capacity.py [--policies fcfs,easy,sjf]
"""

from __future__ import annotations

import argparse

import polars as pl

from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.clusters import load_cluster
from loom.hardware.topology import NodeDef, Topology
from loom.paths import shared_traces_dir
from loom.report.metrics import summary
from loom.sim.engine import Simulation
from loom.workload.loaders import load_trace


def in_service_fraction() -> float:
    seq = pl.read_csv(shared_traces_dir() / "philly" / "philly_node_sequence.csv")
    return float(seq["total"].mean()) / load_cluster("philly").num_nodes


def shrunk(fraction: float) -> Topology:
    """The first `fraction` of every pool's servers (by id), same racks."""
    full = load_cluster("philly")
    pod_of = full.switch_of[full.minipod_tier]
    defs = []
    for pod in range(full.num_switches(full.minipod_tier)):
        members = [i for i in range(full.num_nodes) if pod_of[i] == pod]
        for i in members[: round(len(members) * fraction)]:
            path = tuple(full.switch_names[t][full.switch_of[t, i]].split("/")[-1] for t in range(len(full.tiers)))
            defs.append(NodeDef(full.node_names[i], path, full.gpu_types[full.node_type[i]], int(full.node_gpus[i])))
    return Topology.build(f"philly@{fraction:.2f}", full.tiers, defs, minipod_tier=full.tiers[full.minipod_tier].name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fcfs,easy,sjf")
    args = parser.parse_args()
    specs = load_trace("philly")
    recorded = pl.read_csv(shared_traces_dir() / "acme" / "cluster_summary.csv").filter(pl.col("id") == "Philly")
    fraction = in_service_fraction()
    print(f"Philly servers in service on average: {fraction:.1%} of 552\n")
    print("| cluster | GPUs | policy | avg queue s | p50 queue s | p99 queue s | GPU util |")
    print("| :--- | ---: | :--- | ---: | ---: | ---: | ---: |")
    for topo in (load_cluster("philly"), shrunk(fraction)):
        for name in args.policies.split(","):
            sim = Simulation(topo, specs, POLICIES.get(name)(), PLACERS.get("best-fit")(), log_decisions=False)
            s = summary(sim.run())
            print(f"| {topo.name} | {topo.total_gpus:,} | {name} | {s['avg_queue_s']:,.0f} | {s['p50_queue_s']:,.0f} "
                  f"| {s['p99_queue_s']:,.0f} | {s['gpu_utilization']:.3f} |")
    print(f"| Philly recorded | – | (real scheduler) | {recorded['avg_que_time_gpu'][0]:,.0f} "
          f"| {recorded['med_que_time_gpu'][0]:,.0f} | – | – |")


if __name__ == "__main__":
    main()
