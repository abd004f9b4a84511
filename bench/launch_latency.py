"""What modelled launches cost, per job class, on an Acme-calibrated Kalos workload.

    PYTHONPATH=. python bench/launch_latency.py [--days 7] [--scale 6] [--seed 0]
        [--policies fcfs,sla] [--failure-probability 0.02] [--json OUT]

A generated Kalos workload (`loom.workload.generate.generate("acme-kalos", days,
scale=...)`, `scale` × Kalos' arrival rate) on the `acme-kalos` cluster (302 × 8
A100), best-fit placement and interruptions priced as in `reliability.py
elasticity`, under each policy with three launch settings:

- `none`: instant launches (every earlier result);
- `acme`: the `acme` profile, 60 s of model and data loading per Start/Resume for
  every class (Acme §4 Fig. 13: evaluation trials spend more than a minute, 29.5%
  of their time, loading the model and preprocessing data before inference);
- `acme+F%`: the same with a launch failing with probability F (the job goes back
  to the head of the queue and launches again).

One markdown table per policy, one row per job class and launch setting: jobs,
queueing delay (first start − submit; a start is the launch that came up) mean,
p50, p99; mean JCT (end − submit) of the finished jobs; mean set-up seconds
(`Job.setup_s` over jobs that started); GPU-hours spent in set-up (every STARTING
interval × the GPUs it held, from the run record: failed and called-off
launches included) and their share of the GPU-hours the class held; and the
mean queueing delay and JCT as a ratio to `none`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from benchinfo import machine

from loom.core.decisions import Resume, Start
from loom.core.lifecycle import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.clusters import load_cluster
from loom.perf.interruptions import InterruptionModel
from loom.report.metrics import summary
from loom.run import git_commit
from loom.sim.engine import Simulation, SimulationResult
from loom.sim.launch import LaunchModel
from loom.workload.generate import generate
from loom.workload.job import JobClass

CLASS_ORDER = [c.value for c in JobClass]
# as reliability.py elasticity: evaluation and pretraining premium, the rest basic
SLA_TIERS = {"tier_by": "job_class", "tiers_map": {"eval": "premium", "pretrain": "premium"},
             "default_tier": "basic"}


def policy(name: str) -> Any:
    if name == "sla":
        return POLICIES.get("sla")(**SLA_TIERS)
    return POLICIES.get(name)()


def launch_settings(failure_probability: float, seed: int) -> list[tuple[str, LaunchModel | None]]:
    settings: list[tuple[str, LaunchModel | None]] = [("none", None), ("acme", LaunchModel(profile="acme", seed=seed))]
    if failure_probability > 0:
        settings.append((f"acme+{100 * failure_probability:g}%",
                         LaunchModel(profile="acme", failure_probability=failure_probability, seed=seed)))
    return settings


def setup_gpu_seconds(result: SimulationResult) -> dict[str, float]:
    """GPU-seconds each job spent STARTING: every interval from a Start/Resume to the job leaving
    STARTING (up, failed, called off), times the GPUs that launch held."""
    launches: dict[str, list[int]] = defaultdict(list)  # job → GPUs of its launches, in order
    for _, d in result.decisions:
        if isinstance(d, (Start, Resume)):
            launches[d.job_id].append(d.allocation.total)
    since: dict[str, float] = {}
    count: Counter[str] = Counter()
    out: dict[str, float] = defaultdict(float)
    for t in result.record.transitions:
        if t.new is JobState.STARTING:
            since[t.job_id] = t.at
        elif t.old is JobState.STARTING:
            out[t.job_id] += (t.at - since.pop(t.job_id)) * launches[t.job_id][count[t.job_id]]
            count[t.job_id] += 1
    return out


def per_class(result: SimulationResult) -> dict[str, dict[str, Any]]:
    setup_gpu_s = setup_gpu_seconds(result)
    groups: dict[str, list[Any]] = defaultdict(list)
    for job in result.jobs:
        groups[job.spec.job_class.value].append(job)
    groups["all"] = list(result.jobs)
    rows = {}
    for name, jobs in groups.items():
        started = [j for j in jobs if j.first_start is not None]
        finished = [j for j in jobs if j.state is JobState.FINISHED]
        queue = np.array([j.first_start - j.spec.submit_time for j in started])
        jct = np.array([j.end_time - j.spec.submit_time for j in finished])
        setup_gpu_h = sum(setup_gpu_s.get(j.job_id, 0.0) for j in jobs) / 3600
        held_gpu_h = sum(j.gpu_seconds for j in jobs) / 3600
        rows[name] = {
            "jobs": len(jobs), "finished": len(finished),
            "queue_avg_s": float(queue.mean()) if queue.size else None,
            "queue_p50_s": float(np.median(queue)) if queue.size else None,
            "queue_p99_s": float(np.percentile(queue, 99)) if queue.size else None,
            "jct_avg_s": float(jct.mean()) if jct.size else None,
            "setup_avg_s": float(np.mean([j.setup_s for j in started])) if started else None,
            "setup_gpu_h": setup_gpu_h, "held_gpu_h": held_gpu_h,
            "setup_share": setup_gpu_h / held_gpu_h if held_gpu_h else None,
        }
    return rows


def failure_reasons(result: SimulationResult) -> dict[str, int]:
    kinds: Counter[str] = Counter()
    for _, d, reason in result.record.failed_decisions:
        if isinstance(d, (Start, Resume)):
            kinds["modelled" if "modelled" in reason else "called off" if "called off" in reason else
                  "node failure" if "node" in reason else reason] += 1
    return dict(kinds)


def _f(x: float | None, spec: str = "{:,.0f}") -> str:
    return "—" if x is None else spec.format(x)


def _ratio(x: float | None, base: float | None) -> str:
    return "—" if x is None or not base else f"{x / base:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--scale", type=float, default=6.0, help="× Kalos' arrival rate (default 6: the cluster "
                    "is busy, GPU utilisation about 0.65, without being saturated for days)")
    ap.add_argument("--seed", type=int, default=0, help="workload and launch-failure seed")
    ap.add_argument("--policies", default="fcfs,sla", help="comma-separated: fcfs, sla (tiers as in "
                    "reliability.py elasticity), or any registered policy")
    ap.add_argument("--failure-probability", type=float, default=0.02, help="of the third setting (0: leave it out)")
    ap.add_argument("--json", type=Path, default=None, help="also write every row here")
    args = ap.parse_args(argv)
    command = "PYTHONPATH=. python bench/launch_latency.py" + (
        " " + shlex.join(argv if argv is not None else sys.argv[1:]) if (argv or sys.argv[1:]) else "")
    print(f"Command: `{command}`  ")
    print(f"Date: {datetime.now(UTC).isoformat(timespec='seconds')}; machine: {machine()}; "
          f"loom commit {(git_commit() or 'unknown')[:10]}\n")

    topo = load_cluster("acme-kalos")
    specs = generate("acme-kalos", args.days, seed=args.seed, scale=args.scale)
    classes = Counter(s.job_class.value for s in specs)
    print(f"{len(specs):,} jobs over {args.days:g} days at {args.scale:g}× Kalos' arrival rate on acme-kalos "
          f"({topo.total_gpus:,} GPUs) — " + ", ".join(f"{c} {classes[c]:,}" for c in CLASS_ORDER if classes[c])
          + "; best-fit, interruptions priced.\n")
    everything: dict[str, Any] = {"command": command, "policies": {}}
    t_all = time.perf_counter()
    for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
        runs: dict[str, dict[str, Any]] = {}
        lines = []
        for label, launch in launch_settings(args.failure_probability, args.seed):
            t0 = time.perf_counter()
            sim = Simulation(topo, specs, policy(name), PLACERS.get("best-fit")(), interruptions=InterruptionModel(),
                             launch=launch, log_decisions=True)
            result = sim.run()
            wall = time.perf_counter() - t0
            s = summary(result)
            runs[label] = {"classes": per_class(result), "summary": {k: s[k] for k in (
                "finished", "unfinished", "gpu_utilization", "makespan_s", "preemptions", "avg_setup_s",
                "launch_failures")}, "failed_launches": failure_reasons(result), "wall_s": wall}
            reasons = ", ".join(f"{k} {v}" for k, v in runs[label]["failed_launches"].items()) or "none"
            lines.append(f"- `{label}`: finished {s['finished']:,}/{len(specs):,}, GPU utilisation "
                         f"{s['gpu_utilization']:.3f}, makespan {s['makespan_s'] / 3600:,.1f} h, preemptions "
                         f"{s['preemptions']:,}, `launch_failures` {s['launch_failures']:,} ({reasons}), "
                         f"`avg_setup_s` {s['avg_setup_s']:.1f}, {wall:.1f} s wall")
            print(f"{name} / {label}: {wall:.1f} s", file=sys.stderr, flush=True)
        everything["policies"][name] = runs
        print(f"### {name} + best-fit\n")
        print("| class | launch | jobs | queue avg s | queue p50 s | queue p99 s | JCT avg s | set-up avg s "
              "| set-up GPU-h | set-up % of held GPU-h | queue avg / none | JCT avg / none |")
        print("| :--- | :--- |" + " ---: |" * 10)
        base = runs["none"]["classes"]
        for cls in [c for c in CLASS_ORDER if c in base] + ["all"]:
            for label, run in runs.items():
                r, b = run["classes"][cls], base[cls]
                print(f"| {cls} | {label} | {r['jobs']:,} | {_f(r['queue_avg_s'])} | {_f(r['queue_p50_s'])} | "
                      f"{_f(r['queue_p99_s'])} | {_f(r['jct_avg_s'])} | {_f(r['setup_avg_s'], '{:.1f}')} | "
                      f"{r['setup_gpu_h']:,.1f} | {_f(None if r['setup_share'] is None else 100 * r['setup_share'], '{:.2f}')} | "
                      f"{_ratio(r['queue_avg_s'], b['queue_avg_s'])} | {_ratio(r['jct_avg_s'], b['jct_avg_s'])} |")
        print()
        print("\n".join(lines) + "\n")
    print(f"Total wall time {time.perf_counter() - t_all:.0f} s.")
    if args.json:
        args.json.write_text(json.dumps(everything, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
