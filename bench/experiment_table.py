"""Run a `loom experiment` config and print one markdown row per run (issue 7's grids).

    PYTHONPATH=. python bench/experiment_table.py examples/alibaba-crius.yaml [--workers 1] [--out DIR]
    PYTHONPATH=. python bench/experiment_table.py examples/crius-search-depth.yaml
    PYTHONPATH=. python bench/experiment_table.py --from DIR      # an experiment already run: no rerun

Runs `loom experiment CONFIG --workers N --out DIR` (DIR: a fresh temporary directory unless
given; it must not hold runs already) as a subprocess, then reads every `DIR/*/summary.json`:
finished / jobs, average JCT, average queueing delay, makespan, scheduling rounds, decision latency
per scheduling round (median / p99 ms) and `sim_wall_s` (the event loop alone). Default one worker, so that
runs do not share the cores and their wall times are comparable. Markdown on stdout with the
date, the command, the machine and the whole experiment's wall time.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchinfo import machine


def rows(out: Path) -> list[str]:
    lines = ["| run | finished | avg JCT s | avg queue s | makespan s | rounds | decision ms median / p99 | sim wall s |",
             "| :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for path in sorted(out.glob("*/summary.json")):
        s = json.loads(path.read_text())

        def num(key: str, fmt: str = "{:,.0f}", s: dict = s) -> str:
            return "—" if s.get(key) is None else fmt.format(s[key])

        lines.append(f"| {path.parent.name} | {s['finished']:,}/{s['jobs']:,} | {num('avg_jct_s')} "
                     f"| {num('avg_queue_s')} | {num('makespan_s')} | {num('rounds')} "
                     f"| {num('decision_ms_median', '{:.2f}')} / {num('decision_ms_p99', '{:.1f}')} "
                     f"| {num('sim_wall_s', '{:.1f}')} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", type=Path, help="experiment YAML (omit with --from)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="experiment output directory (default: a temp dir)")
    ap.add_argument("--from", dest="existing", type=Path, default=None,
                    help="only tabulate an experiment already run in this directory")
    args = ap.parse_args()
    print(f"Date: {datetime.now(UTC).isoformat(timespec='seconds')}; machine: {machine()}; "
          f"command: `{shlex.join(['python', 'bench/experiment_table.py', *sys.argv[1:]])}`")
    if args.existing is not None:
        out = args.existing
        print(f"\nTabulated from {out} (not rerun here).\n")
    else:
        if args.config is None:
            ap.error("give a config or --from DIR")
        out = args.out or Path(tempfile.mkdtemp(prefix="loom-experiment-"))
        if any(out.glob("*/summary.json")):
            raise SystemExit(f"{out} already holds runs: give a fresh --out (or --from {out})")
        loom = Path(sys.executable).parent / "loom"  # the console script a user runs
        cmd = [str(loom) if loom.exists() else shutil.which("loom") or "loom", "experiment", str(args.config),
               "--workers", str(args.workers), "--out", str(out)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"loom experiment failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        print(f"\n`loom experiment {args.config} --workers {args.workers}`: {took:.0f} s in all.\n")
    print("\n".join(rows(out)))


if __name__ == "__main__":
    main()
