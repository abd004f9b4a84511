"""Seren-scale simulation with estimator-driven speeds, as a user runs it (issue 6).

    PYTHONPATH=. python bench/seren_scale.py [--days 30] [--seed 0] [--policy easy] [--keep DIR]

Generates `--days` of the `acme-seren` profile (`loom.workload.generate`, as `loom workload
generate --profile acme-seren` does; timed), writes it as a generic CSV with a config
(`cluster: acme-seren`, the policy, best-fit, `speed_model: {name: estimator, params:
{trace_models: by-size}}`, no report, no decision log), then runs `loom simulate --config CFG
--json --quiet` as a subprocess: *whole command* is that process's wall time (interpreter start,
imports, trace load, estimator speeds, simulation, outputs), *sim loop* its `sim_wall_s`.
Markdown on stdout with the date, command and machine. About 1 minute on 2 cores.
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

from loom.workload.generate import generate, write_csv

CONFIG = """\
cluster: acme-seren
trace: csv:{trace}
policy: {{name: {policy}, params: {{}}}}
placer: best-fit
speed_model: {{name: estimator, params: {{trace_models: by-size}}}}
seed: 0
outputs:
  dir: {out}
  decision_log: false
  report: false
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", default="easy")
    ap.add_argument("--keep", type=Path, default=None, help="keep the trace, config and run here")
    args = ap.parse_args()
    print(f"Date: {datetime.now(UTC).isoformat(timespec='seconds')}; machine: {machine()}; "
          f"command: `{shlex.join(['python', 'bench/seren_scale.py', *sys.argv[1:]])}`\n")
    work = args.keep or Path(tempfile.mkdtemp(prefix="loom-seren-"))
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    specs = generate("acme-seren", args.days, args.seed)
    gen_s = time.perf_counter() - start
    trace = write_csv(specs, work / f"seren{args.days:g}.csv")
    config = work / "seren.yaml"
    config.write_text(CONFIG.format(trace=trace, policy=args.policy, out=work / "run"))
    loom = Path(sys.executable).parent / "loom"  # the console script a user runs
    cmd = [str(loom) if loom.exists() else shutil.which("loom") or "loom", "simulate", "--config", str(config),
           "--json", "--quiet", "--force", "--no-report", "--no-decision-log"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    whole_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"loom simulate failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    s = json.loads(proc.stdout)
    print(f"Simulated: `loom simulate --config {config.name} --json --quiet --no-report --no-decision-log` "
          f"(config: acme-seren, {args.policy}, best-fit, estimator speeds with trace_models by-size).\n")
    print("| days | jobs | generation s | finished | unfinished | avg JCT s | GPU utilisation "
          "| sim loop s | whole `loom simulate` s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {args.days:g} | {len(specs):,} | {gen_s:.1f} | {s['finished']:,} | {s['unfinished']:,} "
          f"| {s['avg_jct_s']:,.0f} | {s['gpu_utilization']:.3f} | {s['sim_wall_s']:.1f} | {whole_s:.1f} |")


if __name__ == "__main__":
    main()
