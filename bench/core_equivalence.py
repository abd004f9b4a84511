"""Per-job and per-decision equivalence of this checkout with a previous version.

    python bench/core_equivalence.py [--ref 39ddf71] [--scenarios philly-fcfs,arena-crius,arena-gavel-arena,
        kalos-faults] [--repeat 3] [--limit-jobs N] [--small] [--current ROOT] [--keep] [--json OUT] [--dumps DIR]
    python bench/core_equivalence.py --write-golden tests/data/golden   # the small scenarios, by --ref

Why: the core redesign (job lifecycle, typed backend events, async
acknowledgements) must give identical results with zero launch latency, and
the full Philly FCFS + best-fit loop must not get slower. `--ref` is checked
out in `/tmp/loom-ref-<sha>` (git worktree); every scenario runs with it and
with this checkout, each in a fresh `python` whose `sys.path` starts with that
version's root. Scenarios: `philly-fcfs` (full trace, as `loom simulate`;
`--repeat` alternating runs per version for the loop time), `arena-crius` and
`arena-gavel-arena` (as `bench/arena_policies.py`), `kalos-faults` (as
`bench/reliability.py failures`, async checkpoints, topology replacement, 1
spare per minipod). Compared: each job's final state (PENDING = SUSPENDED),
first start, end time and counters; the decision log in order, without the
Preempts the old engine logged for failures; reasons are dumped, not compared.
Markdown on stdout, progress on stderr, exit code 1 on any difference.
`tests/test_golden_equivalence.py` pins the `SMALL` versions (tests/data/golden).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCENARIOS = ("philly-fcfs", "arena-crius", "arena-gavel-arena", "kalos-faults")
# The small versions pinned by tests/test_golden_equivalence.py: `jobs` = trace prefix, `days` = Kalos
# window, `servers_every` = keep every k-th Philly server (the first jobs barely queue on all 552).
SMALL: dict[str, dict[str, Any]] = {"philly-fcfs": {"jobs": 2500, "servers_every": 2},
                                    "arena-crius": {"jobs": 120}, "arena-gavel-arena": {"jobs": 120},
                                    "kalos-faults": {"days": 5.0}}
FAILURE_PREEMPTS = ("evicted: node", "failed: ")  # old engine's synthetic Preempts for failures
WAITING = ("PENDING", "SUSPENDED")
JOB_FIELDS = ("state", "first_start", "end_time", "preemptions", "migrations", "resizes", "failures", "gpu_seconds")
DECISION_FIELDS = ("time", "type", "id", "nodes", "gpus", "plan", "extra")
REL_TOL, ABS_TOL = 1e-9, 1e-6  # times reach 1e7 s: a 1e-6 relative tolerance would allow 10 s


# ------------------------------------------------------------------ scenarios (both versions)
def build(scenario: str, jobs: int | None = None, days: float = 30.0, servers_every: int = 1) -> Any:
    """The scenario's `Simulation`, through APIs the previous version has too."""
    from loom.core.protocols import PLACERS, POLICIES
    from loom.hardware.clusters import load_cluster
    from loom.paths import shared_traces_dir
    from loom.sim.engine import Simulation
    from loom.workload.loaders import load_trace

    if scenario == "philly-fcfs":
        specs = load_trace("philly")[:jobs]
        if servers_every <= 1:
            return Simulation(load_cluster("philly"), specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")())
        # `philly:PATH` reads a machine list: keep its header and every k-th server
        lines = (shared_traces_dir() / "philly" / "cluster_machine_list").read_text().splitlines()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cluster_machine_list"
            path.write_text("\n".join([lines[0], *lines[1::servers_every]]) + "\n")
            topo = load_cluster(f"philly:{path}")
        return Simulation(topo, specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")())
    if scenario in ("arena-crius", "arena-gavel-arena"):
        from loom.sim.estimator_speed import EstimatorSpeed

        specs = list(load_trace("arena-philly"))[:jobs]
        policy = POLICIES.get(scenario.removeprefix("arena-"))()
        return Simulation(load_cluster("arena-1280"), specs, policy, PLACERS.get("best-fit")(),
                          EstimatorSpeed(iteration_scale=0.2))
    if scenario == "kalos-faults":
        from loom.perf.interruptions import InterruptionCosts, InterruptionModel

        try:
            from loom.sim.recovery import RecoveryConfig
        except ImportError:  # moved by the core redesign
            from loom.core.recovery import RecoveryConfig  # type: ignore[no-redef]
        from loom.workload.faults import load_fault_trace
        from loom.workload.generate import generate
        from loom.workload.job_failures import AcmeFailureModel, sample_failures

        topo = load_cluster("acme-kalos")
        specs = generate("acme-kalos", days, seed=0, scale=1.0, outcomes="would-be")[:jobs]
        start = min(s.submit_time for s in specs)
        faults = load_fault_trace(shared_traces_dir() / "failures_infinitehbd" / "fault_trace.json")
        node_failures = faults.to_cluster(topo, start, start + days * 86400.0, 0).failures
        plans = sample_failures(specs, AcmeFailureModel(infra_rate_per_gpu_hour=0.0), 0)
        return Simulation(topo, specs, POLICIES.get("priority")(), PLACERS.get("topo-aware")(),
                          failures=node_failures, job_failures=plans,
                          interruptions=InterruptionModel(InterruptionCosts(checkpoint_mode="async")),
                          recovery=RecoveryConfig(replacement="topology", spares_per_minipod=1))
    raise SystemExit(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")


def canonical(result: Any) -> dict[str, Any]:
    """Jobs and decisions as JSON-ready lists; reasons kept apart (dumped, never compared)."""
    jobs = {j.job_id: [j.state.name, j.first_start, j.end_time, j.preemptions, j.migrations, j.resizes,
                       j.failures, float(j.gpu_seconds)] for j in result.jobs}
    decisions, reasons = [], []
    for at, d in result.decisions:
        kind, reason = type(d).__name__, getattr(d, "reason", "")
        if kind == "Preempt" and reason.startswith(FAILURE_PREEMPTS):
            continue
        alloc, plan = getattr(d, "allocation", None), getattr(d, "plan", None)
        key = getattr(d, "job_id", getattr(d, "reservation_id", None))
        extra = {k: getattr(d, k) for k in ("pause_s", "until", "for_job", "at") if hasattr(d, k)}
        if hasattr(d, "nodes"):  # Reserve
            extra["nodes"] = list(d.nodes)
        decisions.append([float(at), kind, key, list(alloc.nodes) if alloc else None,
                          list(alloc.gpus) if alloc else None,
                          (plan.describe() if hasattr(plan, "describe") else str(plan)) if plan else None,
                          extra or None])
        reasons.append(reason)
    return {"jobs": jobs, "decisions": decisions, "reasons": reasons}


def run_scenario(scenario: str, **size: Any) -> dict[str, Any]:
    sim = build(scenario, **size)
    cpu = time.process_time()
    result = sim.run()
    cpu = time.process_time() - cpu  # less sensitive than wall time to other processes on a busy machine
    return {**canonical(result), "sim_wall_s": result.sim_wall_s, "sim_cpu_s": cpu, "events": result.events,
            "rounds": result.rounds}


def write_golden(path: Path, meta: dict[str, Any], dump: dict[str, Any]) -> None:
    """A golden file: `meta`, events and rounds (informative), then one job / decision a line;
    no wall time, no reasons."""
    def block(items: list[str], open_: str, close: str) -> str:
        return f"{open_}\n" + ",\n".join(f"  {x}" for x in items) + f"\n{close}"

    compact = {"separators": (",", ":")}
    head = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in
            {**meta, "events": dump["events"], "rounds": dump["rounds"]}.items()]
    jobs = block([f"{json.dumps(j)}: {json.dumps(r, **compact)}" for j, r in dump["jobs"].items()], "{", "}")
    decisions = block([json.dumps(d, **compact) for d in dump["decisions"]], "[", "]")
    path.write_text("{\n" + ",\n".join([*head, f'"jobs": {jobs}', f'"decisions": {decisions}']) + "\n}\n")


# ------------------------------------------------------------------ comparison
def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def _job_row(row: list[Any] | None) -> list[Any] | None:
    return None if row is None else ["WAITING" if row[0] in WAITING else row[0], *row[1:]]


def _at(rows: list[Any], i: int) -> Any:
    return rows[i] if i < len(rows) else None


def compare(prev: dict[str, Any], cur: dict[str, Any]) -> dict[str, Any]:
    """Counts of differing jobs and decisions and the first of each, both sides, labelled."""
    ids = list(prev["jobs"]) + [j for j in cur["jobs"] if j not in prev["jobs"]]
    jobs = [(j, _job_row(prev["jobs"].get(j)), _job_row(cur["jobs"].get(j))) for j in ids]
    bad_jobs = [(j, a, b) for j, a, b in jobs if not same(a, b)]
    n = max(len(prev["decisions"]), len(cur["decisions"]))
    bad = [i for i in range(n) if not same(_at(prev["decisions"], i), _at(cur["decisions"], i))]
    out: dict[str, Any] = {"jobs": len(ids), "jobs_differing": len(bad_jobs), "decisions": n,
                           "decisions_differing": len(bad), "first_job": None, "first_decision": None}
    if bad_jobs:
        j, a, b = bad_jobs[0]
        out["first_job"] = {"job_id": j, **{side: None if r is None else dict(zip(JOB_FIELDS, r))
                                           for side, r in (("previous", a), ("current", b))}}
    if bad:
        i = bad[0]
        out["first_decision"] = {"index": i, **{
            side: None if _at(d["decisions"], i) is None else
            {**dict(zip(DECISION_FIELDS, d["decisions"][i])), "reason": _at(d.get("reasons", []), i)}
            for side, d in (("previous", prev), ("current", cur))}}
    return out


# ------------------------------------------------------------------ driver
def worker(root: str, scenario: str, out: str, size: dict[str, Any]) -> None:
    sys.path.insert(0, root)
    import loom

    here = Path(loom.__file__).resolve()
    print(f"  loom from {here}", file=sys.stderr, flush=True)
    if not here.is_relative_to(Path(root).resolve()):
        raise SystemExit(f"loom imported from {here}, not under {root}")
    dump = run_scenario(scenario, **size)
    Path(out).write_text(json.dumps({**dump, "loom_file": str(here)}))


def run_worker(root: Path, scenario: str, size: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    try:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", scenario, "--out", out,
               "--root", str(root), "--size", json.dumps(size)]
        proc = subprocess.run(cmd, env={**env, "PYTHONPATH": str(root)}, cwd=str(root), check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{scenario} with {root} failed with exit code {proc.returncode}")
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def worktree(ref: str) -> tuple[Path, bool]:
    """/tmp/loom-ref-<sha> at `ref` (reused if present); True if created here."""
    def git(*cmd: str, at: Path = REPO) -> str:
        return subprocess.run(["git", "-C", str(at), *cmd], capture_output=True, text=True, check=True).stdout.strip()

    sha = git("rev-parse", "--short", f"{ref}^{{commit}}")
    path = Path(f"/tmp/loom-ref-{sha}")
    if path.exists():
        if git("rev-parse", "HEAD", at=path) != git("rev-parse", sha):
            raise SystemExit(f"{path} exists but is not at {sha}")
        return path, False
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), sha], check=True,
                   stdout=sys.stderr)
    return path, True


def _first(c: dict[str, Any]) -> str:
    """The first differing job and decision, differing fields only, as `field: previous → current`."""
    def short(x: Any) -> str:
        text = json.dumps(x, separators=(",", ":"))
        return text if len(text) <= 60 else text[:57] + "..."

    parts = []
    for key, name in (("first_job", "job_id"), ("first_decision", "index")):
        if c[key]:
            a, b = c[key]["previous"], c[key]["current"]
            fields = ("missing in previous" if a is None else "missing in current" if b is None else "; ".join(
                f"{k}: {short(a[k])} → {short(b[k])}" for k in a if k != "reason" and not same(a[k], b[k])))
            parts.append(f"{key.removeprefix('first_')} {c[key][name]}: {fields}")
    return "<br>".join(parts).replace("|", "\\|") or "—"


def _differs(c: dict[str, Any]) -> bool:
    return bool(c["jobs_differing"] or c["decisions_differing"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="39ddf71", help="the previous version (any git revision)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--repeat", type=int, default=3, help="philly-fcfs runs per version (median wall time)")
    ap.add_argument("--limit-jobs", type=int, default=None, help="only the first N jobs of each trace")
    ap.add_argument("--small", action="store_true", help="the small versions pinned by the golden test")
    ap.add_argument("--current", default=str(REPO), help="root of the current version (default: this checkout)")
    ap.add_argument("--keep", action="store_true", help="keep the worktree of --ref")
    ap.add_argument("--json", default=None, help="write the comparisons and wall times to this file")
    ap.add_argument("--dumps", default=None, metavar="DIR", help="write each side's dump (with reasons) to DIR")
    ap.add_argument("--write-golden", default=None, metavar="DIR",
                    help="write the small scenarios' dumps by --ref to DIR/<scenario>.json and stop")
    for hidden in ("--worker", "--out", "--root", "--size"):
        ap.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.root, args.worker, args.out, json.loads(args.size or "{}"))
        return 0

    def note(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from loom.paths import shared_traces_dir

    env = {**os.environ, "LOOM_TRACES": str(shared_traces_dir())}
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if set(scenarios) - set(SCENARIOS):
        raise SystemExit(f"unknown scenario(s) in {args.scenarios!r} (known: {', '.join(SCENARIOS)})")
    ref_root, created = worktree(args.ref)
    roots = {"previous": ref_root, "current": Path(args.current).resolve()}
    rows, report = [], {}
    try:
        for scenario in scenarios:
            if args.write_golden:
                note(f"golden {scenario} {SMALL[scenario]} with {ref_root} ...")
                dump = run_worker(ref_root, scenario, SMALL[scenario], env)
                path = Path(args.write_golden) / f"{scenario}.json"
                meta = {"scenario": scenario, "ref": ref_root.name.removeprefix("loom-ref-"), "size": SMALL[scenario]}
                write_golden(path, meta, dump)
                note(f"  wrote {path} ({path.stat().st_size:,} bytes, loop {dump['sim_wall_s']:.2f} s)")
                continue
            size = {**(SMALL[scenario] if args.small else {}), **({"jobs": args.limit_jobs} if args.limit_jobs else {})}
            runs: dict[str, list[dict[str, Any]]] = {"previous": [], "current": []}
            for rep in range(max(1, args.repeat) if scenario == "philly-fcfs" else 1):
                for side, root in roots.items():  # alternating, so that drift in machine load hits both
                    note(f"[{rep + 1}] {scenario} {size or ''} with {side} ({root}) ...")
                    runs[side].append(run_worker(root, scenario, size, env))
                    note(f"  {runs[side][-1]['sim_wall_s']:.2f} s loop, {runs[side][-1]['events']:,} events")
            for side, rs in runs.items() if args.dumps else ():
                Path(args.dumps).mkdir(parents=True, exist_ok=True)
                (Path(args.dumps) / f"{scenario}.{side}.json").write_text(json.dumps(rs[0]))
            walls = {side: [r["sim_wall_s"] for r in rs] for side, rs in runs.items()}
            cpus = {side: [r["sim_cpu_s"] for r in rs] for side, rs in runs.items()}
            med = {side: statistics.median(w) for side, w in walls.items()}
            cpu = statistics.median(cpus["current"]) / statistics.median(cpus["previous"])
            c = compare(runs["previous"][0], runs["current"][0])
            c.update(size=size, wall_s=walls, cpu_s=cpus, events={s: rs[0]["events"] for s, rs in runs.items()},
                     rounds={s: rs[0]["rounds"] for s, rs in runs.items()},
                     # nondeterminism: repeats of one version that disagree with its first run
                     run_to_run_differing={s: sum(_differs(compare(rs[0], r)) for r in rs[1:])
                                           for s, rs in runs.items()})
            report[scenario] = c
            low = {side: min(w) for side, w in walls.items()}
            rows.append([scenario, f"{c['jobs']:,}", f"{c['jobs_differing']:,}", f"{c['decisions']:,}",
                         f"{c['decisions_differing']:,}", _first(c), *(f"{med[s]:.2f} ({low[s]:.2f})" for s in roots),
                         f"{med['current'] / med['previous']:.3f} ({low['current'] / low['previous']:.3f})",
                         f"{cpu:.3f}"])
    finally:
        if created and not args.keep:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(ref_root)], check=False)
    if args.write_golden:
        return 0
    header = ["scenario", "jobs", "jobs differing", "decisions", "decisions differing", "first difference",
              "loop s previous (min)", "loop s current (min)", "current / previous (of mins)", "CPU ratio"]
    command = "python bench/core_equivalence.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    lines = [f"Command: `{command.strip()}`  ",
             (f"previous = {args.ref} ({ref_root}), current = {roots['current']}; loop s = `sim_wall_s`, median "
              f"(min) of {max(1, args.repeat)} runs per version for philly-fcfs, 1 run otherwise; CPU ratio = "
              "ratio of the loop's median process CPU time (robust to a busy machine).\n"),
             "| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * 4 + [":---"] + ["---:"] * 4) + "|",
             *("| " + " | ".join(r) + " |" for r in rows)]
    nondet = {s: c["run_to_run_differing"] for s, c in report.items() if any(c["run_to_run_differing"].values())}
    if nondet:
        lines.append(f"\n**Not deterministic run to run** (repeats differing from the first run): {nondet}")
    text = "\n".join(lines)
    print(text)
    if args.json:
        payload = {"command": command, "scenarios": report, "markdown": text}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        note(f"wrote {args.json}")
    return 1 if any(_differs(c) for c in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
