"""Loom and the Crius/Arena authors' simulator side by side on arena-philly (issue 7).

    PYTHONPATH=. python bench/arena_side_by_side.py --arena-dir /work/arena \\
        --python /work/arena-venv/bin/python --policies fcfs,crius,sia,gavel,elasticflow \\
        --rounds 2000 --speed-model arena-profile [--repeat 3] [--plan-cache DIR] --out /work/arena-side-by-side

Arena's source stays outside the repository: a checkout of ``sjtu-epcc/arena``
(branch ``ae-eurosys``) at ``--arena-dir`` and a venv for it at ``--python``.

For each policy: Arena's ``simulator.py`` runs as a timed subprocess (its stdout
goes to ``OUT/arena-POLICY.log``, its .npy files under ``OUT/arena-POLICY/``),
then Loom runs on the same jobs as a timed subprocess of this script
(``--worker``: imports, trace, speed model, simulation), ``--repeat`` times
each, alternating (Arena, Loom, Arena, Loom, ...). ``OUT/POLICY.json`` is
written as soon as a policy is done (a rerun with ``--resume`` loads it instead
of running again, ``--reuse-arena`` reruns only Loom); the markdown table, with
the date, the command and the machine above it, is printed and written to
``OUT/table.md``.

Two speed ratios, both Arena's time over Loom's, on the same jobs and window,
measured in the same invocation (medians over ``--repeat``):

* *process / process*: Arena's whole ``simulator.py`` process against Loom's
  whole worker process (interpreter start, imports, trace and profile-database
  load, simulation) — what a user waits for on each side;
* *process / loop*: Arena's whole process against Loom's simulation alone
  (``Simulation`` construction and run, timed inside the worker) — Arena's
  start-up is in its figure, Loom's is not, so this ratio flatters Loom.
Arena's source is never copied into Loom; it needs its own venv (numpy<2,
pandas<2, cvxpy<1.5, scipy<1.14, statsmodels, matplotlib<3.9, orjson, cvxopt,
cplex). Arena's crius and sia take over an hour each for 2,000 rounds.

Arena (``sjtu-epcc/arena``, branch ``ae-eurosys``), as its artifact runs it
--------------------------------------------------------------------------
* Flags: ``--trace_type=philly --enable_alpa``; crius adds ``--sched_with_opt``;
  Loom's ``elasticflow`` maps to ``elasticflow-l`` (the paper's ElasticFlow-LS:
  deadline 1e9 s, every job admitted); Loom's ``gavel-arena`` (Arena's Gavel
  rebuilt) and ``gavel`` (the paper's) both run beside Arena's gavel.
* Rounds of 300 s from t0 = first submission. Round k (clock t0 + 300k)
  advances running jobs over the last interval, ends those that ran out, then
  submits the jobs with submission time in (t0 + 300k, t0 + 300(k+1)] — up to
  300 s early — with their submission time reset to the round clock.
  Trace iterations are divided by 5. A job (re)scheduled pays 10 s/GPU capped
  at 40 s (crius) or 150 s/GPU capped at 600 s (baselines).
* ``--max_sched_round=N`` stops the simulation after round N-1: it cuts both
  arrivals (jobs submitted after t0 + 300N never arrive) and the end (jobs
  still running or pending are unfinished). ``--runout`` (used for
  ``--rounds 0``) runs until every job of the trace has ended.
* Output: ``jct/P_jct.npy`` (JCT = end round clock - submission round clock,
  a multiple of 300 s; finished jobs only, in end order),
  ``queuing_time/P_queuing_time.npy`` (finished then unfinished jobs: its
  length = jobs submitted), ``thr/P_thr.npy`` (cluster throughput per round),
  ``resched_num``, ``sched_overhead`` (pickled dicts). Makespan is not written;
  here it is 300 s × the round of the last job end, parsed from the log
  ("completed and ended" lines under each round header).
* Wall time: the whole subprocess, including about 5 s of start-up (imports,
  profile database, trace) that a 1-round run also takes. Median of
  ``--repeat`` runs (each run's time in the JSON).
* Average JCT = mean over finished jobs only. Its plotter's "reduction ratio"
  pads each baseline's list with the largest JCT of any policy up to crius's
  finished count; the table shows that ("padded") next to finished-only.

Loom
----
* ``loom.workload.loaders.load_trace("arena-philly")`` (the same CSV),
  cluster ``arena-1280``, ``best-fit`` placer, policy defaults from
  ``POLICIES``, decision log off. Speed: ``arena-profile`` (Arena's
  ``prof_database.pkl``, best plan per GPU count, estimator fallback) or
  ``estimator``; both with iteration_scale 0.2 (Arena's /5).
* Event-driven: exact submission and end times (no 300-s rounding), resize
  costs of each Loom policy, not Arena's reconfiguration table. Like
  elasticflow-l, Loom's elasticflow gets deadlines of submission + 1e9 s.
* Wall time, two figures per run, each the median of ``--repeat`` fresh
  worker processes: *process* = the whole worker subprocess, timed from here
  (Python start, imports, trace, profile database, subset, simulation, JSON
  out); *loop* = `Simulation` construction (speed preparation) and run, timed
  inside the worker after the trace and profile database are loaded. Cold: no
  plan cache, every estimator plan search runs. With ``--plan-cache DIR`` Loom also
  runs twice with a plan cache (`loom.perf.plan_cache`, DIR/POLICY.sqlite,
  emptied first): the first run fills it, the second ("warm", same job times
  or the script stops) reads the searches' answers — as Arena reads its
  precomputed profile database.
* For ``--rounds N``, Loom simulates the jobs Arena submits (submission
  <= t0 + 300N) and stops at its first scheduling round after t0 + 300(N-1),
  Arena's last end check (`StopAt`), so both simulate the same span of time;
  finished / average JCT / makespan count the jobs that ended by then.
  ``--loom-full`` runs the subset to completion instead (same cut figures,
  plus all-jobs ones in the JSON's ``loom.all``; wall time then covers more
  simulated time than Arena's). ``--rounds 0``: the whole trace, no cut.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from loom.core.jobs import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.clusters import load_cluster
from loom.report.metrics import summary
from loom.sim.engine import Simulation
from loom.workload.job import JobSpec
from loom.workload.loaders import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchinfo import machine

ROUND_S = 300.0
LOOSE_DEADLINE_S = 1e9  # Arena's LOOSEN_DEADLINE for elasticflow-l
ARENA_FLAGS: dict[str, list[str]] = {
    "fcfs": ["--policy=fcfs"],
    "crius": ["--policy=crius", "--sched_with_opt"],
    "gavel": ["--policy=gavel"],
    "gavel-arena": ["--policy=gavel"],  # Loom's rebuild of Arena's Gavel, against Arena's own
    "sia": ["--policy=sia"],
    "sia-arena": ["--policy=sia"],  # Loom's rebuild of Arena's Sia, against Arena's own
    "elasticflow": ["--policy=elasticflow-l"],
}
_ROUND = re.compile(r"Event-stream scheduling round:\s+(\d+)")
_ENDED = re.compile(r"completed and ended: \[(.*)\]")


def arena_subset(specs: list[JobSpec], rounds: int) -> tuple[list[JobSpec], float, float | None]:
    """(jobs Arena submits within `rounds` rounds, t0, last end-check time); rounds 0 = all, no horizon."""
    t0 = min(s.submit_time for s in specs)
    if rounds <= 0:
        return list(specs), t0, None
    subset = [s for s in specs if s.submit_time <= t0 + ROUND_S * rounds]
    return subset, t0, t0 + ROUND_S * (rounds - 1)


def parse_arena_log(log: Path) -> list[tuple[int, str]]:
    """(round, job alias) for every job end in an Arena simulator log."""
    ends: list[tuple[int, str]] = []
    current = -1
    with log.open(errors="replace") as fh:
        for line in fh:
            if (m := _ROUND.search(line)) is not None:
                current = int(m.group(1))
            elif (m := _ENDED.search(line)) is not None and m.group(1).strip():
                ends.extend((current, a.strip().strip("'\"")) for a in m.group(1).split(","))
    return ends


def run_arena(policy: str, arena_dir: Path, python: str, rounds: int, out: Path,
              timeout: float | None) -> dict[str, Any]:
    flags = ARENA_FLAGS[policy]
    name = flags[0].split("=", 1)[1]
    result_dir, log = out / f"arena-{policy}", out / f"arena-{policy}.log"
    cut = ["--runout"] if rounds <= 0 else [f"--max_sched_round={rounds}"]
    cmd = [python, "simulator.py", *flags, "--trace_type=philly", "--enable_alpa", *cut,
           f"--result_dir={result_dir}"]
    start = time.perf_counter()
    try:
        with log.open("w") as fh:
            proc = subprocess.run(cmd, check=False, cwd=arena_dir, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout)
    except subprocess.TimeoutExpired:
        with log.open(errors="replace") as fh:
            rounds_run = max((int(m.group(1)) + 1 for m in map(_ROUND.search, fh) if m), default=0)
        return {"status": f"timeout after {timeout:.0f} s (round {rounds_run})", "cmd": cmd,
                "wall_s": time.perf_counter() - start}
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"status": f"exit {proc.returncode} (see {log})", "cmd": cmd, "wall_s": wall}
    jct = np.load(result_dir / "jct" / f"{name}_jct.npy").astype(float)
    submitted = len(np.load(result_dir / "queuing_time" / f"{name}_queuing_time.npy"))
    thr = np.load(result_dir / "thr" / f"{name}_thr.npy")
    ends = parse_arena_log(log)
    return {"status": "ok", "cmd": cmd, "wall_s": wall, "submitted": submitted, "finished": len(jct),
            "avg_jct_s": float(jct.mean()) if len(jct) else None,
            "makespan_s": ROUND_S * max(r for r, _ in ends) if ends else None,
            "rounds": len(thr), "avg_thr": float(np.mean(thr)) if len(thr) else None,
            "jct_s": jct.tolist()}


def make_speed(kind: str, arena_dir: Path) -> Any:
    if kind == "arena-profile":
        from loom.sim.arena_profile import ArenaProfileSpeed
        return ArenaProfileSpeed(str(arena_dir / "database" / "prof_database.pkl"), iteration_scale=0.2)
    from loom.sim.estimator_speed import EstimatorSpeed
    return EstimatorSpeed(iteration_scale=0.2)


class _HorizonReached(Exception):
    pass


class StopAt:
    """Policy wrapper that ends the simulation at its first round after `horizon` (Arena's cut)."""

    def __init__(self, policy: Any, horizon: float) -> None:
        self.policy, self.horizon = policy, horizon

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def schedule(self, ctx: Any) -> Any:
        if ctx.now > self.horizon:
            raise _HorizonReached
        return self.policy.schedule(ctx)


def run_loom(policy: str, specs: list[JobSpec], t0: float, horizon: float | None, speed: Any,
             to_completion: bool) -> dict[str, Any]:
    start = time.perf_counter()
    chosen = POLICIES.get(policy)()
    stop = horizon is not None and not to_completion
    sim = Simulation(load_cluster("arena-1280"), specs, StopAt(chosen, horizon) if stop else chosen,
                     PLACERS.get("best-fit")(), speed, log_decisions=False)
    try:
        result = sim.run()
    except _HorizonReached:
        result = None
    wall = time.perf_counter() - start
    ends = [(j.end_time, j.end_time - j.spec.submit_time) for j in sim.jobs
            if j.state is JobState.FINISHED and (horizon is None or j.end_time <= horizon)]
    jct = [d for _, d in ends]
    out: dict[str, Any] = {
        "status": "ok", "wall_s": wall, "submitted": len(specs), "finished": len(jct),
        "stopped_at_horizon": result is None, "avg_jct_s": float(np.mean(jct)) if jct else None,
        "makespan_s": max(e for e, _ in ends) - t0 if ends else None, "jct_s": jct,
    }
    if result is not None:  # ran to completion: all-jobs figures too
        s = summary(result)
        out["all"] = {k: s[k] for k in ("finished", "unfinished", "rejected", "avg_jct_s", "makespan_s",
                                        "gpu_utilization", "preemptions", "events", "rounds")}
    fallbacks = getattr(speed, "fallbacks", None)
    if fallbacks is not None:
        out["speed_fallbacks"] = len(fallbacks)
    return out


def loom_jobs(policy: str, specs: list[JobSpec]) -> list[JobSpec]:
    """The jobs as Loom runs them: elasticflow gets Arena's elasticflow-l loose deadlines."""
    if policy == "elasticflow":
        return [replace(x, deadline=x.submit_time + LOOSE_DEADLINE_S) for x in specs]
    return specs


def worker(params: dict[str, Any]) -> None:
    """One Loom run in this (fresh) process, as a user would run it: load the trace and the
    speed model, cut Arena's window, simulate; the result as JSON on the last line of stdout."""
    specs, t0, horizon = arena_subset(list(load_trace("arena-philly")), params["rounds"])
    speed = make_speed(params["speed_model"], Path(params["arena_dir"]))
    out = run_loom(params["policy"], loom_jobs(params["policy"], specs), t0, horizon, speed,
                   params["loom_full"])
    print(json.dumps(out), flush=True)


def run_loom_process(policy: str, rounds: int, speed_kind: str, arena_dir: Path,
                     to_completion: bool) -> dict[str, Any]:
    """`worker` in a fresh Python process, timed from outside (`process_wall_s`); its own
    `wall_s` is the simulation alone (construction and run)."""
    params = {"policy": policy, "rounds": rounds, "speed_model": speed_kind, "arena_dir": str(arena_dir),
              "loom_full": to_completion}
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH")) if x)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(params)],
                          check=False, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{policy}: Loom worker failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_wall_s"] = wall
    return out


def repeated(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """The last run with each timing in `keys` replaced by the median over `runs` (all kept as KEY_runs)."""
    out = dict(runs[-1])
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
            out[f"{key}_runs"] = values
    return out


def run_loom_warm(policy: str, specs: list[JobSpec], t0: float, horizon: float | None, speed_kind: str,
                  arena_dir: Path, to_completion: bool, cache: Path) -> dict[str, Any]:
    """Loom twice with a plan cache (`loom.perf.plan_cache`) at `cache` (emptied first): the
    first run fills it, the second is timed warm; both must give the same jobs' times."""
    import os

    from loom.perf.plan_cache import ENV

    cache.unlink(missing_ok=True)
    os.environ[ENV] = str(cache)
    try:
        fill = run_loom(policy, specs, t0, horizon, make_speed(speed_kind, arena_dir), to_completion)
        warm = run_loom(policy, specs, t0, horizon, make_speed(speed_kind, arena_dir), to_completion)
    finally:
        del os.environ[ENV]
    if warm["jct_s"] != fill["jct_s"]:
        raise SystemExit(f"{policy}: a warm plan cache changed the run")
    return {"fill_wall_s": fill["wall_s"], "wall_s": warm["wall_s"], "cache": str(cache), "jct_s": warm["jct_s"]}


def reduction(crius: dict[str, Any], other: dict[str, Any], max_jct: float) -> tuple[float, float] | None:
    """Crius's JCT reduction vs `other`: (finished-only means, Arena's plotter padding with max_jct)."""
    if crius.get("status") != "ok" or other.get("status") != "ok" or not crius["jct_s"] or not other["jct_s"]:
        return None
    c, o = np.mean(crius["jct_s"]), list(other["jct_s"])
    padded = o + [max_jct] * max(0, len(crius["jct_s"]) - len(o))
    return float((np.mean(o) - c) / np.mean(o)), float((np.mean(padded) - c) / np.mean(padded))


def _num(x: float | None, fmt: str = "{:,.0f}") -> str:
    return "—" if x is None else fmt.format(x)


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:,.1f}×"


def table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: per policy, both simulators' results and the two speed ratios (see the module doc)."""
    head = ("| policy | finished Arena | finished Loom | avg JCT Arena s | avg JCT Loom s | makespan Arena s "
            "| makespan Loom s | Arena process s | Loom process s | **Arena / Loom, process / process** "
            "| Loom loop s | Arena / Loom, process / loop | Loom loop warm s | Arena / Loom, process / warm loop "
            "| crius ΔJCT Arena | crius ΔJCT Loom |")
    lines = [head, "| :--- |" + " ---: |" * 15]
    max_jct = {sim: max((max(r[sim]["jct_s"], default=0.0) for r in results.values()
                         if r[sim].get("status") == "ok"), default=0.0) for sim in ("arena", "loom")}
    for policy, r in results.items():
        a, lm = r["arena"], r["loom"]
        cells = [policy]
        for key in ("finished", "avg_jct_s", "makespan_s"):
            for side in (a, lm):
                if side.get("status") != "ok":
                    cells.append(side.get("status", "—") if key == "finished" else "—")
                elif key == "finished":
                    cells.append(f"{side['finished']}/{side['submitted']}")
                else:
                    cells.append(_num(side.get(key)))
        ok = a.get("status") == lm.get("status") == "ok"
        arena_wall = a.get("wall_s") if ok else None
        warm = lm.get("warm") or {}
        cells += [_num(a.get("wall_s"), "{:,.1f}"), _num(lm.get("process_wall_s"), "{:,.1f}"),
                  _ratio(arena_wall, lm.get("process_wall_s")),
                  _num(lm.get("wall_s"), "{:,.1f}"), _ratio(arena_wall, lm.get("wall_s")),
                  _num(warm.get("wall_s"), "{:,.1f}"), _ratio(arena_wall, warm.get("wall_s"))]
        for sim in ("arena", "loom"):
            red = reduction(results["crius"][sim], r[sim], max_jct[sim]) if "crius" in results else None
            cells.append("—" if policy == "crius" or red is None else f"{-100 * red[0]:+.1f}% "
                         f"(padded {-100 * red[1]:+.1f}%)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(json.loads(sys.argv[2]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arena-dir", type=Path, default=Path("/work/arena"))
    p.add_argument("--python", default="/work/arena-venv/bin/python", help="interpreter of Arena's venv")
    p.add_argument("--policies", default="fcfs,crius,sia,gavel,elasticflow")
    p.add_argument("--rounds", type=int, default=2000, help="Arena's --max_sched_round; 0 = whole trace (--runout)")
    p.add_argument("--speed-model", choices=("arena-profile", "estimator"), default="arena-profile")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arena-timeout", type=float, default=0.0, help="seconds per Arena run; 0 = none")
    p.add_argument("--loom-full", action="store_true",
                   help="run Loom's subset to completion instead of stopping at Arena's last round")
    p.add_argument("--plan-cache", type=Path, default=None,
                   help="also time Loom warm: with a plan cache DIR/POLICY.sqlite filled by a first run")
    p.add_argument("--resume", action="store_true", help="reuse OUT/POLICY.json files already written")
    p.add_argument("--reuse-arena", action="store_true", help="rerun only Loom where OUT/POLICY.json has Arena's")
    p.add_argument("--loom-only", action="store_true", help="skip Arena (its columns stay empty)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each side per policy, alternating Arena / Loom; medians reported")
    args = p.parse_args()
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    unknown = [x for x in policies if x not in ARENA_FLAGS]
    if unknown:
        p.error(f"unknown policies {unknown}; known: {', '.join(ARENA_FLAGS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    specs, t0, horizon = arena_subset(list(load_trace("arena-philly")), args.rounds)
    header = (f"Date: {datetime.now(UTC).isoformat(timespec='seconds')}; machine: {machine()}; "
              f"command: `{shlex.join(['python', 'bench/arena_side_by_side.py', *sys.argv[1:]])}`; "
              f"{len(specs)} jobs submitted, t0 {t0:.0f} s, horizon {horizon}; "
              f"{args.repeat} run(s) of each side per policy (medians)")
    print(header, flush=True)
    results: dict[str, dict[str, Any]] = {}
    for policy in policies:
        path = args.out / f"{policy}.json"
        old = json.loads(path.read_text()) if path.is_file() else None
        if old is not None and old["rounds"] != args.rounds:
            old = None  # another cut: never mixed in
        if args.resume and old is not None and old["speed_model"] == args.speed_model:
            results[policy] = old
            continue
        reuse = args.reuse_arena and old is not None and old["arena"].get("status") == "ok"
        fixed = {"status": "not run", "wall_s": None} if args.loom_only else old["arena"] if reuse else None
        arena_runs: list[dict[str, Any]] = []
        loom_runs: list[dict[str, Any]] = []
        for _ in range(max(1, args.repeat)):
            if fixed is None:  # alternate: Arena, then Loom
                arena_runs.append(run_arena(policy, args.arena_dir, args.python, args.rounds, args.out,
                                            args.arena_timeout or None))
                print(f"{policy}: Arena {arena_runs[-1]['status']} in {arena_runs[-1]['wall_s']:.1f} s", flush=True)
                if arena_runs[-1]["status"] != "ok":
                    fixed = arena_runs[-1]  # a failed run is not repeated
            loom_runs.append(run_loom_process(policy, args.rounds, args.speed_model, args.arena_dir, args.loom_full))
            print(f"{policy}: Loom process {loom_runs[-1]['process_wall_s']:.1f} s, "
                  f"loop {loom_runs[-1]['wall_s']:.1f} s", flush=True)
        if any(r["jct_s"] != loom_runs[0]["jct_s"] for r in loom_runs):
            raise SystemExit(f"{policy}: Loom's repeated runs differ")
        arena = fixed if fixed is not None else repeated(arena_runs, ("wall_s",))
        loom = repeated(loom_runs, ("wall_s", "process_wall_s"))
        jobs = loom_jobs(policy, specs)
        if args.plan_cache is not None:
            args.plan_cache.mkdir(parents=True, exist_ok=True)
            loom["warm"] = run_loom_warm(policy, jobs, t0, horizon, args.speed_model, args.arena_dir, args.loom_full,
                                         args.plan_cache / f"{policy}.sqlite")
            if loom["warm"].pop("jct_s") != loom["jct_s"]:
                raise SystemExit(f"{policy}: the run with a plan cache differs from the cold one")
        print(f"{policy}: Loom finished {loom['finished']}/{loom['submitted']} in {loom['wall_s']:.1f} s", flush=True)
        results[policy] = {"policy": policy, "rounds": args.rounds, "speed_model": args.speed_model,
                           "horizon_s": horizon, "t0_s": t0, "arena": arena, "loom": loom}
        path.write_text(json.dumps(results[policy], indent=1))
    md = table(results)
    (args.out / "table.md").write_text(header + "\n\n" + md + "\n")
    print(md)


if __name__ == "__main__":
    main()
