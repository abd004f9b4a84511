"""Tables and figures for `loom experiment examples/arena-crius.yaml` (issue 7).

    loom experiment examples/arena-crius.yaml --workers 2 --out runs/arena-crius
    python bench/crius_experiment.py runs/arena-crius [--figure docs/img/arena_crius.png]

Per trace: each policy's jobs finished, average JCT, makespan, decision latency
(median / p99 ms per scheduling round) and Crius's average-JCT change against
it; the figure shows jobs completed over time and cluster throughput over time
(jobs completed per hour, Arena's end-event view) for every policy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import polars as pl


def load_runs(out: Path) -> list[dict]:
    runs = []
    for summary in sorted(out.glob("*/summary.json")):
        config = json.loads((summary.parent / "config.json").read_text()) if (summary.parent / "config.json").exists() else {}
        name = summary.parent.name
        fields = dict(part.split("=", 1) for part in name.split(",") if "=" in part)
        runs.append({"dir": summary.parent, "trace": fields.get("trace", config.get("trace", "?")),
                     "policy": fields.get("policy", "?"), **json.loads(summary.read_text())})
    return runs


def table(runs: list[dict]) -> str:
    lines = []
    for trace in sorted({r["trace"] for r in runs}):
        rows = {r["policy"]: r for r in runs if r["trace"] == trace}
        crius = rows.get("crius")
        lines += [f"\n**{trace}**\n", "| policy | finished | avg JCT (s) | makespan (s) | decision ms median / p99 "
                  "| Crius avg JCT vs it |", "|---|---|---|---|---|---|"]
        for policy, r in sorted(rows.items(), key=lambda kv: kv[1]["avg_jct_s"]):
            change = "—" if crius is None or policy == "crius" else f"{crius['avg_jct_s'] / r['avg_jct_s'] - 1:+.1%}"
            lines.append(f"| {policy} | {r['finished']}/{r['jobs']} | {r['avg_jct_s']:,.0f} | {r['makespan_s']:,.0f} "
                         f"| {r.get('decision_ms_median', 0):.2f} / {r.get('decision_ms_p99', 0):.1f} | {change} |")
    return "\n".join(lines)


def figure(runs: list[dict], path: Path) -> None:
    traces = sorted({r["trace"] for r in runs})
    fig, axes = plt.subplots(2, len(traces), figsize=(5 * len(traces), 7), squeeze=False)
    for col, trace in enumerate(traces):
        for r in sorted((r for r in runs if r["trace"] == trace), key=lambda r: r["policy"]):
            jobs = pl.read_parquet(r["dir"] / "jobs.parquet")
            t0 = float(jobs["submit"].min())
            ends = np.sort(jobs["end"].drop_nulls().to_numpy() - t0) / 3600.0
            axes[0][col].plot(ends, np.arange(1, ends.size + 1), label=r["policy"])
            hours = np.arange(0, max(1, int(np.ceil(ends.max() if ends.size else 1))) + 1)
            per_hour = np.histogram(ends, bins=hours)[0]
            smooth = np.convolve(per_hour, np.ones(24) / 24, mode="same")  # 24-hour moving average
            axes[1][col].plot(hours[:-1], smooth, label=r["policy"])
        axes[0][col].set_title(f"{trace}: jobs completed")
        axes[1][col].set_title(f"{trace}: throughput (jobs/hour, 24-h mean)")
        for row in (0, 1):
            axes[row][col].set_xlabel("hours since first arrival")
            axes[row][col].set_xscale("symlog", linthresh=24)
            axes[row][col].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the experiment's output directory")
    parser.add_argument("--figure", type=Path, default=None, help="where to write the figure (.png)")
    args = parser.parse_args()
    runs = load_runs(args.out)
    if not runs:
        raise SystemExit(f"no runs with summary.json under {args.out}")
    print(table(runs))
    if args.figure:
        figure(runs, args.figure)
        print(f"\nfigure: {args.figure}")


if __name__ == "__main__":
    main()
