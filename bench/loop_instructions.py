"""Instructions executed by the Philly FCFS + best-fit loop, this checkout against a previous version.

    python bench/loop_instructions.py [--ref 39ddf71] [--jobs N]

Why: wall time on a shared 2-core VM varies by 10-25 % from run to run, more
than the differences a redesign of the hot loop makes, so "no slower than
before" is hard to judge from seconds alone. Valgrind's callgrind counts the
CPU instructions a run executes, which is deterministic: the same code on the
same input gives the same count to a few parts per million. Each version runs
the loop (`load_cluster("philly")`, `load_trace("philly")[:N]`, `Simulation(...,
fcfs, best-fit).run()`) once with N jobs and once with 1; the difference is the
loop's count (loading and imports cancel out). Both versions run at the same
time, one per core. Needs `valgrind` (Debian package `valgrind`); about 6 min
for the full trace. Markdown on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchinfo import machine  # noqa: E402
from core_equivalence import REPO, worktree  # noqa: E402

LOOP = """
import sys
from loom.core.protocols import PLACERS, POLICIES
from loom.hardware.clusters import load_cluster
from loom.sim.engine import Simulation
from loom.workload.loaders import load_trace
specs = load_trace("philly")[: int(sys.argv[1])]
Simulation(load_cluster("philly"), specs, POLICIES.get("fcfs")(), PLACERS.get("best-fit")()).run()
"""


def instructions(root: Path, jobs: int, env: dict[str, str]) -> int:
    """Instructions (callgrind's Ir) of one run of the loop with `jobs` jobs, code from `root`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                               "-c", LOOP, str(jobs)], env={**env, "PYTHONPATH": str(root)}, cwd=str(root),
                              capture_output=True, text=True, check=False)
        found = re.search(r"Collected\s*:\s*(\d+)", proc.stderr) or re.search(r"refs:\s*([\d,]+)", proc.stderr)
        if proc.returncode != 0 or found is None:
            raise SystemExit(f"valgrind run failed for {root} ({jobs} jobs):\n{proc.stderr[-2000:]}")
        return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="39ddf71", help="the previous version (any git revision)")
    ap.add_argument("--jobs", type=int, default=None, help="first N jobs of the trace (default: all 111,549)")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    import os

    from loom.paths import shared_traces_dir

    env = {**os.environ, "LOOM_TRACES": str(shared_traces_dir())}
    jobs = args.jobs or 10**9  # a slice past the end is the whole trace
    ref_root, created = worktree(args.ref)
    try:
        versions = {"previous": ref_root, "current": REPO}
        counts: dict[tuple[str, int], int] = {}
        with ThreadPoolExecutor(max_workers=2) as pool:  # one version per core
            for n in (1, jobs):
                print(f"counting the loop with {'1 job' if n == 1 else 'the trace'} (both versions)…",
                      file=sys.stderr, flush=True)
                futures = {name: pool.submit(instructions, root, n, env) for name, root in versions.items()}
                counts.update({(name, n): f.result() for name, f in futures.items()})
    finally:
        if created:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(ref_root)], check=False)
    loop = {name: counts[name, jobs] - counts[name, 1] for name in versions}
    print(f"Machine: {machine()}; previous = `{args.ref}`, current = working tree of {REPO.name}\n")
    print("| version | instructions, whole run | of which the loop | loop vs previous |")
    print("|---|---:|---:|---:|")
    for name in versions:
        print(f"| {name} | {counts[name, jobs] / 1e9:.3f} G | {loop[name] / 1e9:.3f} G | "
              f"{loop[name] / loop['previous']:.3f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
