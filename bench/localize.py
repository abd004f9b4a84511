"""Fault localisation on emulated nodes (issue 20): Acme's two-round pairwise test vs all-pairs.

    PYTHONPATH=. python bench/localize.py [--sizes 8,16,32] [--timeout 2] [--tensor-bytes 1048576]
                                          [--trials 30] [--json OUT]

1. Agent start-up, apart from localisation: N agents forked from one hub that imports torch
   once (the default) vs N agents started as separate processes, each importing torch
   (what a launcher starting the agent on a real node does).
2. Time to localise and number of tests at 8, 16 and 32 nodes with one faulty node (n3
   hangs) and two (n3 hangs, n6 returns wrong data), pairwise vs all-pairs (every pair once,
   in round-robin rounds of disjoint pairs). A hung node costs a round about timeout + 0.5 s:
   pairwise pays it twice, all-pairs once per tournament round (n-1 rounds).
3. Accuracy over `--trials` random trials (2..12 nodes, 1..3 faulty, every kind; seed 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from loom.localize import AgentHub, localize, spawn_launcher
from loom.localize.cluster import Cluster
from loom.localize.trials import leftover_processes, run_trials

SCENARIOS = {"1 faulty (n3 hang)": {"n3": "hang"}, "2 faulty (n3 hang, n6 wrong)": {"n3": "hang", "n6": "wrong"}}


def startup(n: int, mode: str) -> dict[str, float]:
    """Seconds to bring up n agents: `fork` (hub start + forks) or `spawn` (n torch imports)."""
    names = tuple(f"n{i}" for i in range(n))
    began = time.monotonic()
    with AgentHub() as hub:
        hub_s = time.monotonic() - began
        with Cluster(names, {}, 2.0, 4096, spawn_launcher if mode == "spawn" else None, hub=hub) as cluster:
            t = time.monotonic()
            cluster.start()
            agents_s = time.monotonic() - t
    return {"hub_s": hub_s, "agents_s": agents_s, "total_s": hub_s + agents_s}


def localisation_rows(sizes: list[int], timeout: float, tensor_bytes: int) -> list[dict[str, Any]]:
    rows = []
    with AgentHub() as hub:
        for n in sizes:
            names = [f"n{i}" for i in range(n)]
            for label, faults in SCENARIOS.items():
                for method in ("pairwise", "all-pairs"):
                    res = localize(names, faults, method=method, timeout_s=timeout, tensor_bytes=tensor_bytes,
                                   hub=hub)
                    row = {"nodes": n, "faults": label, "method": method, "seconds": round(res.seconds, 2),
                           "tests": res.tests, "rounds": len(res.rounds), "startup_s": round(res.startup_seconds, 2),
                           "found": list(res.faulty), "exact": set(res.faulty) == set(faults) and res.conclusive}
                    rows.append(row)
                    print(_line(row), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    return (f"| {row['nodes']} | {row['faults']} | {row['method']} | {row['tests']} | {row['rounds']} | "
            f"{row['seconds']:.2f} | {row['startup_s']:.2f} | {', '.join(row['found'])} | {row['exact']} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,16,32")
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--tensor-bytes", type=int, default=1 << 20)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, metavar="OUT")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from benchinfo import machine

    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"# {machine()}; timeout {args.timeout:g} s, {args.tensor_bytes} B per node\n")
    print("## agent start-up (seconds)\n\n| nodes | mode | hub (torch import) | agents | total |\n|---|---|---|---|---|")
    starts = []
    for n in sizes:
        for mode in ("fork", "spawn"):
            s = startup(n, mode)
            starts.append({"nodes": n, "mode": mode, **{k: round(v, 2) for k, v in s.items()}})
            print(f"| {n} | {mode} | {s['hub_s']:.2f} | {s['agents_s']:.2f} | {s['total_s']:.2f} |", flush=True)
    print("\n## time to localise (agents forked from a warm hub; start-up apart)\n")
    print("| nodes | faults | method | tests | rounds | seconds | agent start-up s | found | exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = localisation_rows(sizes, args.timeout, args.tensor_bytes)
    began = time.monotonic()
    trials = run_trials(args.trials, seed=0, timeout_s=args.timeout, tensor_bytes=1 << 16)
    exact = sum(t.exact for t in trials)
    kinds = sorted({k for t in trials for k in t.trial.faults.values()})
    print(f"\n## accuracy: {exact}/{len(trials)} random trials exact (no miss, no false positive); "
          f"2..12 nodes, kinds {', '.join(kinds)}; {time.monotonic() - began:.1f} s; "
          f"leftover processes: {len(leftover_processes(os.getpid()))}")
    if args.json:
        args.json.write_text(json.dumps({"startup": starts, "localisation": rows, "trials": {
            "count": len(trials), "exact": exact, "seconds": round(time.monotonic() - began, 1),
            "per_trial": [{"nodes": len(t.trial.nodes), "faults": t.trial.faults, "found": list(t.result.faulty),
                           "tests": t.result.tests, "seconds": round(t.result.seconds, 2)} for t in trials]}},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
