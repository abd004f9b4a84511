"""Acme-calibrated generated workloads against the published statistics (issue 6).

    PYTHONPATH=. python bench/acme_workload.py [--profile acme-kalos] [--days 7] [--seed 0]
                                               [--long-days 183] [--long-seeds 0,1,2]

Generates `--days` of the profile (`loom.workload.generate.generate`, as `loom workload
generate --validate` does) and prints every row of `loom.workload.generate.validate`:
generated vs published (AcmeTrace `cluster_summary.csv` [CS], the Acme NSDI'24 paper [NSDI],
Helios Venus submissions [VEN]) with the generation time. Then, for `--long-days` (0: skip),
the statistics that a short trace holds too few pretraining jobs to settle, per seed in
`--long-seeds`: pretraining job and GPU-time shares and the failed fraction. Markdown on
stdout with the date, command and machine; a few seconds in all.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchinfo import machine

from loom.workload.generate import format_value, generate, validate
from loom.workload.profiles import get_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="acme-kalos")
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--long-days", type=float, default=183.0, help="length of the long traces (0: skip)")
    ap.add_argument("--long-seeds", default="0,1,2")
    args = ap.parse_args()
    prof = get_profile(args.profile)
    print(f"Date: {datetime.now(UTC).isoformat(timespec='seconds')}; machine: {machine()}; "
          f"command: `{shlex.join(['python', 'bench/acme_workload.py', *sys.argv[1:]])}`\n")

    start = time.perf_counter()
    specs = generate(prof, args.days, args.seed)
    took = time.perf_counter() - start
    rows = validate(specs, prof, args.days)
    print(f"### {prof.name}, {args.days:g} days, seed {args.seed}: {len(specs):,} jobs generated in {took:.2f} s\n")
    print("| statistic | generated | published | source |")
    print("| :--- | ---: | ---: | :--- |")
    for r in rows:
        pub = format_value(r["published"], r["kind"])
        if r["relation"] in ("<", ">"):
            pub = f"{r['relation']} {pub}"
        print(f"| {r['metric']} | {format_value(r['generated'], r['kind'])} | {pub} | {r['source'] or '—'} |")

    if args.long_days > 0:
        print(f"\n### {prof.name}, {args.long_days:g} days\n")
        print("| seed | jobs | pretrain job share | pretrain GPU-time share | failed | generation s |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for seed in (int(x) for x in args.long_seeds.split(",") if x.strip()):
            start = time.perf_counter()
            long = generate(prof, args.long_days, seed)
            took = time.perf_counter() - start
            by = {r["metric"]: r["generated"] for r in validate(long, prof, args.long_days)}
            print(f"| {seed} | {len(long):,} | {by['job share: pretrain']:.1%} | "
                  f"{by['GPU-time share: pretrain']:.1%} | {by['fraction failed']:.1%} | {took:.2f} |")


if __name__ == "__main__":
    main()
