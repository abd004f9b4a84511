"""Reservation for a planned pretraining job on an Acme-calibrated cluster
(Arnold Algorithm 1 and Fig. 14), against strict reservation and best-effort
reserve-and-pack; then Arnold vs best-fit choice of the reserved nodes.

Scenario: `acme-kalos` (302 nodes × 8 A100-80GB), a generated Kalos workload
(`loom workload generate --profile acme-kalos`, scaled up so the cluster is
busy; the generator's own planned jobs are kept as ordinary jobs), plus one
1,024-GPU pretraining job announced 4 h before it arrives on day 2 at 12:00.
Scheduling interval 600 s. The predicted completion used to admit jobs into the
reserved region is `--estimate`: the oracle × an inflation factor (an upper
quantile stand-in) or the LightGBM predictor's 90th percentile trained on a
different seed's workload.

    python bench/reservation.py [--days 3] [--scale 20] [--seed 0] [--estimate predictor|oracle]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from loom.core.protocols import PLACERS
from loom.hardware.clusters import load_cluster
from loom.perf import preset
from loom.perf.estimator import default_estimator
from loom.perf.inputs import Hardware, TrainingJob
from loom.perf.placement import placement_of
from loom.policies.reservation import ReservationPolicy
from loom.sim.engine import Simulation
from loom.workload.generate import generate
from loom.workload.job import JobSpec

ARRIVAL = 1.5 * 86400.0  # day 2, 12:00
ANNOUNCE = ARRIVAL - 4 * 3600.0
INTERVAL = 600.0


def workload(days: float, scale: float, seed: int) -> list[JobSpec]:
    jobs = [replace(j, announce_time=None) for j in generate("acme-kalos", days, seed, scale=scale)]
    big = JobSpec("planned-1024", ARRIVAL, 1024, 2 * 86400.0, gpu_type="A100-80GB", announce_time=ANNOUNCE,
                  model="llama2-70b", preemptible=False, priority=3)
    return sorted([*jobs, big], key=lambda j: j.submit_time)


def estimator_for(kind: str, days: float, scale: float, seed: int, specs: list[JobSpec]):
    if kind == "oracle":
        return None
    from loom.predict.model import JctPredictor, runtime_estimator

    training = generate("acme-kalos", days, seed + 100, scale=scale)
    predictor = JctPredictor(seed=seed)
    predictor.fit(training)
    return runtime_estimator(predictor, quantile=0.9, specs=specs)


def run(specs: list[JobSpec], mode: str, estimate, reservation_placer: str = "arnold"):
    topo = load_cluster("acme-kalos")
    policy = ReservationPolicy(mode=mode, reservation_placer=reservation_placer)
    kwargs = {} if estimate is None else {"runtime_estimate": estimate}
    sim = Simulation(topo, specs, policy, PLACERS.get("best-fit")(), round_interval=INTERVAL,
                     log_decisions=True, **kwargs)
    t0 = time.perf_counter()
    result = sim.run()
    return policy, result, time.perf_counter() - t0


def curves(policy: ReservationPolicy, total_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = np.array([row[0] for row in policy.timeline])
    busy = np.array([row[1] for row in policy.timeline]) / total_nodes
    reserved_busy = np.array([row[3] / max(1, row[2]) for row in policy.timeline])
    return t, busy, reserved_busy


def big_job_throughput(result, topo) -> float:
    """Estimated iteration time of the planned job on the nodes it got (seconds)."""
    decision = next(d for _, d in result.decisions if type(d).__name__ == "Start" and d.job_id == "planned-1024")
    plan = decision.plan
    placement = placement_of(decision.allocation.nodes, plan, topo)
    job = TrainingJob(preset("llama2-70b"), 1024)
    from loom.perf.search import Choices, search_plans

    best = search_plans(job, Hardware("A100-80GB"), 1024, choices=Choices(dp=plan.dp, tp=plan.tp, pp=plan.pp,
                                                                          vpp=1), top=1).best
    return default_estimator().estimate(job, Hardware("A100-80GB"), best.plan, placement).iteration_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--scale", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--estimate", choices=("predictor", "oracle"), default="predictor")
    parser.add_argument("--figure", default="docs/img/reservation.png")
    args = parser.parse_args()
    specs = workload(args.days, args.scale, args.seed)
    estimate = estimator_for(args.estimate, args.days, args.scale, args.seed, specs)
    topo = load_cluster("acme-kalos")
    print(f"{len(specs):,} jobs over {args.days} days (scale {args.scale}); planned 1,024-GPU job announced at "
          f"{ANNOUNCE / 3600:.0f} h, arrives at {ARRIVAL / 3600:.0f} h; estimate = {args.estimate}\n")
    rows, lines = [], {}
    for mode in ("predict", "strict", "best-effort"):
        policy, result, wall = run(specs, mode, estimate)
        t, busy, reserved_busy = curves(policy, topo.num_nodes)
        window = (t >= ANNOUNCE) & (t < ARRIVAL)
        delay = policy.stats.start_delay_s.get("planned-1024")
        rows.append((mode, policy.stats.violations, policy.stats.preempted_at_arrival, delay,
                     float(busy[window].mean()), policy.stats.inside_starts, wall))
        lines[mode] = (t, busy, reserved_busy)
    print("| mode | violations | preempted at arrival | start delay s | mean allocation rate (announce → arrival) "
          "| jobs started inside the region | sim s |")
    print("| :--- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, v, p, d, a, inside, wall in rows:
        print(f"| {mode} | {v} | {p} | {'never' if d is None else f'{d:.0f}'} | {a:.3f} | {inside} | {wall:.1f} |")
    predict_rate = rows[0][4]
    strict_rate = rows[1][4]
    print(f"\nallocation rate, predict − strict: {predict_rate - strict_rate:+.3f} (floor ≥ +0.10)")
    _figure(lines, args.figure)
    print(f"figure: {args.figure}\n")
    times = {}
    for placer in ("arnold", "best-fit"):
        _, result, _ = run(specs, "predict", estimate, reservation_placer=placer)
        times[placer] = big_job_throughput(result, topo)
    gain = times["best-fit"] / times["arnold"] - 1
    print("| reserved nodes chosen by | planned job iteration s (estimator, its placement) |")
    print("| :--- | ---: |")
    for placer, seconds in times.items():
        print(f"| {placer} | {seconds:.3f} |")
    print(f"\nArnold over best-fit: {gain:+.2%} throughput for the planned job")


def _figure(lines, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    colours = {"predict": "#1f77b4", "strict": "#2ca02c", "best-effort": "#ff7f0e"}
    for mode, (t, busy, reserved_busy) in lines.items():
        keep = (t >= ANNOUNCE - 3600) & (t <= ARRIVAL + 3600)
        hours = (t[keep] - ARRIVAL) / 3600
        ax.plot(hours, busy[keep], color=colours[mode], label=f"{mode}: allocation rate")
        ax.plot(hours, reserved_busy[keep], color=colours[mode], ls="--", lw=1, label=f"{mode}: reserved nodes busy")
    ax.axvline(0, color="k", lw=0.8)
    ax.axvline(-4, color="k", lw=0.8, ls=":")
    ax.set_xlabel("hours relative to the planned job's arrival (announced at −4 h)")
    ax.set_ylabel("fraction of nodes")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=6.5, ncol=2, loc="lower left")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


if __name__ == "__main__":
    main()
