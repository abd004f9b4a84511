"""Average JCT of the scheduling policies on an Arena trace on arena-1280 (issue 7).

    python bench/arena_policies.py arena-philly fcfs crius gavel sia elasticflow
    python bench/arena_policies.py arena-philly crius sia --conventions arena
    python bench/arena_policies.py arena-philly crius --profile-db /path/to/prof_database.pkl
    python bench/arena_policies.py arena-philly 'crius:{"max_scale": 2}'
    python bench/arena_policies.py arena-philly crius sia --plans best

``--plans`` is the fairness switch (issue 23; `EstimatorSpeed.plans`): ``decided``
(default) runs every job with the plan its policy's decision carried (Crius its
tuned Cell plan, the DP-scaling baselines their data-parallel plan, policies that
decide none the best plan); ``best`` gives every job the speed model's best plan.
Each line reports *plan speed*: the speed of the plans jobs ran over the speed
model's best plan on the same GPUs, averaged over job run time
(`loom.sim.plan_quality`; 1.00 under ``best`` and with ``--profile-db``, which
prices its best plan whatever a job decided).

Iterations/5 (Arena's convention), best-fit placer, estimator speeds unless
``--profile-db`` (Arena's own profile database as the speed model).
``--conventions loom`` (default) runs every policy with its own defaults
(30-s checkpoint-restart pauses everywhere; Crius profiles 20 s per Cell).
``--conventions arena`` prices reconfiguration as Arena's simulator does, as
far as Loom's parameters allow: Crius pays 40 s per rescale (Arena: 10 s/GPU,
capped at 40 s) and profiles for 0 s (Arena's default runs skip profiling);
baselines pay 600 s per reallocation (Arena: 150 s/GPU capped at 600 s; Arena
also charges a baseline's first start, which Loom does not).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchinfo import machine

from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.clusters import load_cluster
from loom.report.metrics import summary
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import PLAN_RULES, EstimatorSpeed
from loom.sim.plan_quality import PlanQuality
from loom.workload.loaders import load_trace

ARENA_CONVENTIONS = {"crius": {"restart_delay_s": 40.0, "profiling_s_per_cell": 0.0},
                     "sia": {"pause_s": 600.0}, "elasticflow": {"pause_s": 600.0},
                     "gavel": {"migration_pause_s": 600.0}, "gandiva": {}, "fcfs": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("policies", nargs="+", help="NAME or NAME:{json params}")
    parser.add_argument("--conventions", choices=("loom", "arena"), default="loom")
    parser.add_argument("--profile-db", default=None)
    parser.add_argument("--plans", choices=PLAN_RULES, default="decided")
    args = parser.parse_args()
    print(f"Date: {datetime.now(UTC).isoformat(timespec='seconds')}; machine: {machine()}; "
          f"command: `{shlex.join(['python', 'bench/arena_policies.py', *sys.argv[1:]])}`", flush=True)
    topo = load_cluster("arena-1280")
    specs = list(load_trace(args.trace))
    results = {}
    for arg in args.policies:
        name, _, raw = arg.partition(":")
        params = dict(ARENA_CONVENTIONS.get(name, {})) if args.conventions == "arena" else {}
        params.update(json.loads(raw) if raw else {})
        if args.profile_db:
            from loom.sim.arena_profile import ArenaProfileSpeed
            speed = PlanQuality(ArenaProfileSpeed(args.profile_db))
        else:
            speed = PlanQuality(EstimatorSpeed(iteration_scale=0.2, plans=args.plans))
        wall = time.perf_counter()
        result = Simulation(topo, specs, POLICIES.get(name)(**params), PLACERS.get("best-fit")(), speed).run()
        s = results[arg] = summary(result)
        quality = speed.job_time_average(result.decisions, result.jobs)
        stats = result.record.policy_stats  # summary.json's <policy>_<counter>
        extra = "".join(f" {k} {stats[k]:,.0f}" for k in ("oscillations", "profiling_delay_s_median", "profiling_starts")
                        if k in stats)
        print(f"{arg} {params or ''}: finished {s['finished']}/{s['jobs']} avg JCT {s['avg_jct_s']:,.0f} s "
              f"makespan {s['makespan_s']:,.0f} s plan speed {quality:.3f} decision ms median "
              f"{s['decision_ms_median']:.2f} p99 {s['decision_ms_p99']:.1f}{extra} "
              f"wall {time.perf_counter() - wall:.1f} s", flush=True)
    crius = next((s for a, s in results.items() if a.startswith("crius")), None)
    if crius:
        for arg, s in results.items():
            if not arg.startswith("crius"):
                print(f"crius vs {arg}: {crius['avg_jct_s'] / s['avg_jct_s'] - 1:+.1%} average JCT")


if __name__ == "__main__":
    main()
