"""JCT predictor on the real traces: bagged LightGBM (classify, regress) vs the recent-history baseline.

Time-ordered split (first 70 % of jobs by submit time train, the rest test),
5 bootstrap models, seed 0, 2 LightGBM threads. Prints a markdown table.

    PYTHONPATH=. python3 bench/predict.py [--traces philly-vc,alibaba-v2023] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from loom.predict.evaluate import evaluate_trace

NAMES = {"gbm-classify": "GBM classify", "gbm-regress": "GBM regress", "baseline": "recent-history baseline"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", default="philly-vc,alibaba-v2023")
    ap.add_argument("--bags", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-frac", type=float, default=0.7)
    ap.add_argument("--json", default=None, help="Also write the raw results here.")
    args = ap.parse_args(argv)
    rows = []
    raw = []
    for trace in args.traces.split(","):
        t0 = time.perf_counter()
        res = evaluate_trace(trace, modes=("classify", "regress"), n_bags=args.bags, seed=args.seed,
                             train_frac=args.train_frac)
        print(f"# {trace}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        raw.append(res)
        for name, m in res["results"].items():
            rows.append(f"| {trace} | {NAMES.get(name, name)} | {res['train_jobs']} | {res['test_jobs']} | "
                        f"{m['rmse_bins']:.2f} | {m['rmse_bins_point']:.2f} | {m['acc']:.1%} | {m['within1']:.1%} | "
                        f"{m['mae_p50_s']:,.0f} | {m['cov_p50']:.1%} | {m['cov_p90']:.1%} | {m['train_s']:.1f} |")
    print("| trace | predictor | train jobs | test jobs | RMSE bins | RMSE bins (point) | acc | within 1 | "
          "MAE p50 (s) | ≤ p50 | ≤ p90 | train s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
