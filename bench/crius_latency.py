"""Crius decision latency on arena-1280 and how it grows with the queue (issue 7).

    python bench/crius_latency.py [--load 1 4] [--profile-db /path/to/prof_database.pkl]

Runs Crius (default parameters) on arena-philly, Arena's iterations/5, with
arrivals compressed ``load``× (submit times divided by it, so queues grow) and
prints the wall time of every scheduling round (one per event batch): median,
p99, max, and the same grouped by the pending-queue length the round saw.
With ``--profile-db`` jobs are priced with Arena's profile database (a heavily
loaded cluster) instead of the estimator.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from loom.hardware.clusters import load_cluster
from loom.placement.best_fit import BestFit
from loom.policies.crius import Crius
from loom.report.metrics import decision_latency, latency_by_queue, summary
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.workload.loaders import load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--profile-db", default=None)
    args = parser.parse_args()
    topo = load_cluster("arena-1280")
    specs = sorted(load_trace("arena-philly"), key=lambda s: s.submit_time)
    t0 = specs[0].submit_time
    for load in args.load:
        jobs = [dataclasses.replace(s, submit_time=t0 + (s.submit_time - t0) / load) for s in specs]
        if args.profile_db:
            from loom.sim.arena_profile import ArenaProfileSpeed
            speed = ArenaProfileSpeed(args.profile_db)
        else:
            speed = EstimatorSpeed(iteration_scale=0.2)
        wall = time.perf_counter()
        result = Simulation(topo, jobs, Crius(), BestFit(), speed, log_decisions=False).run()
        s = summary(result)
        lat = decision_latency(result)
        print(f"\nload ×{load:g} ({'arena-profile' if args.profile_db else 'estimator'} speeds): "
              f"{s['finished']}/{s['jobs']} finished, avg JCT {s['avg_jct_s']:,.0f} s, {result.rounds:,} rounds, "
              f"max queue {max(result.round_queue, default=0)}, wall {time.perf_counter() - wall:.1f} s")
        print(f"decision latency: median {lat['decision_ms_median']:.2f} ms, p99 {lat['decision_ms_p99']:.1f} ms, "
              f"max {lat['decision_ms_max']:.0f} ms")
        print("| pending jobs | rounds | median ms | p99 ms |\n|---|---|---|---|")
        for row in latency_by_queue(result):
            print(f"| {row['queue']} | {row['rounds']:,} | {row['median_ms']:.2f} | {row['p99_ms']:.1f} |")


if __name__ == "__main__":
    main()
