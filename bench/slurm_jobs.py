"""Issue 21: Loom scheduling through a real Slurm cluster, side by side with Slurm's own scheduler.

    sudo python bench/slurm_jobs.py [--jobs 200] [--seed 21] [--placer arnold] [--json OUT]
    sudo python bench/slurm_jobs.py --crash 10 [--jobs 200] [--seed 21] [--gap 0.2]

One throwaway cluster (loom.service.backends.slurmtest: 16 nodes x 8 fake GPUs, 4 leaf switches
under 2 spines and a core, in a loopback-only network namespace). The same seeded workload of
`--jobs` sleep jobs (1-8 GPUs on one node, or 2-4 whole nodes; 2-8 s each; Poisson arrivals)
runs twice, on the wall clock:

1. **Loom through Slurm**: `loom serve`'s engine with the `fcfs` policy and a topology-aligned
   placer (`--placer`, default Arnold's) on the Slurm backend. A poller watches `squeue` every 0.1 s: for every start it records
   when Slurm showed the job RUNNING (the time from Loom's decision to RUNNING) and the nodes and
   GPUs per node Slurm gave it (`scontrol -o -d show job`), checked against Loom's allocation.
2. **Slurm alone**: the same jobs (the same sleep job) submitted straight to Slurm at the same arrival times, with
   `--switches=1` for multi-node jobs (Slurm's topology-aware request: one leaf switch if it can
   get one within the default max wait), Slurm's backfill scheduler deciding.

Reported: jobs lost (never finished), jobs not on the nodes Loom chose, decision-to-RUNNING
median and p99, makespan, average JCT, and multi-node jobs spanning more than one leaf switch.

`--crash KILLS`: the crash test instead (`run_crash`): a real `loom serve --backend slurm` process
takes the jobs through its API (1-4 s each, 0.2 s apart) and is killed with SIGKILL at KILLS random
moments and restarted each time; reported: jobs lost, started twice (the service's records, and
Slurm's: more than one Slurm job that ran for one Loom job), GPUs bound twice, Slurm jobs left held,
and held launches the restarted service cancelled.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loom.core.protocols import POLICIES  # noqa: E402
from loom.service.backends.slurm import SlurmBackend, job_nodes  # noqa: E402
from loom.service.backends.slurmcli import SlurmCLI  # noqa: E402
from loom.service.backends.slurmtest import NODES_PER_LEAF, SlurmCluster  # noqa: E402
from loom.service.clock import WallClock  # noqa: E402
from loom.service.engine import LiveEngine  # noqa: E402
from loom.service.specs import LaunchSpec  # noqa: E402
from loom.service.testing import double_starts_and_bindings, start, wait_for  # noqa: E402
from loom.workload.job import JobSpec  # noqa: E402


def workload(n: int, seed: int, *, gap_s: float = 0.6, durations: tuple[float, float] = (2, 8)) -> list[dict[str, Any]]:
    """Seeded jobs: (id, arrival s, GPUs, duration s); 70% single-node 1-8 GPUs, 30% 2-4 whole nodes;
    arrivals `gap_s` apart on average (Poisson), durations uniform in `durations`."""
    rng = random.Random(seed)
    t, jobs = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / gap_s)
        gpus = rng.choice((1, 2, 4, 8)) if rng.random() < 0.7 else 8 * rng.randint(2, 4)
        jobs.append({"id": f"j{i:03d}", "at": round(t, 3), "gpus": gpus, "duration": round(rng.uniform(*durations), 2)})
    return jobs


def leaf_of(node: str) -> int:
    return int(node.lstrip("n")) // NODES_PER_LEAF


class Poller:
    """Slurm's view every 0.1 s: first RUNNING time and placement of every `loom.`/`bench.` job."""

    def __init__(self, cli: SlurmCLI, prefix: str) -> None:
        self.cli, self.prefix = cli, prefix
        self.running: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.where: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            out = self.cli.run(["squeue", "-h", "-a", "-t", "all", "-o", "%i|%T|%j"], check=False)
            now = time.monotonic()
            for line in out.splitlines():
                sid, state, name = (line.strip().split("|") + ["", "", ""])[:3]
                if not name.startswith(self.prefix) or not sid.endswith(("+0",)) and "+" in sid:
                    continue
                key = f"{name}#{sid.partition('+')[0]}"
                if state in ("RUNNING", "COMPLETING", "COMPLETED") and key not in self.running:
                    self.running[key] = now
                    self.where[key] = job_nodes(self.cli, int(sid.partition("+")[0]))
                if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") and key not in self.ended:
                    self.ended[key] = now

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)


def run_loom(cli: SlurmCLI, jobs: list[dict[str, Any]], root: Path, placer: str) -> dict[str, Any]:
    clock = WallClock()
    backend = SlurmBackend(cli, root=root, gpu_type="A100-80GB", clock=clock, poll_s=0.05, grace_s=30.0, hang_s=0.0)
    decided: list[tuple[str, float, dict[str, int]]] = []
    names = backend.topology.node_names

    def on_decision(decision: Any, _ticket: Any, _at: float) -> None:
        if type(decision).__name__ in ("Start", "Resume"):
            alloc = decision.allocation
            decided.append((decision.job_id, time.monotonic(), {names[n]: g for n, g in zip(alloc.nodes, alloc.gpus)}))

    engine = LiveEngine(backend, POLICIES.get("fcfs")(), placer, clock=clock, round_interval=1.0,
                        on_decision=on_decision)
    poller = Poller(cli, "loom.")
    engine.start()
    t0 = time.monotonic()
    try:
        for job in jobs:
            time.sleep(max(0.0, t0 + job["at"] - time.monotonic()))
            spec = JobSpec(job["id"], clock.now(), job["gpus"], job["duration"])
            engine.submit(spec, LaunchSpec(job["id"], None, None, job["duration"])).result(timeout=30)
        engine.run_until(lambda: all(j.state.name in ("FINISHED", "FAILED", "CANCELLED")
                                     for j in engine.core.jobs.values()), timeout=3600)
        time.sleep(0.5)
    finally:
        poller.stop()
        engine.stop()
        backend.close()
        clock.close()
    states = {j.job_id: j.state.name for j in engine.core.jobs.values()}
    latencies, wrong = [], []
    running: dict[str, tuple[float, str]] = {}
    for key, at in sorted(poller.running.items(), key=lambda kv: kv[1]):  # a job's first Slurm job
        running.setdefault(key.split("#")[0].removeprefix("loom."), (at, key))
    for job_id, at, chosen in decided:
        seen = running.get(job_id)
        if seen is None:
            wrong.append(job_id)
            continue
        latencies.append(seen[0] - at)
        if poller.where.get(seen[1]) != chosen:
            wrong.append(job_id)
    core = engine.core
    ends = {j.job_id: j.end_time for j in core.jobs.values()}
    submits = {j.job_id: j.spec.submit_time for j in core.jobs.values()}
    multi = [j for j in core.jobs.values() if j.allocation is not None and len(j.allocation.nodes) > 1]
    spanning = sum(len({leaf_of(names[n]) for n in j.allocation.nodes}) > 1 for j in multi)
    return {"finished": sum(s == "FINISHED" for s in states.values()), "lost": sum(s != "FINISHED" for s in states.values()),
            "starts": len(decided), "not_on_chosen_nodes": len(wrong),
            "decision_to_running_s": {"median": statistics.median(latencies),
                                      "p99": sorted(latencies)[max(0, int(0.99 * len(latencies)) - 1)]},
            "makespan_s": max(ends.values()) - min(submits.values()),
            "avg_jct_s": statistics.mean(ends[j] - submits[j] for j in ends),
            "multi_node_jobs": len(multi), "spanning_leaves": spanning}


def run_slurm(cli: SlurmCLI, jobs: list[dict[str, Any]], root: Path) -> dict[str, Any]:
    script = root / "sleep.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    sleepjob = Path(__file__).resolve().parents[1] / "loom" / "service" / "backends" / "sleepjob.py"
    script.write_text(f'#!/bin/sh\n# the job Loom runs too: the built-in sleep job\nexport LOOM_RUNTIME_DIR={root}/rt '
                      f'LOOM_JOB_ID="$SLURM_JOB_NAME" LOOM_CHECKPOINT_DIR={root}/rt/"$SLURM_JOB_NAME"/checkpoints\n'
                      f'exec {sys.executable} -I -S {sleepjob} --duration "$1"\n')
    poller = Poller(cli, "bench.")
    submitted: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        for job in jobs:
            time.sleep(max(0.0, t0 + job["at"] - time.monotonic()))
            nodes = max(1, job["gpus"] // 8)
            per_node = job["gpus"] // nodes
            args = ["sbatch", "--parsable", "--job-name", f"bench.{job['id']}", "--output", "/dev/null",
                    "--time", "10", "--nodes", str(nodes), "--ntasks-per-node", "1", "--gres", f"gpu:{per_node}",
                    *(["--switches", "1"] if nodes > 1 else []), str(script), str(job["duration"])]
            cli.run(args)
            submitted[job["id"]] = time.monotonic()
        deadline = time.monotonic() + 3600
        while len(poller.ended) < len(jobs) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        poller.stop()
    ended = {k.split("#")[0].removeprefix("bench."): v for k, v in poller.ended.items()}
    where = {k.split("#")[0].removeprefix("bench."): v for k, v in poller.where.items()}
    multi = [w for w in where.values() if len(w) > 1]
    return {"finished": len(ended), "lost": len(jobs) - len(ended),
            "makespan_s": max(ended.values()) - t0,
            "avg_jct_s": statistics.mean(ended[j] - submitted[j] for j in ended),
            "multi_node_jobs": len(multi), "spanning_leaves": sum(len({leaf_of(n) for n in w}) > 1 for w in multi)}


def run_crash(cluster: SlurmCluster, cli: SlurmCLI, jobs: list[dict[str, Any]], kills: int, seed: int,
              placer: str = "arnold") -> dict[str, Any]:
    """`kill -9` of a real `loom serve --backend slurm` at `kills` random moments while `jobs` are
    submitted (through the API, at their arrival times) and run; the service is restarted at once
    each time. Afterwards: acknowledged jobs that never finished (lost), jobs started twice by the
    service (its own records: two starts with no end between them; GPUs bound twice), Loom jobs with
    more than one Slurm job that ran (Slurm's view, polled every 0.1 s and read in full at the end),
    and Slurm jobs left held."""
    rng = random.Random(seed)
    data = cluster.root / "crash" / "data"
    data.parent.mkdir(parents=True, exist_ok=True)
    env = cluster.env()
    args = ("--backend", "slurm", "--gpu-type", "A100-80GB", "--policy", "fcfs", "--placer", placer,
            "--round-interval", "1")
    serve_env = {"LOOM_SLURM_PREFIX": " ".join(cluster._ns([])), "SLURM_CONF": env["SLURM_CONF"],
                 "MUNGE_SOCKET": env["MUNGE_SOCKET"]}
    horizon = jobs[-1]["at"] + 8.0  # kills fall anywhere in the arrivals and the tail of the load
    kill_at = sorted(rng.uniform(0.5, horizon) for _ in range(kills))
    events = sorted([(j["at"], 1, j) for j in jobs] + [(t, 0, None) for t in kill_at], key=lambda e: (e[0], e[1]))
    poller = Poller(cli, "loom.")
    acknowledged: set[str] = set()
    served = start(data, *args, env=serve_env)
    t0 = time.monotonic()
    try:
        for at, is_job, job in events:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if not is_job:
                served.kill(signal.SIGKILL)
                served = start(data, *args, env=serve_env)
                continue
            _submit_until_acknowledged(served, {"job_id": job["id"], "gpus": job["gpus"], "duration": job["duration"]})
            acknowledged.add(job["id"])
        with served.client() as c:
            wait_for(lambda: _all_ended(c, acknowledged), 900, "every acknowledged job ended", every=1.0)
            states = {j["job_id"]: j["state"] for j in c.jobs(all=True)}
            twice, double = double_starts_and_bindings(c, acknowledged)
        wall = time.monotonic() - t0
    finally:
        poller.stop()
        served.kill(signal.SIGTERM)
    final = _slurm_jobs(cli)
    ran: dict[str, set[str]] = {}
    for key in poller.running:
        ran.setdefault(key.split("#")[0].removeprefix("loom."), set()).add(key.split("#")[1])
    for name, sid, state in final:
        if state not in ("CANCELLED", "PENDING"):
            ran.setdefault(name.removeprefix("loom."), set()).add(sid)
    lost = sorted(j for j in acknowledged if states.get(j) != "FINISHED")
    return {"jobs": len(jobs), "acknowledged": len(acknowledged), "kills": kills, "seed": seed, "lost": len(lost),
            "lost_ids": lost[:10], "started_twice": len(twice), "double_bound_gpus": double,
            "slurm_ran_twice": sorted(j for j, ids in ran.items() if len(ids) > 1),
            "slurm_jobs": len(final), "held_cancelled": sum(s == "CANCELLED" for _, _, s in final),
            "left_held": sum(s == "PENDING" for _, _, s in final), "wall_s": wall}


def _submit_until_acknowledged(served: Any, body: dict[str, Any]) -> None:
    """A retry sends the same spec with the same idempotency key: the service may be going down or up."""
    while True:
        try:
            with served.client() as c:
                c.submit(body, idempotency_key=body["job_id"])
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.2)


def _all_ended(c: Any, ids: set[str]) -> bool:
    states = {j["job_id"]: j["state"] for j in c.jobs(all=True)}
    return all(states.get(j) in ("FINISHED", "FAILED", "CANCELLED") for j in ids)


def _slurm_jobs(cli: SlurmCLI) -> list[tuple[str, str, str]]:
    """(name, base Slurm id, state) of every job Slurm still lists (MinJobAge keeps finished ones)."""
    out = cli.run(["squeue", "-h", "-a", "-t", "all", "-o", "%i|%T|%j"], check=False)
    rows = {}
    for line in out.splitlines():
        sid, state, name = (line.strip().split("|") + ["", "", ""])[:3]
        if name.startswith("loom."):
            rows.setdefault(sid.partition("+")[0], (name, sid.partition("+")[0], state))
    return list(rows.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--placer", default="arnold", help="Loom's placer (topology-aligned: arnold, topo-aware)")
    ap.add_argument("--crash", type=int, metavar="KILLS",
                    help="instead: kill -9 `loom serve --backend slurm` at KILLS random moments of the load")
    ap.add_argument("--gap", type=float, default=None, help="mean seconds between arrivals (0.6; 0.2 with --crash)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    gap = args.gap or (0.2 if args.crash else 0.6)
    jobs = workload(args.jobs, args.seed, gap_s=gap, durations=(1, 4) if args.crash else (2, 8))
    with SlurmCluster() as cluster:
        env = cluster.env()
        cli = SlurmCLI(tuple(cluster._ns([])), {"SLURM_CONF": env["SLURM_CONF"], "MUNGE_SOCKET": env["MUNGE_SOCKET"]})
        if args.crash:
            out = run_crash(cluster, cli, jobs, args.crash, args.seed, args.placer)
            print(json.dumps(out, indent=2))
            if args.json:
                args.json.write_text(json.dumps(out, indent=2))
            return
        loom = run_loom(cli, jobs, cluster.root / "loom", args.placer)
        print("loom through slurm:", json.dumps(loom))
        alone = run_slurm(cli, jobs, cluster.root / "alone")
        print("slurm alone:", json.dumps(alone))
    out = {"jobs": len(jobs), "seed": args.seed, "placer": args.placer, "loom_through_slurm": loom, "slurm_backfill_switches": alone,
           "makespan_ratio": loom["makespan_s"] / alone["makespan_s"], "jct_ratio": loom["avg_jct_s"] / alone["avg_jct_s"]}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
