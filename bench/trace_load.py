"""Trace loading speed: cold parse vs the Parquet cache.

Each measurement runs in a fresh process so that nothing is warm but the OS
file cache; library and loader imports (~0.3 s, paid once per process) are
reported separately from the load itself. Cold = `LOOM_CACHE=off`; cached =
a cache directory filled by a previous run.

    python bench/trace_load.py [--traces philly,philly-vc,alibaba-v2023] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import polars, pyarrow.parquet  # noqa: F401  (library imports are timed separately)
from loom.workload.loaders import LOADERS, load_trace
LOADERS.names()  # imports every loader module
import loom.workload.cache  # noqa: F401
t = time.perf_counter()
jobs = load_trace(sys.argv[1])
print(json.dumps({"s": time.perf_counter() - t, "imports": t - t0, "jobs": len(jobs)}))
"""


def measure(trace: str, cache_dir: str) -> dict:
    env = {**os.environ, "LOOM_CACHE": cache_dir}
    out = subprocess.run([sys.executable, "-c", CHILD, trace], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="philly,philly-vc,alibaba-v2023")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("| trace | jobs | cold parse s (median, min) | from cache s (median, min) | imports s |")
    print("| :--- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as cache:
        for trace in args.traces.split(","):
            cold = [measure(trace, "off") for _ in range(args.repeat)]
            measure(trace, cache)  # fill the cache
            warm = [measure(trace, cache) for _ in range(args.repeat)]
            c, w = [r["s"] for r in cold], [r["s"] for r in warm]
            imports = statistics.median(r["imports"] for r in cold + warm)
            print(f"| {trace} | {cold[0]['jobs']:,} | {statistics.median(c):.2f} ({min(c):.2f}) "
                  f"| {statistics.median(w):.2f} ({min(w):.2f}) | {imports:.2f} |")


if __name__ == "__main__":
    main()
