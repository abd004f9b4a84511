"""Benchmark Loom's simulator on the Philly trace (111,549 jobs, 552 servers).

    python bench/sim_philly.py [--policies fcfs,easy,sjf] [--sizes 10000,50000,111549]
                               [--repeat 3] [--json OUT] [--no-decision-log]

1. Engine scaling: FCFS + best-fit on the first N jobs for each size: event
   loop wall time (`SimulationResult.sim_wall_s`, median of --repeat runs),
   setup time (trace load + Simulation construction), events/s, peak RSS, and
   wall(n) / (n log n) normalised to the smallest size. The bare FCFS loop of
   `bench/bare_fcfs.py` runs on the same prefixes in the same invocation, for
   the loom/bare wall-time ratio and a check that both give the same queueing.
2. Policies on the full trace (best-fit): queueing delay, JCT, utilisation,
   finished jobs and wall time, next to Philly's recorded statistics from
   the Acme `cluster_summary.csv`.

Every measurement runs in a fresh `python` subprocess, so its peak RSS
(`ru_maxrss`) is its own. Tables are printed as markdown on stdout (progress
goes to stderr), ready to paste into docs/BENCHMARKS.md.

    python bench/sim_philly.py --main-command [--runs 5] [--no-report] [--json OUT]

3. The README's main command, as a user runs it: `loom simulate --trace philly --cluster philly
   --policy fcfs --placer best-fit --out runs/philly-fcfs` (plus `--force`), `--runs` times, each
   a fresh process in a fresh working directory. Per run: the whole process's wall time and peak
   RSS (`os.wait4`), the phases the run records in `manifest.json` (`timing`: load, loop,
   records, report), the time outside them (interpreter start, imports, the CLI, exit) and the
   size of `report.html`; then the median and minimum of each. Issue 17's floor: whole command
   ≤ 5 s, peak RSS ≤ 400 MB, report ≤ 2 s after the simulation and ≤ 3 MB.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
FULL_TRACE_JOBS = 111_549


# ------------------------------------------------------------------ worker
def _rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def worker(spec: dict) -> dict:
    """One measurement, run inside a fresh subprocess."""
    limit = spec["limit"]
    if spec["kind"] == "bare":
        sys.path.insert(0, str(HERE))
        import bare_fcfs

        base_rss = _rss_mib()
        r = bare_fcfs.run_bare(limit)
        return {**r, "sim_wall_s": r["wall_s"], "base_rss_mib": base_rss, "peak_rss_mib": _rss_mib()}

    from loom.config import load_config
    from loom.report.metrics import summary
    from loom.run import build_simulation

    cfg = load_config(None, {
        "trace": "philly", "cluster": "philly", "policy": spec["policy"], "placer": spec["placer"],
        "limit_jobs": limit, "outputs.decision_log": spec["decision_log"],
    })
    base_rss = _rss_mib()
    t0 = time.perf_counter()
    sim = build_simulation(cfg)  # cluster + trace load + Simulation construction
    setup = time.perf_counter() - t0
    result = sim.run()
    stats = summary(result)
    return {**stats, "setup_s": setup, "base_rss_mib": base_rss, "peak_rss_mib": _rss_mib()}


def measure(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"measurement {spec} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict]) -> dict:
    """Numeric fields: median over the repeats; the rest from the first run."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    out["sim_wall_runs_s"] = [r["sim_wall_s"] for r in runs]
    out["sim_wall_min_s"] = min(out["sim_wall_runs_s"])
    return out


# ---------------------------------------------------------------- context
def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024**2
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import loom
    from loom.run import git_commit

    commit = git_commit()
    dirty = None
    if commit:
        proc = subprocess.run(["git", "-C", str(HERE.parent), "status", "--porcelain", "--", "loom"],
                              capture_output=True, text=True, check=False)
        dirty = bool(proc.stdout.strip()) if proc.returncode == 0 else None
    return {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "memory_gib": round(mem_gib, 1) if mem_gib else None,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "loom": loom.__version__,
        "git_commit": (commit[:12] + ("+uncommitted changes in loom/" if dirty else "")) if commit else None,
    }


def recorded_philly() -> dict:
    """Philly's row of the Acme cluster summary (Hu et al., NSDI'24)."""
    import polars as pl

    from loom.paths import shared_traces_dir

    path = shared_traces_dir() / "acme" / "cluster_summary.csv"
    row = pl.read_csv(path).filter(pl.col("id") == "Philly")
    if row.height != 1:
        raise SystemExit(f"no Philly row in {path}")
    rec = row.row(0, named=True)
    return {"source": str(path), **{k: rec[k] for k in (
        "gpu_job_num", "avg_que_time_gpu", "med_que_time_gpu", "avg_run_time_gpu", "med_run_time_gpu")}}


# ---------------------------------------------------------------- tables
def md_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def secs(x: float) -> str:
    return f"{x:,.1f}"


# ------------------------------------------------------- the README's main command
MAIN_COMMAND = ["simulate", "--trace", "philly", "--cluster", "philly", "--policy", "fcfs", "--placer", "best-fit",
                "--out", "runs/philly-fcfs"]
TIMING_KEYS = ("load_s", "sim_s", "records_s", "report_s", "total_s")
FLOOR = {"wall_s": 5.0, "peak_rss_mib": 400.0, "report_s": 2.0, "report_mb": 3.0}  # issue 17 "Numbers"


def loom_executable() -> list[str]:
    """`loom` as the README runs it: the first on PATH (e.g. a pyenv shim), else the console script
    beside this interpreter, else `python -m loom.cli.main`."""
    import shutil

    found = shutil.which("loom")
    if found:
        return [found]
    beside = Path(sys.executable).with_name("loom")
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "loom.cli.main"]


def run_main_command(workdir: Path, extra: list[str]) -> dict:
    """One run of the README command in `workdir` (fresh): wall time and peak RSS of the whole
    process, the manifest's phase timings, report.html's size."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = loom_executable() + MAIN_COMMAND + ["--force"] + extra
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    proc.stderr and proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.stderr.write(stderr)
        raise SystemExit(f"`{shlex.join(cmd)}` failed with exit code {code}")
    out = workdir / "runs" / "philly-fcfs"
    timing = json.loads((out / "manifest.json").read_text()).get("timing") or {}
    report = out / "report.html"
    rss = usage.ru_maxrss / (1024 * 1024) if sys.platform == "darwin" else usage.ru_maxrss / 1024
    row = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": rss,
           "report_mb": report.stat().st_size / 1e6 if report.is_file() else None,
           **{k: timing.get(k) for k in TIMING_KEYS}}
    row["outside_s"] = wall - row["total_s"] if row["total_s"] is not None else None
    return row


def main_command(args: argparse.Namespace, command: str) -> int:
    import tempfile

    extra = ["--no-report"] if args.no_report else []
    info = machine_info()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="loom-main-command-") as tmp:
        for i in range(max(1, args.runs)):
            print(f"[{i + 1}/{args.runs}] loom {shlex.join(MAIN_COMMAND + ['--force'] + extra)} ...",
                  file=sys.stderr, flush=True)
            runs.append(run_main_command(Path(tmp) / f"run{i}", extra))

    def cell(value: float | None, fmt: str) -> str:
        return "–" if value is None else format(value, fmt)

    cols = [("wall_s", "whole command s", ".2f"), ("cpu_s", "CPU s", ".2f"),
            ("peak_rss_mib", "peak RSS MiB", ",.0f"), ("load_s", "load s", ".2f"), ("sim_s", "loop s", ".2f"),
            ("records_s", "records s", ".2f"), ("report_s", "report s", ".2f"),
            ("outside_s", "start, imports, CLI, exit s", ".2f"), ("report_mb", "report.html MB", ".2f")]
    rows = [[str(i + 1)] + [cell(r[k], f) for k, _, f in cols] for i, r in enumerate(runs)]
    med, low = {}, {}
    for key, _, _ in cols:
        values = [r[key] for r in runs if r[key] is not None]
        med[key] = statistics.median(values) if values else None
        low[key] = min(values) if values else None
    rows.append(["**median**"] + [cell(med[k], f) for k, _, f in cols])
    rows.append(["min"] + [cell(low[k], f) for k, _, f in cols])

    def verdict(key: str) -> str:
        value = med[key]
        if value is None:
            return "–"
        return f"{'met' if value <= FLOOR[key] else '**not met**'} ({value:.2f} vs ≤ {FLOOR[key]:g})"

    machine = (f"Machine: {info['cpu']}, {info['cores']} cores ({info['cores_usable']} usable), "
               f"{info['memory_gib']} GiB RAM; {info['platform']}; {info['python']}  ")
    runs_line = (f"Loom {info['loom']} (commit {info['git_commit']}), {info['date_utc']}; each run: "
                 f"`loom {shlex.join(MAIN_COMMAND + ['--force'] + extra)}` in a fresh process and directory "
                 f"(`loom` = {shlex.join(loom_executable())}), "
                 f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '(unset)')}.\n")
    legend = ("*whole command* = the process's wall time (interpreter start to exit); *peak RSS* = its "
              "`ru_maxrss`; *load*, *loop*, *records*, *report* = the phases the run records in "
              "`manifest.json` → `timing` (cluster + trace + `Simulation`; the event loop; summary, sanity "
              "checks, `jobs.parquet`, `decisions.jsonl`, manifest; `report.html`); the rest is interpreter "
              "start, imports, the CLI (config, table) and exit.\n")
    floor = ("Issue 17 floor (medians): whole command " + verdict("wall_s") + "; peak RSS " + verdict("peak_rss_mib")
             + ("" if args.no_report else "; report after the simulation " + verdict("report_s")
                + "; report.html MB " + verdict("report_mb")) + ".")
    out = ["## The README main command\n", f"Command: `{command}`  ", machine, runs_line,
           md_table(["run"] + [label for _, label, _ in cols], rows), "", legend, floor]
    text = "\n".join(out)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "machine": info, "runs": runs, "median": med,
                                               "min": low, "floor": FLOOR, "markdown": text}, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Loom simulator benchmark on the Philly trace.")
    ap.add_argument("--policies", default="fcfs,easy,sjf", help="policies for the full-trace comparison")
    ap.add_argument("--sizes", default=f"10000,50000,{FULL_TRACE_JOBS}", help="trace prefixes for the scaling run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (median reported)")
    ap.add_argument("--placer", default="best-fit")
    ap.add_argument("--json", default=None, help="write all measurements to this JSON file")
    ap.add_argument("--no-decision-log", action="store_true",
                    help="do not keep the in-memory decision log (loom simulate keeps it by default)")
    ap.add_argument("--main-command", action="store_true",
                    help="time the README's main command (loom simulate … --out runs/philly-fcfs) as a user "
                         "runs it: whole process wall time, peak RSS, phases, report size")
    ap.add_argument("--runs", type=int, default=5, help="with --main-command: how many runs (median, min)")
    ap.add_argument("--no-report", action="store_true", help="with --main-command: add --no-report")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    command = "python bench/sim_philly.py" + ("" if not (argv or sys.argv[1:]) else
                                              " " + shlex.join(argv if argv is not None else sys.argv[1:]))
    if args.main_command:
        return main_command(args, command)

    sizes = sorted({min(int(s), FULL_TRACE_JOBS) for s in args.sizes.split(",") if s.strip()})
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    repeat = max(1, args.repeat)
    log = not args.no_decision_log
    info = machine_info()
    recorded = recorded_philly()

    def spec(kind: str, n: int | None, policy: str = "fcfs") -> dict:
        limit = None if n is None or n >= FULL_TRACE_JOBS else n
        return {"kind": kind, "limit": limit, "policy": policy, "placer": args.placer, "decision_log": log}

    def note(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    # Repeats are the outer loop so that slow drift in machine load spreads over all measurements.
    started = time.perf_counter()
    loom_runs: dict[tuple[str, int | None], list[dict]] = {}
    bare_runs: dict[int, list[dict]] = {}
    for rep in range(repeat):
        for n in sizes:
            note(f"[{rep + 1}/{repeat}] fcfs + {args.placer}, {n:,} jobs ...")
            loom_runs.setdefault(("fcfs", n), []).append(measure(spec("loom", n)))
            note(f"[{rep + 1}/{repeat}] bare fcfs, {n:,} jobs ...")
            bare_runs.setdefault(n, []).append(measure(spec("bare", n)))
        for policy in policies:
            if (policy, FULL_TRACE_JOBS) in loom_runs and FULL_TRACE_JOBS in sizes:
                continue  # already measured in the scaling run
            note(f"[{rep + 1}/{repeat}] {policy} + {args.placer}, full trace ...")
            loom_runs.setdefault((policy, None), []).append(measure(spec("loom", None, policy)))
    total = time.perf_counter() - started

    loom_med = {k: median_of(v) for k, v in loom_runs.items()}
    bare_med = {k: median_of(v) for k, v in bare_runs.items()}

    def full(policy: str) -> dict:
        return loom_med.get((policy, FULL_TRACE_JOBS)) or loom_med[(policy, None)]

    # ------------------------------------------------------------ report
    out: list[str] = []
    out.append("## Simulator benchmark: Philly trace\n")
    out.append(f"Command: `{command}`  ")
    out.append(f"Machine: {info['cpu']}, {info['cores']} cores ({info['cores_usable']} usable), "
               f"{info['memory_gib']} GiB RAM; {info['platform']}; {info['python']}  ")
    out.append(f"Loom {info['loom']} (commit {info['git_commit']}), {info['date_utc']}; "
               f"trace `rfold_philly_trace.csv`, cluster `philly` (552 nodes, 2,490 GPUs); "
               f"decision log {'on' if log else 'off'}; median of {repeat} run(s), each in a fresh process.\n")

    out.append(f"### Engine scaling: FCFS + {args.placer}\n")
    base_n = sizes[0]
    base = loom_med[("fcfs", base_n)]
    base_cost = base["sim_wall_s"] / (base_n * math.log(base_n))
    def paired_ratio(n: int) -> float:
        """Median over repeats of loom/bare, each pair measured back to back."""
        return statistics.median(lo["sim_wall_s"] / ba["sim_wall_s"]
                                 for lo, ba in zip(loom_runs[("fcfs", n)], bare_runs[n]))

    rows = []
    for n in sizes:
        m, b = loom_med[("fcfs", n)], bare_med[n]
        jobs = m["jobs"]
        norm = (m["sim_wall_s"] / (jobs * math.log(jobs))) / base_cost
        rows.append([
            f"{jobs:,}", f"{m['events']:,.0f}", f"{m['setup_s']:.2f}",
            f"{m['sim_wall_s']:.2f} ({m['sim_wall_min_s']:.2f})", f"{m['events'] / m['sim_wall_s']:,.0f}", f"{1e6 * m['sim_wall_s'] / jobs:.1f}",
            f"{m['peak_rss_mib']:,.0f} (+{m['peak_rss_mib'] - m['base_rss_mib']:,.0f})",
            f"{norm:.2f}", f"{b['sim_wall_s']:.3f} ({b['sim_wall_min_s']:.3f})", f"{paired_ratio(n):.1f}×",
        ])
    out.append(md_table(["jobs", "events", "setup s", "sim wall s (min)", "events/s", "µs/job",
                         "peak RSS MiB (over imports)", f"wall/(n log n) vs {base_n:,}",
                         "bare loop s (min)", "loom / bare"], rows))
    out.append("")
    out.append("*setup* = cluster + trace load + `Simulation` construction; *sim wall* = "
               "`SimulationResult.sim_wall_s` (event loop only); *bare* = `bench/bare_fcfs.py`, the same "
               "FCFS + best-fit as a plain Python loop (trace loading excluded); *loom / bare* = median over "
               "repeats of the ratio of the two loop times measured back to back. Times are medians, minimum in "
               "parentheses. A normalised wall/(n log n) of at most about 1 means cost grows no faster than n log n.\n")

    rows = []
    for n in sizes:
        m, b = loom_med[("fcfs", n)], bare_med[n]
        agree = all(abs(m[k] - b[k]) <= 1e-6 * max(1.0, abs(m[k])) for k in ("avg_queue_s", "p99_queue_s"))
        rows.append([f"{m['jobs']:,}", f"{m['avg_queue_s']:.2f}", f"{b['avg_queue_s']:.2f}",
                     f"{m['p99_queue_s']:.1f}", f"{b['p99_queue_s']:.1f}",
                     f"{m['gpu_utilization']:.4f}", f"{b['gpu_utilization']:.4f}", "yes" if agree else "**no**"])
    out.append("Sanity check, Loom FCFS vs the bare loop:\n")
    out.append(md_table(["jobs", "avg queue s (loom)", "avg queue s (bare)", "p99 queue s (loom)",
                         "p99 queue s (bare)", "util (loom)", "util (bare)", "agree"], rows))
    out.append("")

    out.append(f"### Policies on the full trace ({args.placer})\n")
    res = {p: full(p) for p in policies}
    header = ["metric"] + policies + ["Philly recorded"]
    rows = [
        ["avg queueing delay (s)"] + [secs(res[p]["avg_queue_s"]) for p in policies]
        + [secs(recorded["avg_que_time_gpu"])],
        ["p50 queueing delay (s)"] + [secs(res[p]["p50_queue_s"]) for p in policies]
        + [secs(recorded["med_que_time_gpu"])],
        ["p99 queueing delay (s)"] + [secs(res[p]["p99_queue_s"]) for p in policies] + ["–"],
        ["avg JCT (s)"] + [secs(res[p]["avg_jct_s"]) for p in policies] + ["–"],
        ["GPU utilisation"] + [f"{res[p]['gpu_utilization']:.3f}" for p in policies] + ["–"],
        ["finished jobs"] + [f"{res[p]['finished']:,} / {res[p]['jobs']:,}" for p in policies]
        + [f"{recorded['gpu_job_num']:,} GPU jobs"],
        ["sim wall (s), min"] + [f"{res[p]['sim_wall_s']:.2f} ({res[p]['sim_wall_min_s']:.2f})"
                                 for p in policies] + ["–"],
        ["setup (s)"] + [f"{res[p]['setup_s']:.2f}" for p in policies] + ["–"],
        ["events/s"] + [f"{res[p]['events'] / res[p]['sim_wall_s']:,.0f}" for p in policies] + ["–"],
        ["peak RSS (MiB)"] + [f"{res[p]['peak_rss_mib']:,.0f}" for p in policies] + ["–"],
    ]
    out.append(md_table(header, rows))
    out.append("")
    out.append(f"*Philly recorded*: `avg_que_time_gpu` / `med_que_time_gpu` of the Philly row of "
               f"`acme/cluster_summary.csv` ({recorded['gpu_job_num']:,} GPU jobs incl. failed and "
               f"cancelled, scheduled by the real cluster with its virtual clusters, locality rules and "
               f"failures). The simulation replays the 111,549-job RFold list on all 552 servers as one "
               f"pool with none of those, so the recorded figures are context, not a target. Queueing "
               f"delay counts every started job; JCT only finished ones.\n")
    out.append(f"Total benchmark time: {total:.0f} s.")
    text = "\n".join(out)
    print(text)

    if args.json:
        payload = {
            "command": command, "machine": info, "recorded_philly": recorded, "repeat": repeat,
            "decision_log": log, "placer": args.placer,
            "scaling": [{"jobs": loom_med[("fcfs", n)]["jobs"], "loom": loom_med[("fcfs", n)],
                         "bare": bare_med[n],
                         "loom_over_bare": paired_ratio(n)}
                        for n in sizes],
            "policies": {p: res[p] for p in policies},
            "raw": {"loom": {f"{k[0]}:{k[1]}": v for k, v in loom_runs.items()},
                    "bare": {str(k): v for k, v in bare_runs.items()}},
            "markdown": text,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        note(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
