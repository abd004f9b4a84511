"""A bare FCFS + best-fit event loop over the Philly trace, in plain Python.

This is the reference Loom's engine is compared against: no policy or placer
objects, no decisions, no job records, just a heap of finish times and a free
GPU count per node (a NumPy array over the same 552 servers as Loom's `philly`
cluster). Run it directly:

    python bench/bare_fcfs.py [--limit N] [--json OUT]

It reproduces Loom's FCFS + best-fit semantics so the queueing delays can be
checked against `loom simulate --policy fcfs --placer best-fit`:

* jobs in submit order (stable); at one instant, finishes are applied before
  arrivals and then one FCFS pass runs: start queued jobs in order, stop at
  the first that does not fit (a zero-length job finishes at the same instant
  and triggers another pass, as in Loom);
* a job never starts if it asks for more GPUs than are free in total;
* single node: the node with the fewest free GPUs that still holds the job
  (lowest index on ties);
* otherwise, per GPU type (P100 2-GPU nodes, P40 8-GPU nodes; a job never
  mixes types): fullest-free nodes first until the job is covered, the
  remainder moved to the tightest other node of that type; the type needing
  fewer nodes wins (the first type on ties).

One shortcut that does not change the result: when the queue head is blocked
and only arrivals happened since, nothing was freed, so the pass is skipped.

The loop time excludes trace loading.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

NOT_FIT = np.iinfo(np.int32).max


@dataclass
class BareTrace:
    submit: list[float]
    gpus: list[int]
    duration: list[float]


def load_jobs(limit: int | None = None) -> BareTrace:
    """The RFold Philly trace, stably sorted by arrival, first `limit` jobs."""
    import polars as pl

    from loom.paths import shared_traces_dir

    frame = pl.read_csv(shared_traces_dir() / "philly" / "rfold_philly_trace.csv", infer_schema=False)
    frame = frame.select(
        pl.col("arrival time (sec)").str.strip_chars().cast(pl.Float64).alias("submit"),
        pl.col("size").str.strip_chars().cast(pl.Int64).alias("gpus"),
        pl.col("duration (sec)").str.strip_chars().cast(pl.Float64).alias("duration"),
    ).sort("submit", maintain_order=True)
    if limit:
        frame = frame.head(limit)
    return BareTrace(frame["submit"].to_list(), frame["gpus"].to_list(), frame["duration"].to_list())


def philly_nodes() -> tuple[np.ndarray, np.ndarray]:
    """GPUs per node and GPU-type id per node, from Loom's philly cluster (same node order)."""
    from loom.hardware.clusters import load_cluster

    topo = load_cluster("philly")
    return topo.node_gpus.astype(np.int32), topo.node_type.astype(np.int32)


def simulate(trace: BareTrace, node_gpus: np.ndarray, node_type: np.ndarray) -> dict:
    """Run the loop; returns start times, busy GPU-seconds and the loop's wall time."""
    submit, gpus, duration = trace.submit, trace.gpus, trace.duration
    n = len(submit)
    free = node_gpus.astype(np.int32).copy()
    free_total = int(free.sum())
    type_nodes = [np.flatnonzero(node_type == t) for t in range(int(node_type.max()) + 1)]
    inf = float("inf")

    def tightest(f: np.ndarray, g: int) -> int:
        slack = (f - np.int32(g)).view(np.uint32)  # too-small nodes wrap to huge values
        i = int(slack.argmin())
        return -1 if slack[i] >= NOT_FIT else i

    def place(g: int):  # -> (nodes, counts) | None
        node = tightest(free, g)
        if node >= 0:
            return (node,), (g,)
        best = None
        for idx in type_nodes:
            f = free[idx]
            order = np.argsort(-f, kind="stable")
            caps = f[order]
            total = np.cumsum(caps)
            if total.size == 0 or total[-1] < g:
                continue
            k = int(np.searchsorted(total, g))
            nodes = idx[order[: k + 1]].tolist()
            counts = caps[: k + 1].tolist()
            counts[-1] = g - (int(total[k - 1]) if k else 0)
            if k:  # remainder to the tightest node not already used in full
                slack = (f - np.int32(counts[-1])).view(np.uint32)
                slack[order[:k]] = NOT_FIT
                j = int(slack.argmin())
                if slack[j] < NOT_FIT:
                    nodes[-1] = int(idx[j])
            if best is None or len(nodes) < len(best[0]):
                best = (nodes, counts)
        return best

    start = [inf] * n
    alloc: list = [None] * n
    heap: list[tuple[float, int]] = []
    pending: deque[int] = deque()
    busy = 0.0
    blocked = False
    cursor = 0
    events = passes = 0

    wall = time.perf_counter()
    while True:
        now = submit[cursor] if cursor < n else inf
        if heap and heap[0][0] < now:
            now = heap[0][0]
        if now == inf:
            break
        freed = False
        while heap and heap[0][0] == now:
            _, j = heapq.heappop(heap)
            nodes, counts = alloc[j]
            for node, c in zip(nodes, counts):
                free[node] += c
            free_total += gpus[j]
            freed = True
            events += 1
        arrived = False
        while cursor < n and submit[cursor] == now:
            pending.append(cursor)
            cursor += 1
            arrived = True
            events += 1
        if freed or (arrived and not blocked):
            passes += 1
            blocked = False
            while pending:
                j = pending[0]
                g = gpus[j]
                a = place(g) if g <= free_total else None
                if a is None:
                    blocked = True
                    break
                pending.popleft()
                for node, c in zip(*a):
                    free[node] -= c
                free_total -= g
                alloc[j] = a
                start[j] = now
                busy += g * duration[j]
                heapq.heappush(heap, (now + duration[j], j))
    wall = time.perf_counter() - wall

    return {"start": start, "busy_gpu_seconds": busy, "wall_s": wall, "events": events, "passes": passes,
            "unstarted": sum(1 for s in start if s == inf)}


def stats(trace: BareTrace, out: dict, total_gpus: int) -> dict:
    submit = np.asarray(trace.submit)
    start = np.asarray(out["start"])
    ran = np.isfinite(start)
    queue = (start - submit)[ran]
    end = (start + np.asarray(trace.duration))[ran]
    jct = end - submit[ran]
    makespan = (end.max() if end.size else submit[0]) - submit[0]
    return {
        "jobs": len(submit),
        "finished": int(ran.sum()),
        "avg_queue_s": float(queue.mean()) if queue.size else 0.0,
        "p50_queue_s": float(np.median(queue)) if queue.size else 0.0,
        "p99_queue_s": float(np.percentile(queue, 99)) if queue.size else 0.0,
        "avg_jct_s": float(jct.mean()) if jct.size else 0.0,
        "gpu_utilization": out["busy_gpu_seconds"] / (total_gpus * makespan) if makespan > 0 else 0.0,
        "events": out["events"],
        "passes": out["passes"],
        "wall_s": out["wall_s"],
        "events_per_s": out["events"] / out["wall_s"] if out["wall_s"] > 0 else 0.0,
    }


def run_bare(limit: int | None = None) -> dict:
    t0 = time.perf_counter()
    trace = load_jobs(limit)
    node_gpus, node_type = philly_nodes()
    setup = time.perf_counter() - t0
    out = simulate(trace, node_gpus, node_type)
    result = stats(trace, out, int(node_gpus.sum()))
    result["setup_s"] = setup
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="only the first N jobs of the trace")
    ap.add_argument("--json", default=None, help="also write the result as JSON to this file")
    args = ap.parse_args(argv)
    r = run_bare(args.limit)
    print(f"bare FCFS + best-fit, {r['jobs']:,} jobs on Philly (552 nodes, 2,490 GPUs)")
    print(f"  loop wall time    {r['wall_s']:.3f} s   ({r['events']:,} events, {r['events_per_s']:,.0f} events/s, "
          f"{r['passes']:,} FCFS passes)")
    print(f"  setup (excluded)  {r['setup_s']:.3f} s   (trace load + cluster)")
    print(f"  finished          {r['finished']:,}")
    print(f"  queue delay       avg {r['avg_queue_s']:.1f} s, p50 {r['p50_queue_s']:.1f} s, "
          f"p99 {r['p99_queue_s']:.1f} s")
    print(f"  avg JCT           {r['avg_jct_s']:.1f} s")
    print(f"  GPU utilisation   {r['gpu_utilization']:.4f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
