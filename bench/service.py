"""Benchmarks of the live service (issue 19), each against a real `loom serve` process on 127.0.0.1.

    python bench/service.py load    [--submissions 10000] [--clients 32] [--db URL]
    python bench/service.py latency [--nodes 2048] [--pending 1000]
    python bench/service.py crash   [--jobs 1000] [--kills 20] [--seed 1]
    python bench/service.py all     (the three, with their defaults)

* **load** — N submissions from C concurrent clients (threads, one HTTP connection each) against
  the sim backend on a 64-node inventory (jobs "run" for their durations; nothing starts): wall
  time from the first request to the last answer, errors, throughput, and the submit latency
  p50/p99 a client saw.
* **latency** — decision latency with P jobs waiting on an emulated inventory of N nodes × 8 GPUs
  (sim backend: the backend only records bindings and reports the job running): the cluster is
  filled with long jobs, P more wait, then jobs finish one after another and each finish starts a
  policy round over the waiting ones. Reported: the policy rounds' wall time (the service's own
  `loom_decision_latency_seconds` histogram, p50/p99 from its buckets and the exact max from the
  event log's timing), and submit→start-decision time of the jobs that waited.
* **crash** — `kill -9` of the service at K random moments while J sleep-style jobs (local
  backend, real processes on 8 emulated nodes) are submitted and run; the service is restarted each
  time; at the end: jobs lost (acknowledged, never finished), started twice (more than one start
  decision carried out without an end in between), GPUs double-bound (two jobs on one GPU at once,
  from the store's transitions), and the time taken.

Prints markdown tables for docs/BENCHMARKS.md; `--json OUT` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loom.service.testing import double_starts_and_bindings, kill_under, start  # noqa: E402


def machine() -> str:
    import os

    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"{platform.platform()}, Python {platform.python_version()}; load average "
            f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def inventory(path: Path, nodes: int, gpus: int = 8, per_leaf: int = 32, poll_s: float = 0.05) -> Path:
    path.write_text(f"nodes: {nodes}\ngpus_per_node: {gpus}\nnodes_per_leaf: {min(per_leaf, nodes)}\n"
                    f"poll_s: {poll_s}\n")
    return path


# ------------------------------------------------------------------------------ load
def bench_load(submissions: int, clients: int, db: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="loom-bench-load-") as tmp:
        root = Path(tmp)
        extra = ["--db", db] if db else []
        served = start(root / "data", "--backend", "sim", "--inventory", str(inventory(root / "inv.yaml", 64)),
                       "--round-interval", "5", *extra)
        try:
            token = served.token
            latencies: list[float] = []
            errors: list[str] = []
            lock = threading.Lock()
            per_client = [submissions // clients + (1 if i < submissions % clients else 0) for i in range(clients)]

            def client(i: int) -> None:
                with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {token}"},
                                  timeout=60) as http:
                    for k in range(per_client[i]):
                        body = {"job_id": f"c{i}-{k}", "gpus": 1 + (k % 8), "duration": 3600.0,
                                "job_class": ("eval", "sft", "debug")[k % 3]}
                        t0 = time.perf_counter()
                        try:
                            r = http.post("/v1/jobs", json=body)
                            ok = r.status_code == 201
                            detail = r.text[:200]
                        except httpx.HTTPError as exc:
                            ok, detail = False, str(exc)
                        dt = time.perf_counter() - t0
                        with lock:
                            latencies.append(dt)
                            if not ok:
                                errors.append(detail)

            t0 = time.perf_counter()
            server0, client0 = _cpu_s(served.proc.pid), _own_cpu_s()
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(client, range(clients)))
            wall = time.perf_counter() - t0
            server_cpu, client_cpu = _cpu_s(served.proc.pid) - server0, _own_cpu_s() - client0
            with served.client() as c:
                stored = len(c.jobs(all=True))  # every acknowledged submission is in the store
        finally:
            served.kill(signal.SIGTERM)
            kill_under(root / "data")
    return {"submissions": submissions, "clients": clients, "db": db or "sqlite", "wall_s": wall,
            "per_s": submissions / wall, "errors": len(errors), "first_error": errors[0] if errors else None,
            "stored": stored, "p50_ms": 1000 * pct(latencies, 50), "p99_ms": 1000 * pct(latencies, 99),
            "server_cpu_ms": 1000 * server_cpu / submissions, "client_cpu_ms": 1000 * client_cpu / submissions}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (its threads included), from /proc."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ------------------------------------------------------------------------------ latency
def bench_latency(nodes: int, pending: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="loom-bench-latency-") as tmp:
        root = Path(tmp)
        served = start(root / "data", "--backend", "sim", "--inventory",
                       str(inventory(root / "inv.yaml", nodes)), "--round-interval", "10")
        try:
            with served.client() as c, ThreadPoolExecutor(16) as pool:
                fill = [{"job_id": f"fill-{i}", "gpus": 8, "duration": 40.0 + 40.0 * i / nodes} for i in range(nodes)]
                list(pool.map(c.submit, fill))
                waiting = [{"job_id": f"wait-{i}", "gpus": 8 * (1 + i % 2), "duration": 3600.0}
                           for i in range(pending)]
                t_wait = time.time()
                list(pool.map(c.submit, waiting))
                deadline = time.monotonic() + 240
                while time.monotonic() < deadline:  # the fill jobs end over ~40 s; each end is a round
                    done = sum(1 for j in c.jobs(all=True, states=["FINISHED"]))
                    if done >= nodes:
                        break
                    time.sleep(1.0)
                metrics = httpx.get(f"{served.url}/metrics").text
                started = {}
                for e in c.events():
                    if e["kind"] == "decision" and str(e.get("job_id", "")).startswith("wait-"):
                        started.setdefault(e["job_id"], e["at"])
                queue_at_start = pending
        finally:
            served.kill(signal.SIGTERM)
            kill_under(root / "data")
    buckets, count, total = _histogram(metrics, "loom_decision_latency_seconds")
    waits = [at - t_wait for at in started.values()]
    return {"nodes": nodes, "gpus": 8 * nodes, "pending": queue_at_start, "rounds": count,
            "round_mean_ms": 1000 * total / count if count else None,
            "round_p50_le_s": _quantile_bucket(buckets, count, 0.50),
            "round_p99_le_s": _quantile_bucket(buckets, count, 0.99),
            "waiting_started": len(started), "submit_to_decision_p50_s": pct(waits, 50)}


def _histogram(text: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    buckets, count, total = [], 0.0, 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
        elif line.startswith(f"{name}_count"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_sum"):
            total = float(line.rsplit(" ", 1)[1])
    return buckets, count, total


def _quantile_bucket(buckets: list[tuple[float, float]], count: float, q: float) -> float | None:
    """The upper bound of the histogram bucket holding quantile `q` (Prometheus's own resolution)."""
    for le, cumulative in buckets:
        if count and cumulative >= q * count:
            return le
    return None


# ------------------------------------------------------------------------------ crash
def bench_crash(jobs: int, kills: int, seed: int) -> dict:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="loom-bench-crash-") as tmp:
        root = Path(tmp)
        inv = inventory(root / "inv.yaml", 8, gpus=2, per_leaf=4)
        args = ["--inventory", str(inv), "--round-interval", "1"]
        served = start(root / "data", *args)
        acknowledged: set[str] = set()
        t0 = time.perf_counter()
        submitted = 0
        # the kills fall at random points of the load: after a random number of submissions each,
        # then a random pause of up to half a second (jobs start, run and end meanwhile)
        kill_after = sorted(rng.sample(range(1, jobs), kills))
        try:
            for k in range(kills + 1):
                target = kill_after[k] if k < kills else jobs
                while submitted < target:
                    job_id = f"job-{submitted:05d}"
                    body = {"job_id": job_id, "gpus": rng.choice((1, 1, 2, 4)), "duration": rng.uniform(0.05, 0.5)}
                    while True:  # until acknowledged: a retry sends the same spec with the same key
                        try:
                            with served.client() as c:
                                c.submit(body, idempotency_key=job_id)
                            break
                        except Exception:  # noqa: BLE001 — the service may be going down or coming up
                            time.sleep(0.2)
                    acknowledged.add(job_id)
                    submitted += 1
                if k == kills:
                    break
                time.sleep(rng.uniform(0.0, 0.5))
                served.kill(signal.SIGKILL)
                served = start(root / "data", *args)
            deadline = time.monotonic() + 600
            with served.client() as c:
                while time.monotonic() < deadline:
                    states = {j["job_id"]: j["state"] for j in _all_jobs(c)}
                    if all(states.get(j) in ("FINISHED", "FAILED", "CANCELLED") for j in acknowledged):
                        break
                    time.sleep(1.0)
                lost = sorted(j for j in acknowledged if states.get(j) != "FINISHED")
                twice, double = double_starts_and_bindings(c, acknowledged)
            wall = time.perf_counter() - t0
        finally:
            served.kill(signal.SIGTERM)
            kill_under(root / "data")
    return {"jobs": jobs, "acknowledged": len(acknowledged), "kills": kills, "seed": seed, "lost": len(lost),
            "lost_ids": lost[:10], "started_twice": len(twice), "double_bound_gpus": double, "wall_s": wall}


def _all_jobs(c) -> list[dict]:
    return c.jobs(all=True)


# ------------------------------------------------------------------------------ output
def table(title: str, row: dict, keys: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(label for _, label, _ in keys) + " |"
    sep = "| " + " | ".join("---:" for _ in keys) + " |"
    cells = []
    for key, _, fmt in keys:
        v = row.get(key)
        cells.append("–" if v is None else format(v, fmt) if fmt else str(v))
    return f"### {title}\n\n{head}\n{sep}\n| " + " | ".join(cells) + " |\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("load", "latency", "crash", "all"))
    ap.add_argument("--submissions", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--db", default=None, help="store URL for the load bench (default: SQLite)")
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--pending", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out: dict = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
                 "command": "python bench/service.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    text = [f"Command: `{out['command']}`  \nMachine: {out['machine']}  \nDate: {out['date']}\n"]
    if args.what in ("load", "all"):
        r = out["load"] = bench_load(args.submissions, args.clients, args.db)
        text.append(table(f"Load: {r['submissions']:,} submissions from {r['clients']} clients ({r['db']})", r, [
            ("wall_s", "wall s", ".1f"), ("per_s", "submissions/s", ",.0f"), ("errors", "errors", ""),
            ("stored", "in the store", ","), ("p50_ms", "submit p50 ms", ".1f"), ("p99_ms", "submit p99 ms", ".1f"),
            ("server_cpu_ms", "service CPU ms / submission", ".2f"),
            ("client_cpu_ms", "clients' CPU ms / submission", ".2f")]))
        ok = r["wall_s"] <= 60 and r["errors"] == 0 and r["stored"] == r["submissions"] and r["submissions"] >= 10_000
        text.append(f"Floor: 10,000 in ≤ 60 s with no error — {'met' if ok else 'NOT met'}"
                    f"{'' if r['submissions'] >= 10_000 else ' (fewer submissions than the floor names)'}.\n")
    if args.what in ("latency", "all"):
        r = out["latency"] = bench_latency(args.nodes, args.pending)
        text.append(table(f"Decision latency: {r['pending']:,} jobs waiting on {r['nodes']:,} nodes "
                          f"({r['gpus']:,} GPUs)", r, [
            ("rounds", "policy rounds", ",.0f"), ("round_mean_ms", "round mean ms", ".1f"),
            ("round_p50_le_s", "round p50 ≤ s", "g"), ("round_p99_le_s", "round p99 ≤ s", "g"),
            ("waiting_started", "waiting jobs started", ","),
            ("submit_to_decision_p50_s", "submit→start p50 s", ".1f")]))
        p99 = r["round_p99_le_s"]
        text.append(f"Floor: p99 ≤ 1 s — {'met' if p99 is not None and p99 <= 1.0 else 'NOT met'} "
                    "(p99 as the histogram bucket bound that holds it).\n")
    if args.what in ("crash", "all"):
        r = out["crash"] = bench_crash(args.jobs, args.kills, args.seed)
        text.append(table(f"Crash: kill -9 at {r['kills']} random moments during {r['jobs']:,} jobs", r, [
            ("acknowledged", "acknowledged", ","), ("lost", "lost", ""), ("started_twice", "started twice", ""),
            ("double_bound_gpus", "GPUs double-bound", ""), ("wall_s", "wall s", ".0f")]))
        ok = r["lost"] == 0 and r["started_twice"] == 0 and r["double_bound_gpus"] == 0
        text.append(f"Floor: 0 lost, 0 duplicated, 0 double-bound — {'met' if ok else 'NOT met'}.\n")
    print("\n".join(text))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
