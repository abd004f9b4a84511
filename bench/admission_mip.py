"""Arena's Gavel admission MIP three ways, on the instances a `gavel-arena` run poses.

Runs `gavel-arena` over the arena-philly jobs Arena submits in `--rounds` 300-s rounds (as
`bench/arena_side_by_side.py` does) with each admission solved by:

* `cp-sat`: OR-Tools CP-SAT on every instance (`search_nodes=0`);
* `search`: the exact move search (`loom.policies.move_search`), proofs not reused;
* `search+proofs`: the default — the search, and `NoGainProofs` answering what it can.

and reports wall time, time inside the MIP, how many instances each way answered. Then every
instance of the default run is solved again by CP-SAT alone and the optimum compared (value,
type changes): they must agree.

    PYTHONPATH=. python bench/admission_mip.py [--rounds 2000] [--speed-model arena-profile --arena-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from arena_side_by_side import StopAt, _HorizonReached, arena_subset, make_speed

from loom.core.protocols import PLACERS
from loom.hardware.clusters import load_cluster
from loom.policies.gavel_arena import GavelArena
from loom.sim.engine import Simulation
from loom.workload.loaders import load_trace


class Recording(GavelArena):
    """gavel-arena that records each admission MIP it poses and the time spent solving."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.instances: list[tuple] = []
        self.mip_s = 0.0

    def _solve(self, rows, sizes, prev, caps):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        choice = super()._solve(rows, sizes, prev, caps)
        self.mip_s += time.perf_counter() - start
        self.instances.append(((list(rows), list(sizes), list(prev), list(caps)), choice))
        return choice


def run(mode: str, specs: list, horizon: float | None, speed: Any) -> tuple[Recording, float, int]:
    policy = Recording(search_nodes=0) if mode == "cp-sat" else Recording()
    if mode == "search":
        policy.proofs._settled = lambda *a: None  # type: ignore[method-assign]
    sim = Simulation(load_cluster("arena-1280"), specs, StopAt(policy, horizon) if horizon else policy,
                     PLACERS.get("best-fit")(), speed, log_decisions=False)
    start = time.perf_counter()
    try:
        sim.run()
    except _HorizonReached:
        pass
    wall = time.perf_counter() - start
    finished = sum(1 for j in sim.jobs if j.end_time is not None and (horizon is None or j.end_time <= horizon))
    return policy, wall, finished


def optimum(instance: tuple, choice: list[int] | None) -> tuple[int, int] | None:
    """(objective, type changes) of an answer, in the MIP's integer units."""
    rows, _, prev, _ = instance
    if choice is None:
        return None
    penalty = sum(max(max(r), 0) for r in rows) + 1
    value = sum(r[c] if r[c] >= 0 else -penalty for r, c in zip(rows, choice))
    return value, sum(c != p for c, p in zip(choice, prev))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--speed-model", choices=["estimator", "arena-profile"], default="estimator")
    ap.add_argument("--arena-dir", type=Path, default=Path("."))
    args = ap.parse_args()
    specs, _, horizon = arena_subset(list(load_trace("arena-philly")), args.rounds)
    print(f"{len(specs)} jobs, {args.rounds} rounds, speed model {args.speed_model}")
    print("| solver | wall s | MIP s | MIPs posed | by search or pre-check | by proofs | by CP-SAT | finished |")
    print("| :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    default = None
    for mode in ("cp-sat", "search", "search+proofs"):
        policy, wall, finished = run(mode, specs, horizon, make_speed(args.speed_model, args.arena_dir))
        searched = len(policy.instances) - policy.proofs.answered - policy.cp_sat_solves
        print(f"| {mode} | {wall:.1f} | {policy.mip_s:.2f} | {len(policy.instances)} | "
              f"{searched if mode != 'cp-sat' else 0} | {policy.proofs.answered} | {policy.cp_sat_solves} | "
              f"{finished} |", flush=True)
        default = policy
    assert default is not None
    disagree = 0
    times: dict[str, list[float]] = {"cp-sat": [], "search": []}
    for inst, choice in default.instances:  # one by one, each solver fresh (no proofs)
        for mode, nodes in (("cp-sat", 0), ("search", 20_000)):
            solver = GavelArena(search_nodes=nodes)
            start = time.perf_counter()
            answer = solver._solve(*inst)
            times[mode].append(time.perf_counter() - start)
            if mode == "cp-sat":
                disagree += optimum(inst, answer) != optimum(inst, choice)
    print(f"\nre-solved the default run's {len(default.instances)} MIPs one by one:")
    for mode, ts in times.items():
        ts.sort()
        print(f"  {mode}: {sum(ts):.2f} s, median {1e3 * ts[len(ts) // 2]:.2f} ms, "
              f"p99 {1e3 * ts[int(0.99 * len(ts))]:.2f} ms")
    print(f"  {disagree} of the run's answers differ from CP-SAT's in (objective, type changes)")
    if disagree:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
