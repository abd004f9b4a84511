"""Issue 21: the simulator against the live service on a real Slurm cluster, job by job.

    sudo PYTHONPATH=. python bench/slurm_fidelity.py [--jobs 50] [--train 10] [--seed 21]
        [--gap 0.25] [--placer arnold] [--json OUT]

One seeded workload runs twice with the same policy (`fcfs`) and placer (`--placer`, default
Arnold's) on the same 16 nodes x 8 GPUs (4 leaf switches, 2 spines, a core):

1. **Live**: `loom serve`'s engine (round interval 1 s) on the Slurm backend of a throwaway
   cluster (loom.service.backends.slurmtest, in its own network namespace), on the wall clock.
   Jobs: sleep-style jobs (the built-in sleep job; 1-8 GPUs on one node, or 2-4 whole nodes;
   3-10 s) and `--train` tiny real training jobs (`examples/jobs/gpt_train.py` through
   `loom run` on 1-2 processes, CPU/gloo, 100-200 iterations). Poisson arrivals `--gap` s
   apart on average: dense enough that jobs queue. Per job: submit, the start decision, when
   `squeue` first showed it RUNNING (polled every 0.1 s), when the job was up (the core's
   JobStarted: its status file says running) and its end.
2. **Simulated**: the same jobs at the live run's submit times through the simulator
   (`loom.sim.engine.Simulation`, the same policy, placer, round interval and topology),
   each job STARTING for a launch latency and then running for a duration, set from the
   live measurement per class (`sleep-1node`, `sleep-multi`, `train`), never per job:
   the launch is the class's median decision→up; a sleep job runs its stated duration plus
   its class's median overrun (up→end minus the stated duration: the exit seen through
   Slurm); a training job runs its shape's (processes, iterations) median live run time.
   Why live medians rather than a solo calibration run: on this 2-core machine the jobs'
   start-ups (Python, torch) contend with each other, so only the live run measures the
   cost under the same load. A second simulation ("per-job oracle") gives every job its
   own measured launch and run: what differs there is the scheduling itself.

Reported: per-job JCT mean absolute percentage error (overall and per class) and a phase
breakdown: for wait (submit→decision), launch (decision→up) and run (up→end), the live and
simulated means and the mean absolute per-job difference as a share of the live JCT, so a
miss names the phase that differs. Also: the median decision→RUNNING in `squeue` (the Slurm
part of a launch) and the live policy rounds' wall time (the simulator's rounds take none).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.topology import Topology
from loom.sim.engine import Simulation
from loom.sim.launch import LaunchModel
from loom.workload.job import JobSpec

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "gpt_train.py"
CLASSES = ("sleep-1node", "sleep-multi", "train")
PHASES = ("wait", "launch", "run")
POLICY = "fcfs"
ROUND_INTERVAL_S = 1.0


# ------------------------------------------------------------------ the workload
def workload(n: int, seed: int, train: int = 10, gap: float = 0.25) -> list[dict[str, Any]]:
    """Seeded jobs in arrival order: `train` tiny training jobs (1-2 processes, one GPU each,
    100 or 200 iterations) at random positions, the rest sleep jobs (70% on one node with
    1/2/4/8 GPUs, 30% on 2-4 whole nodes; 3-10 s); Poisson arrivals `gap` s apart on average."""
    rng = random.Random(seed)
    trainers = set(rng.sample(range(n), min(train, n)))
    t, jobs = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / gap)
        job: dict[str, Any] = {"id": f"j{i:03d}", "at": round(t, 3)}
        if i in trainers:
            procs = rng.choice((1, 2))
            job.update(kind="train", gpus=procs, procs=procs, iters=rng.choice((100, 200)), duration=None)
        else:
            gpus = rng.choice((1, 2, 4, 8)) if rng.random() < 0.7 else 8 * rng.randint(2, 4)
            job.update(kind="sleep", gpus=gpus, duration=round(rng.uniform(3, 10), 2))
        jobs.append(job)
    return jobs


def job_class(job: Mapping[str, Any], gpus_per_node: int = 8) -> str:
    """The class whose measured launch latency a job takes in the simulation."""
    if job["kind"] == "train":
        return "train"
    return "sleep-multi" if job["gpus"] > gpus_per_node else "sleep-1node"


def shape(job: Mapping[str, Any]) -> str:
    """A training job's shape: its run time is taken per shape (processes x iterations)."""
    return f"{job['procs']}p{job['iters']}i"


# ------------------------------------------------------------------ phases and errors (pure)
def phases(rec: Mapping[str, float]) -> dict[str, float]:
    """wait = submit→decision, launch = decision→up, run = up→end, jct = submit→end."""
    return {"wait": rec["decision"] - rec["submit"], "launch": rec["up"] - rec["decision"],
            "run": rec["end"] - rec["up"], "jct": rec["end"] - rec["submit"]}


def mape(live: Mapping[str, float], sim: Mapping[str, float]) -> float:
    """Mean absolute percentage error of `sim` against `live`, over the jobs both have (%)."""
    common = [j for j in live if j in sim]
    if not common:
        raise ValueError("no job in common")
    return 100.0 * statistics.mean(abs(sim[j] - live[j]) / live[j] for j in common)


def model_from_live(jobs: Sequence[Mapping[str, Any]], live: Mapping[str, Mapping[str, float]]
                    ) -> tuple[dict[str, float], dict[str, float], dict[str, Any]]:
    """Per-job (launch s, run s) for the simulation from the live run's *class* medians: the
    launch of the job's class; a sleep job's stated duration plus its class's median overrun;
    a training job's shape's median run. Also returns the medians themselves."""
    by_class: dict[str, list[float]] = defaultdict(list)
    overrun: dict[str, list[float]] = defaultdict(list)
    by_shape: dict[str, list[float]] = defaultdict(list)
    for job in jobs:
        p = phases(live[job["id"]])
        cls = job_class(job)
        by_class[cls].append(p["launch"])
        if job["kind"] == "train":
            by_shape[shape(job)].append(p["run"])
        else:
            overrun[cls].append(p["run"] - job["duration"])
    med = {"launch_s": {c: statistics.median(v) for c, v in by_class.items()},
           "overrun_s": {c: statistics.median(v) for c, v in overrun.items()},
           "train_run_s": {s: statistics.median(v) for s, v in by_shape.items()}}
    launch = {j["id"]: med["launch_s"][job_class(j)] for j in jobs}
    run = {j["id"]: (med["train_run_s"][shape(j)] if j["kind"] == "train"
                     else j["duration"] + med["overrun_s"][job_class(j)]) for j in jobs}
    return launch, run, med


def oracle_from_live(live: Mapping[str, Mapping[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Every job's own measured launch and run: what is left to differ is the scheduling."""
    ph = {j: phases(r) for j, r in live.items()}
    return {j: p["launch"] for j, p in ph.items()}, {j: p["run"] for j, p in ph.items()}


def compare(jobs: Sequence[Mapping[str, Any]], live: Mapping[str, Mapping[str, float]],
            sim: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """JCT MAPE overall and per class, and per phase (and class): live and simulated means, the
    mean signed difference (sim - live) and the mean |difference| / live JCT (%), the phase's
    share of the per-job error (|ΔJCT| <= Σ|Δphase|, so the largest share names the culprit)."""
    unmatched = sorted({j["id"] for j in jobs} ^ (set(live) & set(sim)))
    if unmatched:
        raise ValueError(f"jobs not in both runs: {unmatched[:5]}")
    lp = {j: phases(r) for j, r in live.items()}
    sp = {j: phases(r) for j, r in sim.items()}
    groups: dict[str, list[str]] = defaultdict(list)
    for job in jobs:
        groups["all"].append(job["id"])
        groups[job_class(job)].append(job["id"])
    out: dict[str, Any] = {}
    for name in ("all", *CLASSES):
        ids = groups.get(name)
        if not ids:
            continue
        row: dict[str, Any] = {"jobs": len(ids), "jct_mape_pct": mape({j: lp[j]["jct"] for j in ids},
                                                                       {j: sp[j]["jct"] for j in ids})}
        for ph in (*PHASES, "jct"):
            row[ph] = {"live_s": statistics.mean(lp[j][ph] for j in ids),
                       "sim_s": statistics.mean(sp[j][ph] for j in ids),
                       "diff_s": statistics.mean(sp[j][ph] - lp[j][ph] for j in ids),
                       "abs_pct_of_jct": 100.0 * statistics.mean(abs(sp[j][ph] - lp[j][ph]) / lp[j]["jct"]
                                                                 for j in ids)}
        out[name] = row
    return out


def culprit(row: Mapping[str, Any]) -> str:
    """The phase with the largest mean |difference| relative to the JCT."""
    return max(PHASES, key=lambda ph: row[ph]["abs_pct_of_jct"])


# ------------------------------------------------------------------ the simulation
@dataclass(frozen=True)
class PerJobLaunch(LaunchModel):
    """A launch latency per job id (the simulator's model is per job class; this bench's
    classes are its own, so it hands each job its class's figure)."""

    per_job: Mapping[str, float] = field(default_factory=dict)

    @property
    def instant(self) -> bool:
        return not any(self.per_job.values()) and super().instant

    def latency(self, spec: JobSpec) -> float:
        return float(self.per_job.get(spec.job_id, self.default_s))


def simulate(jobs: Sequence[Mapping[str, Any]], submits: Mapping[str, float], launch_s: Mapping[str, float],
             run_s: Mapping[str, float], topology: Topology, placer: str,
             round_interval: float | None = ROUND_INTERVAL_S) -> dict[str, dict[str, float]]:
    """The jobs through the simulator: submitted at `submits`, STARTING for `launch_s`, then
    running for `run_s`. Returns per job submit, decision, up, end (the live run's fields)."""
    specs = [JobSpec(j["id"], submits[j["id"]], j["gpus"], run_s[j["id"]]) for j in jobs]
    sim = Simulation(topology, specs, POLICIES.get(POLICY)(), PLACERS.get(placer)(),
                     round_interval=round_interval, launch=PerJobLaunch(per_job=dict(launch_s)))
    result = sim.run()
    out = {}
    for job in result.jobs:
        if job.end_time is None or job.first_start is None:
            raise RuntimeError(f"simulated job {job.job_id} did not finish ({job.state.name})")
        out[job.job_id] = {"submit": job.spec.submit_time, "decision": job.first_start,
                           "up": job.first_start + job.setup_s, "end": job.end_time}
    return out


# ------------------------------------------------------------------ the live run
class RunningPoller:
    """When `squeue` first shows each `loom.` job RUNNING (wall clock), polled every `every_s`."""

    def __init__(self, cli: Any, every_s: float = 0.1) -> None:
        self.cli, self.every_s = cli, every_s
        self.running: dict[str, float] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            out = self.cli.run(["squeue", "-h", "-a", "-t", "all", "-o", "%i|%T|%j"], check=False)
            now = time.time()
            for line in out.splitlines():
                _sid, state, name = (line.strip().split("|") + ["", "", ""])[:3]
                job = name.removeprefix("loom.")
                if name.startswith("loom.") and state in ("RUNNING", "COMPLETING", "COMPLETED"):
                    self.running.setdefault(job, now)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)


def launch_spec(job: Mapping[str, Any]) -> Any:
    """What the backend runs: the sleep job, or gpt_train.py through `loom run` on its processes."""
    from loom.service.specs import LaunchSpec

    if job["kind"] == "train":
        return LaunchSpec(job["id"], (str(EXAMPLE), "--iters", str(job["iters"])), job["procs"], None)
    return LaunchSpec(job["id"], None, None, job["duration"])


def run_live(cli: Any, jobs: Sequence[Mapping[str, Any]], root: Path, placer: str,
             timeout_s: float = 1800.0) -> tuple[dict[str, dict[str, Any]], Topology, list[float]]:
    """The jobs through the live engine on the Slurm backend, on the wall clock. Per job (times
    relative to the first submit): submit, decision, slurm_running, up, end, state, starts; and
    the wall seconds of every policy round (the simulator's rounds take no simulated time)."""
    from loom.service.backends.slurm import SlurmBackend
    from loom.service.clock import WallClock
    from loom.service.engine import LiveEngine

    clock = WallClock()
    backend = SlurmBackend(cli, root=root, gpu_type="A100-80GB", clock=clock, poll_s=0.05, grace_s=30.0, hang_s=0.0)
    starts: dict[str, int] = defaultdict(int)
    round_s: list[float] = []

    def on_decision(decision: Any, _ticket: Any, _at: float) -> None:
        if type(decision).__name__ in ("Start", "Resume"):
            starts[decision.job_id] += 1

    engine = LiveEngine(backend, POLICIES.get(POLICY)(), placer, clock=clock, round_interval=ROUND_INTERVAL_S,
                        on_decision=on_decision, on_round=lambda _now, _d, wall, _q: round_s.append(wall))
    poller = RunningPoller(cli)
    engine.start()
    t0 = time.monotonic()
    try:
        for job in jobs:
            time.sleep(max(0.0, t0 + job["at"] - time.monotonic()))
            spec = JobSpec(job["id"], clock.now(), job["gpus"], job["duration"])
            engine.submit(spec, launch_spec(job)).result(timeout=30)
        engine.run_until(lambda: all(j.state.name in ("FINISHED", "FAILED", "CANCELLED")
                                     for j in engine.core.jobs.values()), timeout=timeout_s)
        time.sleep(0.3)
    finally:
        poller.stop()
        engine.stop()
        backend.close()
        clock.close()
    return live_records(engine.core.jobs.values(), poller.running, starts), backend.topology, round_s


def live_records(core_jobs: Any, running: Mapping[str, float], starts: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """The core's view of each job (times from its first submit); `slurm_running` from squeue."""
    jobs = list(core_jobs)
    t0 = min(j.spec.submit_time for j in jobs)
    out: dict[str, dict[str, Any]] = {}
    for j in jobs:
        ok = j.state.name == "FINISHED" and j.first_start is not None and j.end_time is not None
        rec: dict[str, Any] = {"state": j.state.name, "starts": starts.get(j.job_id, 0),
                               "submit": j.spec.submit_time - t0}
        if ok:
            rec.update(decision=j.first_start - t0, up=j.first_start + j.setup_s - t0, end=j.end_time - t0,
                       slurm_running=running[j.job_id] - t0 if j.job_id in running else None)
        out[j.job_id] = rec
    return out


# ------------------------------------------------------------------ the whole comparison
def fidelity(jobs: Sequence[Mapping[str, Any]], live: Mapping[str, Mapping[str, Any]], topology: Topology,
             placer: str, round_s: Sequence[float] = ()) -> dict[str, Any]:
    """Both simulations of the live run (class medians; per-job oracle) and their comparisons;
    `round_s`: the live policy rounds' wall seconds (a decision waits for the round before it)."""
    finished = [j for j in jobs if live[j["id"]]["state"] == "FINISHED"]
    done = {j["id"]: live[j["id"]] for j in finished}
    submits = {j: r["submit"] for j, r in done.items()}
    launch, run, medians = model_from_live(finished, done)
    sim = simulate(finished, submits, launch, run, topology, placer)
    o_launch, o_run = oracle_from_live(done)
    oracle = simulate(finished, submits, o_launch, o_run, topology, placer)
    slurm = [r["slurm_running"] - r["decision"] for r in done.values() if r.get("slurm_running") is not None]
    return {"jobs": len(jobs), "finished": len(finished), "relaunched": sum(r["starts"] > 1 for r in live.values()),
            "medians": medians, "decision_to_slurm_running_median_s": statistics.median(slurm) if slurm else None,
            "live_round_s": {"rounds": len(round_s), "median": statistics.median(round_s) if round_s else None,
                             "max": max(round_s, default=None), "total": sum(round_s)},
            "class_medians": compare(finished, done, sim), "per_job_oracle": compare(finished, done, oracle),
            "live": dict(live), "sim": sim, "oracle": oracle}


def table(result: Mapping[str, Any]) -> str:
    """Markdown: JCT and MAPE per class for both simulations, then the phase breakdown."""
    lines = ["| class | jobs | live JCT mean | sim JCT mean | JCT MAPE (class medians) | JCT MAPE (per-job oracle) |",
             "|---|---|---|---|---|---|"]
    cm, oc = result["class_medians"], result["per_job_oracle"]
    for name, row in cm.items():
        lines.append(f"| {name} | {row['jobs']} | {row['jct']['live_s']:.2f} s | {row['jct']['sim_s']:.2f} s | "
                     f"{row['jct_mape_pct']:.1f}% | {oc[name]['jct_mape_pct']:.1f}% |")
    lines += ["", "| class | phase | live mean | sim mean | sim − live | mean \\|Δ\\| / live JCT | oracle: \\|Δ\\| / JCT |",
              "|---|---|---|---|---|---|---|"]
    for name, row in cm.items():
        for ph in PHASES:
            c, o = row[ph], oc[name][ph]
            lines.append(f"| {name} | {ph} | {c['live_s']:.2f} s | {c['sim_s']:.2f} s | {c['diff_s']:+.2f} s | "
                         f"{c['abs_pct_of_jct']:.1f}% | {o['abs_pct_of_jct']:.1f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--train", type=int, default=10, help="how many of the jobs are tiny training jobs")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--gap", type=float, default=0.25, help="mean seconds between arrivals")
    ap.add_argument("--placer", default="arnold")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from benchinfo import machine

    from loom.service.backends.slurmcli import SlurmCLI
    from loom.service.backends.slurmtest import SlurmCluster

    jobs = workload(args.jobs, args.seed, args.train, args.gap)
    wall = time.monotonic()
    with SlurmCluster() as cluster:
        env = cluster.env()
        cli = SlurmCLI(tuple(cluster._ns([])), {"SLURM_CONF": env["SLURM_CONF"], "MUNGE_SOCKET": env["MUNGE_SOCKET"]})
        live, topology, round_s = run_live(cli, jobs, cluster.root / "loom", args.placer)
    result = {"command": " ".join(sys.argv), "machine": machine(), "seed": args.seed, "gap_s": args.gap,
              "placer": args.placer, "policy": POLICY, "round_interval_s": ROUND_INTERVAL_S,
              **fidelity(jobs, live, topology, args.placer, round_s), "workload": jobs, "wall_s": time.monotonic() - wall}
    summary = {k: result[k] for k in ("jobs", "finished", "relaunched", "medians", "decision_to_slurm_running_median_s",
                                      "live_round_s")}
    print(json.dumps(summary, indent=2))
    print(table(result))
    print(f"\nJCT MAPE: {result['class_medians']['all']['jct_mape_pct']:.1f}% (class medians), "
          f"{result['per_job_oracle']['all']['jct_mape_pct']:.1f}% (per-job oracle); "
          f"largest phase difference: {culprit(result['class_medians']['all'])}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["finished"] == len(jobs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
