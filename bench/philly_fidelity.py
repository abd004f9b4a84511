"""Fidelity check: simulated vs recorded Philly cluster occupancy over time.

Replays the full RFold Philly trace (FCFS + best-fit by default) and compares
the number of *active* servers (at least one busy GPU) per minute with
`philly/philly_node_sequence.csv` (per-minute `active` and `total` servers,
2017-10-03 to 2017-12-15, from HeliosArtifact). The RFold list has no wall
clock, so the simulated timeline is aligned to the recorded one by the offset
(searched in 1-hour steps) that maximises their correlation; the offset is
reported with the errors.

    python bench/philly_fidelity.py [--policy fcfs] [--placer best-fit]
"""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl

from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.clusters import load_cluster
from loom.paths import shared_traces_dir
from loom.sim.engine import Simulation
from loom.workload.loaders import load_trace

MINUTE = 60.0


def active_servers_step(result) -> tuple[np.ndarray, np.ndarray]:
    """Step function of servers with ≥ 1 busy GPU (jobs' last allocation, start → end)."""
    times, deltas, nodes = [], [], []
    for job in result.jobs:
        if job.first_start is None or job.end_time is None or job.end_time <= job.first_start:
            continue
        for node in job.allocation.nodes:
            times += [job.first_start, job.end_time]
            deltas += [1, -1]
            nodes += [node, node]
    order = np.lexsort((np.asarray(deltas), np.asarray(times)))  # ends before starts at equal times
    running = [0] * result.topology.num_nodes
    active = 0
    values = []
    for i in order.tolist():
        n, d = nodes[i], deltas[i]
        before = running[n]
        running[n] = before + d
        if before == 0 and d > 0:
            active += 1
        elif before + d == 0:
            active -= 1
        values.append(active)
    return np.asarray(times)[order], np.asarray(values)


def sample(step: tuple[np.ndarray, np.ndarray], at: np.ndarray) -> np.ndarray:
    times, values = step
    idx = np.searchsorted(times, at, side="right") - 1
    return np.where(idx >= 0, values[np.clip(idx, 0, None)], 0).astype(float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="fcfs")
    parser.add_argument("--placer", default="best-fit")
    args = parser.parse_args()
    rec = pl.read_csv(shared_traces_dir() / "philly" / "philly_node_sequence.csv")
    rec_active = rec["active"].to_numpy().astype(float)
    rec_total = rec["total"].to_numpy().astype(float)
    topo = load_cluster("philly")
    sim = Simulation(topo, load_trace("philly"), POLICIES.get(args.policy)(), PLACERS.get(args.placer)(),
                     log_decisions=False)
    result = sim.run()
    step = active_servers_step(result)
    span_h = int((result.end_time - result.start_time) // 3600)
    window = len(rec_active)
    best = None
    for hour in range(0, max(1, span_h - window // 60)):
        minutes = result.start_time + hour * 3600 + np.arange(window) * MINUTE
        sim_active = sample(step, minutes[::60])  # hourly samples for the search
        r = np.corrcoef(sim_active, rec_active[::60])[0, 1] if sim_active.std() > 0 else -1
        if best is None or r > best[0]:
            best = (r, hour)
    r_hourly, hour = best
    minutes = result.start_time + hour * 3600 + np.arange(window) * MINUTE
    sim_active = sample(step, minutes)
    err = sim_active - rec_active
    sim_frac, rec_frac = sim_active / topo.num_nodes, rec_active / np.maximum(rec_total, 1)
    print(f"policy {args.policy}, placer {args.placer}; recorded window {rec['time'][0]} → {rec['time'][-1]} "
          f"({window:,} minutes)")
    print(f"best alignment: simulated t = {hour} h after the first submission ↔ {rec['time'][0]} "
          f"(hourly correlation {r_hourly:.3f})\n")
    print("| metric | value |")
    print("| :--- | ---: |")
    print(f"| recorded active servers, mean | {rec_active.mean():.1f} |")
    print(f"| simulated active servers, mean | {sim_active.mean():.1f} |")
    print(f"| recorded servers in service (`total`), mean | {rec_total.mean():.1f} |")
    print(f"| per-minute correlation | {np.corrcoef(sim_active, rec_active)[0, 1]:.3f} |")
    print(f"| mean absolute error (servers) | {np.abs(err).mean():.1f} |")
    print(f"| mean error, sim − recorded (servers) | {err.mean():+.1f} |")
    normal = rec_active >= 50  # outside recorded outages (active drops to 0 in a few windows)
    print(f"| MAPE vs recorded active, minutes with ≥ 50 recorded active ({normal.mean():.1%}) | "
          f"{np.mean(np.abs(err[normal]) / rec_active[normal]):.1%} |")
    print(f"| median absolute percentage error | {np.median(np.abs(err) / np.maximum(rec_active, 1)):.1%} |")
    print(f"| active fraction: sim (of 552) vs recorded (of in service), mean | "
          f"{sim_frac.mean():.3f} vs {rec_frac.mean():.3f} |")


if __name__ == "__main__":
    main()
