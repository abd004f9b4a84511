"""Failures, checkpoints, recovery, SLA tiers and always-on preemption (issue 8).

    PYTHONPATH=. python bench/reliability.py failures [--days 30] [--seed 0] [--scale 1]
    PYTHONPATH=. python bench/reliability.py sla
    PYTHONPATH=. python bench/reliability.py elasticity [--days 7] [--scale 20]

`failures`: a 30-day Acme-Kalos workload (`generate(..., outcomes="would-be")`,
3,230 jobs) on the `acme-kalos` cluster (302 × 8 A100, 3 minipods) with node
failures from the real InfiniteHBD fault trace mapped onto the cluster and
job-level script/framework errors and hangs from the Acme taxonomy
(infrastructure faults come from the fault trace only, so they are not counted
twice). Priority policy (pretraining first), topology-aware placer, the
interruption cost model and the recovery pipeline on. The 8 combinations of
sync/async checkpoints × naive/topology replacement × 0/1 hot spare per
minipod; GPU-hours lost and the recovered jobs' spread vs their optimum.

`sla`: SLA tiers under a load surge on arnold-i (144 GPUs): basic and standard
jobs fill the cluster, then a surge of premium jobs arrives (premium plus standard
guarantees fit the cluster: 96 + 32 of 144 GPUs); per-tier
attainment with the `sla` policy (interruptions priced).

`elasticity`: the Acme-Kalos workload at `--scale` × its arrival rate, FCFS,
EASY backfilling and `sla` with `elastic=false` (no preemption, no resizing) vs the
`sla` policy with evaluation and
pretraining jobs premium and the rest basic (always-on preemption and
resizing, costs priced); evaluation queueing delay and GPU utilisation.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from loom.core.jobs import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.core.recovery import RecoveryConfig
from loom.hardware.clusters import load_cluster
from loom.paths import shared_traces_dir
from loom.perf.interruptions import InterruptionCosts, InterruptionModel
from loom.report.metrics import summary
from loom.report.sla import sla_attainment
from loom.sim.engine import Simulation
from loom.workload.faults import load_fault_trace
from loom.workload.generate import generate
from loom.workload.job import JobClass, JobSpec
from loom.workload.job_failures import AcmeFailureModel, sample_failures

DAY = 86400.0


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _fmt(x: Any, spec: str = "{:,.1f}") -> str:
    return "—" if x is None else spec.format(x)


# ------------------------------------------------------------------ failures
def failures(days: float, seed: int, scale: float) -> None:
    topo = load_cluster("acme-kalos")
    specs = generate("acme-kalos", days, seed=seed, scale=scale, outcomes="would-be")
    start = min(s.submit_time for s in specs)
    end = start + days * DAY
    faults = load_fault_trace(shared_traces_dir() / "failures_infinitehbd" / "fault_trace.json")
    node_failures = faults.to_cluster(topo, start, end, seed).failures
    plans = sample_failures(specs, AcmeFailureModel(infra_rate_per_gpu_hour=0.0), seed)
    per_minipod = int(topo.node_gpus.sum()) // topo.num_switches(topo.minipod_tier)
    print(f"{len(specs)} jobs over {days:g} days ({scale:g}× Kalos' arrival rate), {len(node_failures)} node "
          f"failures in the window, {sum(len(p) for p in plans.values())} job-level failure plans; "
          f"{per_minipod} GPUs per minipod\n")
    print(_row(["checkpoints", "replacement", "spares/minipod", "finished", "failed", "GPU util", "recoveries",
                "handed to policy", "spares used", "GPU-h redone", "GPU-h held recovering", "GPU-h pauses (preempt, restart)",
                "GPU-h checkpointing", "GPU-h lost, total", "spread grew", "> optimum before → after", "wall s"]))
    print(_row(["---"] * 17))
    for mode in ("sync", "async"):
        for replacement in ("naive", "topology"):
            for spares in (0, 1):
                t0 = time.perf_counter()
                sim = Simulation(topo, specs, POLICIES.get("priority")(), PLACERS.get("topo-aware")(),
                                 failures=node_failures, job_failures=plans, log_decisions=False,
                                 interruptions=InterruptionModel(InterruptionCosts(checkpoint_mode=mode)),
                                 recovery=RecoveryConfig(replacement=replacement, spares_per_minipod=spares))
                result = sim.run()
                wall = time.perf_counter() - t0
                s = summary(result)
                by_id = {j.job_id: j for j in result.jobs}
                restarted = [r for r in result.recoveries if r.minipods_after is not None]
                grew = sum(1 for r in restarted if r.minipods_after > r.minipods_before)
                optimum = {r.job_id: -(-by_id[r.job_id].spec.gpus // per_minipod) for r in restarted}
                worse = sum(1 for r in restarted if r.minipods_after > optimum[r.job_id])
                worse_before = sum(1 for r in restarted if r.minipods_before > optimum[r.job_id])
                lost = [s.get(k) or 0.0 for k in ("gpu_hours_lost_to_failures", "gpu_hours_held_recovering",
                                                  "gpu_hours_paused", "gpu_hours_checkpointing")]
                print(_row([mode, replacement, spares, s["finished"], s["failed"], f"{s['gpu_utilization']:.3f}",
                            s.get("recoveries", 0), s.get("recoveries_handed_to_policy", 0), s.get("spares_used", 0),
                            *(_fmt(x) for x in lost), _fmt(sum(lost)), f"{grew}/{len(restarted)}",
                            f"{worse_before} → {worse} of {len(restarted)}", f"{wall:.1f}"]), flush=True)


# ----------------------------------------------------------------------- sla
def sla() -> None:
    topo = load_cluster("arnold-i")  # 18 × 8 H800
    specs: list[JobSpec] = []
    for i in range(12):  # basic: 12 × 8 GPUs, long
        specs.append(JobSpec(f"basic{i:02d}", 60.0 * i, 8, 40_000.0, priority=0))
    for i in range(4):  # standard: 4 × 16 GPUs
        specs.append(JobSpec(f"std{i}", 100.0 + 60.0 * i, 16, 30_000.0, priority=1))
    for i in range(6):  # the surge: premium 6 × 16 GPUs at 5,000-6,000 s, 4 h each (guarantees fit: 96 + 4 × 8)
        specs.append(JobSpec(f"prem{i}", 5_000.0 + 200.0 * i, 16, 4 * 3600.0, priority=2))
    policy = POLICIES.get("sla")()
    sim = Simulation(topo, specs, policy, PLACERS.get("topo-aware")(), interruptions=InterruptionModel())
    result = sim.run()
    s = summary(result)
    print(f"arnold-i ({topo.total_gpus} GPUs): 12 basic × 8, 4 standard × 16, then 6 premium × 16 "
          f"arriving 5,000–6,000 s; finished {s['finished']}/{len(specs)}, "
          f"preemptions {s['preemptions']}, resizes {sum(j.resizes for j in result.jobs)}\n")
    print(_row(["tier", "guarantee", "jobs", "attainment", "jobs ≥ 99%", "GPUs held / requested"]))
    print(_row(["---"] * 6))
    for row in sla_attainment(result, policy.rule):
        print(_row([row["tier"], row["fraction"], row["jobs"], _fmt(row["attainment"], "{:.3f}"),
                    _fmt(row["met_99"], "{:.2f}"), _fmt(row["held_share"], "{:.3f}")]))


# ---------------------------------------------------------------- elasticity
def elasticity(days: float, scale: float, seed: int) -> None:
    topo = load_cluster("acme-kalos")
    specs = generate("acme-kalos", days, seed=seed, scale=scale)
    tiers = {"params": {"tier_by": "job_class", "tiers_map": {"eval": "premium", "pretrain": "premium"},
                        "default_tier": "basic"}}
    print(f"{len(specs)} jobs over {days:g} days at {scale:g}× Kalos' arrival rate; interruptions priced\n")
    print(_row(["policy", "eval jobs", "eval queue p50 s", "eval queue mean s", "eval queue p99 s",
                "GPU utilisation", "goodput %", "preemptions", "resizes", "avg JCT s", "wall s"]))
    print(_row(["---"] * 11))
    for name, policy in (("fcfs (no preemption)", POLICIES.get("fcfs")()),
                         ("easy (no preemption)", POLICIES.get("easy")()),
                         ("sla, elastic=false (tiers order the queue only)",
                          POLICIES.get("sla")(**tiers["params"], elastic=False)),
                         ("sla (preempt + resize)", POLICIES.get("sla")(**tiers["params"]))):
        t0 = time.perf_counter()
        sim = Simulation(topo, specs, policy, PLACERS.get("best-fit")(), log_decisions=True,
                         interruptions=InterruptionModel())
        result = sim.run()
        wall = time.perf_counter() - t0
        s = summary(result)
        waits = np.array([j.first_start - j.spec.submit_time for j in result.jobs
                          if j.spec.job_class is JobClass.EVAL and j.first_start is not None])
        finished_eval = sum(1 for j in result.jobs if j.spec.job_class is JobClass.EVAL
                            and j.state is JobState.FINISHED)
        print(_row([name, finished_eval, _fmt(float(np.median(waits)), "{:,.0f}"),
                    _fmt(float(waits.mean()), "{:,.0f}"), _fmt(float(np.percentile(waits, 99)), "{:,.0f}"),
                    _fmt(s["gpu_utilization"], "{:.3f}"), _fmt(100 * (s.get("goodput_fraction") or 0), "{:.2f}"),
                    s["preemptions"], sum(j.resizes for j in result.jobs), _fmt(s["avg_jct_s"], "{:,.0f}"),
                    f"{wall:.1f}"]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=["failures", "sla", "elasticity"])
    parser.add_argument("--days", type=float, default=None)
    parser.add_argument("--scale", type=float, default=None, help="arrival-rate multiplier (failures: 1, "
                        "elasticity: 20)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.scenario == "failures":
        failures(args.days or 30.0, args.seed, args.scale or 1.0)
    elif args.scenario == "sla":
        sla()
    else:
        elasticity(args.days or 7.0, args.scale or 20.0, args.seed)


if __name__ == "__main__":
    main()
