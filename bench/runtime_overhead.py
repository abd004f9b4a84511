"""Steady-state overhead of the runtime's per-iteration hook: the same job with and without `loom.runtime.wrap`.

    nice -n 5 python bench/runtime_overhead.py [--procs 2] [--layers 2] [--d-model 128] [--heads 8]
        [--block 64] [--batch 8] [--iters 80] [--warmup 10] [--pairs 8] [--toggle 3] [--json OUT] [--tiny]

The job is `examples/jobs/gpt_train.py`'s (its `build`: the GPT under DDP, AdamW, the warm-up
LambdaLR, a DataLoader with a DistributedSampler; `torch.use_deterministic_algorithms(True)`),
sized by the options so an iteration takes tens to hundreds of milliseconds, on `--procs` forked
gloo processes (`loom.runtime.testing.LocalJob`). Each run is one fresh process set, either
**on** — the example's loop exactly: `loom.runtime.wrap(model, optimizer, loader,
lr_scheduler=...)`, `loom.runtime.report(loss=...)` every iteration, a job directory, no
checkpoints (`LOOM_CHECKPOINT_INTERVAL=0`), the default control poll (0.1 s) and status interval
(1 s) — or **off** — the same loop without those two calls — or **toggle**: on, with the step hook
skipped (a bench-side wrapper returns before calling it) in every other block of `--toggle`
iterations, the same iterations on every rank. Runs come in `--pairs` groups (on, off, toggle), the
order rotating, so drift in the machine's load hits all.

Figures (rank 0's loop; the ranks are coupled by DDP's gradient all-reduce):

* **iteration time**: the median, over the iterations after `--warmup`, of the time between
  taking two consecutive batches, per run; per mode the median over runs;
* **overhead (on vs off)**: median(on) / median(off) − 1, and the median over pairs of the
  pair's ratio − 1 (the floor: < 3%); the same for the process CPU time per iteration of rank 0
  (`time.process_time`, every thread of the process). On a shared machine separate runs differ by
  more than the floor (the pair ratios' range is printed), so this comparison bounds little;
* **in-run A/B** (toggle runs): each block of iterations with the step hook against the next
  block without, the mean iteration time of each (load drifts over seconds; neighbouring blocks,
  a few hundred milliseconds apart, share it): the median of these ratios over every pair of every
  toggle run, with a distribution-free 95% confidence interval (order statistics); the same for the
  process CPU time per iteration. Also per run, the median iteration with the hook over the median
  without;
* **hook time** (on runs, measured directly): time spent inside the runtime per iteration — the
  optimizer step post-hook (`Runtime._on_step`: iteration count, control poll on rank 0, the
  barrier's meta all-reduce `Barrier.step`, status writes) and the loader's fetch hook
  (`Runtime._on_fetch`), plus what the loader wrapper adds to taking a batch (fetch time on − off),
  as a share of the iteration: the calls made after the warm-up, divided by the iterations. Each
  wrapped call costs the probe ~1 µs.

The verdict against the floor (< 3%) is judged on the time inside the runtime (what the hooks cost
the loop, measured directly on every call), unless the in-run A/B's confidence interval lies wholly
at or above 3% (a cost the probes do not see). `--tiny` is a seconds-long smoke run with the same
output (no verdict). The output is markdown for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchinfo import machine  # noqa: E402

EXAMPLE = ROOT / "examples" / "jobs" / "gpt_train.py"
HOOKS = ("on_step", "poll_control", "barrier_step", "meta_issue", "meta_wait", "status", "status_write", "on_fetch")
HOOK_LABELS = {"on_step": "step hook (`Runtime._on_step`), whole", "poll_control": "– control poll (rank 0 only)",
               "barrier_step": "– barrier (`Barrier.step`), whole",
               "meta_issue": "  – issuing the meta all-reduce (`_issue`)",
               "meta_wait": "  – waiting for the previous one + reading it (`_complete`)",
               "status": "– status (`_status`; rank 0 only writes)",
               "status_write": "  – writing status.json (`write_status`, at most ~1/s)",
               "on_fetch": "fetch hook (`Runtime._on_fetch`)"}


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("loom_bench_gpt_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _probe(owner: Any, name: str, key: str, acc: dict[str, list[float]]) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            acc[key].append((t0, time.perf_counter() - t0, time.thread_time() - c0))

    setattr(owner, name, wrapper)


def _toggle(owner: Any, name: str, block: int, skipped: list[int]) -> None:
    """Skip every other block of `block` calls of `owner.name` (the in-run A/B): the same iterations on every rank."""
    original, calls = getattr(owner, name), [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        i, calls[0] = calls[0], calls[0] + 1
        if (i // block) % 2 == 1:
            skipped.append(i)
            return None
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def worker(job_argv: list[str], on: bool, out: str, toggle: int = 0) -> None:
    """The example's training loop, with (`on`) or without the runtime; timings to `out.<rank>.json`.
    With `toggle` K, the step hook is skipped in every other block of K iterations."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    ex = _example()
    args = ex.parse_args(job_argv)
    device, backend = ex.device_and_backend()
    dist.init_process_group(backend)
    torch.use_deterministic_algorithms(True)
    rank = dist.get_rank()
    model, optimizer, loader, schedule = ex.build(args, device)
    hooks: dict[str, list[float]] = {k: [] for k in HOOKS}
    skipped: list[int] = []
    if on:
        import loom.runtime
        import loom.runtime.barrier as barrier
        import loom.runtime.runtime as rt

        _probe(rt.Runtime, "_on_step", "on_step", hooks)
        _probe(rt.Runtime, "_on_fetch", "on_fetch", hooks)
        _probe(rt.Runtime, "_poll_control", "poll_control", hooks)
        _probe(rt.Runtime, "_status", "status", hooks)
        _probe(barrier.Barrier, "step", "barrier_step", hooks)
        _probe(barrier.Barrier, "_issue", "meta_issue", hooks)
        _probe(barrier.Barrier, "_complete", "meta_wait", hooks)
        import loom.runtime.control as control

        _probe(control.ControlChannel, "write_status", "status_write", hooks)
        if toggle:
            _toggle(rt.Runtime, "_on_step", toggle, skipped)
        model, optimizer, loader = loom.runtime.wrap(model, optimizer, loader, lr_scheduler=schedule)
    stamps, cpu, tcpu, fetch = [], [], [], []
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        cpu.append(time.process_time())
        tcpu.append(time.thread_time())
        try:
            x, y = next(batches)
        except StopIteration:
            stamps.append(t0)
            break
        t1 = time.perf_counter()
        stamps.append(t0)
        fetch.append(t1 - t0)
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        value = loss.item()
        if on:
            loom.runtime.report(loss=value)
    if on:
        loom.runtime.current().close()
    Path(f"{out}.{rank}.json").write_text(json.dumps({"stamps": stamps, "cpu": cpu, "thread_cpu": tcpu, "fetch": fetch,
                                                   "hooks": hooks, "hook_off": skipped if toggle else None}))
    dist.destroy_process_group()


def _run(job_argv: list[str], on: bool, procs: int, tmp: Path, tag: str, timeout: float,
         toggle: int = 0) -> list[dict[str, Any]]:
    import torch  # noqa: F401 - imported before forking, so the workers do not each import it

    from loom.runtime.testing import run_local

    out = tmp / tag
    env = {"OMP_NUM_THREADS": "1"}
    if on:
        env.update({"LOOM_RUNTIME_DIR": str(tmp / "rt"), "LOOM_JOB_ID": tag, "LOOM_CHECKPOINT_INTERVAL": "0",
                    "LOOM_RESUME": "none"})
    results = run_local(worker, procs, env=env, args=(job_argv, on, str(out), toggle), timeout_s=timeout)
    bad = [r for r in results if r.exitcode != 0]
    if bad:
        raise SystemExit(f"runtime_overhead: a worker failed: {bad}")
    return [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(procs)]


def _per_iteration(calls: list[list[float]], start: float, end: float, iterations: int, field: int = 1) -> float:
    """Time per iteration spent in one probed function by the calls made in [start, end): wall time (field 1)
    or the calling thread's CPU time (field 2)."""
    return sum(c[field] for c in calls if start <= c[0] < end) / max(1, iterations)


def analyse(ranks: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    data = ranks[0]
    stamps = data["stamps"]
    durations = [b - a for a, b in zip(stamps[:-1], stamps[1:])][warmup:]
    fetch = data["fetch"][warmup:]
    hooks, hooks_cpu, thread_cpu = [], [], []
    for r in ranks:  # the window: from the first measured batch to the end of the loop
        start, end, n = r["stamps"][warmup], r["stamps"][-1], len(r["stamps"]) - 1 - warmup
        hooks.append({k: _per_iteration(v, start, end, n) for k, v in r["hooks"].items()})
        hooks_cpu.append({k: _per_iteration(v, start, end, n, 2) for k, v in r["hooks"].items()})
        tcpu = r.get("thread_cpu") or [0.0, 0.0]
        thread_cpu.append((tcpu[-1] - tcpu[warmup]) / max(1, len(tcpu) - 1 - warmup) if len(tcpu) > warmup else 0.0)
    cpu = data["cpu"][warmup:]
    out = {"iter_s": statistics.median(durations), "iter_mean_s": statistics.fmean(durations),
           "cpu_s": (cpu[-1] - cpu[0]) / max(1, len(cpu) - 1),
           "fetch_s": statistics.median(fetch), "hooks_s": hooks[0], "hooks_by_rank": hooks,
           "hooks_cpu_by_rank": hooks_cpu, "thread_cpu_by_rank": thread_cpu,
           "iterations": len(durations)}
    if data.get("hook_off") is not None:  # the in-run A/B: iterations with and without the step hook
        off = set(data["hook_off"])
        walls = [b - a for a, b in zip(stamps[:-1], stamps[1:])]
        cpus = [b - a for a, b in zip(data["cpu"][:-1], data["cpu"][1:])]
        idx = range(warmup, min(len(walls), len(cpus)))
        split = {k: [i for i in idx if (i in off) == (k == "off")] for k in ("on", "off")}
        out["toggle"] = {f"{k}_{what}": statistics.median(series[i] for i in split[k])
                         for k in ("on", "off") for what, series in (("wall_s", walls), ("cpu_s", cpus)) if split[k]}
        out["block_pairs"] = block_pairs(walls, cpus, off, warmup)
    return out


def block_pairs(walls: list[float], cpus: list[float], off: set[int], warmup: int) -> list[tuple[float, float]]:
    """(wall, CPU) ratio of each block with the hook to the next block without it: mean iteration time per block,
    blocks wholly after the warm-up, non-overlapping pairs (neighbours share the machine's load)."""
    blocks: list[tuple[bool, list[int]]] = []
    for i in range(min(len(walls), len(cpus))):
        if blocks and blocks[-1][0] == (i in off):
            blocks[-1][1].append(i)
        else:
            blocks.append((i in off, [i]))
    whole = [(hook_off, its) for hook_off, its in blocks[:-1] if its[0] >= warmup]  # the last may be cut short
    mean = lambda series, its: statistics.fmean(series[i] for i in its)  # noqa: E731
    pairs, k = [], 0
    while k + 1 < len(whole):
        (a_off, a), (b_off, b) = whole[k], whole[k + 1]
        if not a_off and b_off:
            pairs.append((mean(walls, a) / mean(walls, b), mean(cpus, a) / mean(cpus, b)))
            k += 2
        else:
            k += 1
    return pairs


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """The median and a distribution-free confidence interval for it (order statistics, sign test)."""
    x, n = sorted(values), len(values)
    tail, k = (1 - level) / 2, 0
    while k < n // 2 and sum(math.comb(n, j) for j in range(k + 1)) / 2**n <= tail:
        k += 1  # P(Bin(n, 1/2) <= k - 1) <= tail: [x(k), x(n-k+1)] (1-based) covers the median at >= level
    if k == 0:
        return statistics.median(x), -math.inf, math.inf
    return statistics.median(x), x[k - 1], x[n - k]


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over runs, pair ratios, and the time inside the runtime per iteration."""
    on = statistics.median(r["iter_s"] for r in runs["on"])
    off = statistics.median(r["iter_s"] for r in runs["off"])
    cpu_on = statistics.median(r["cpu_s"] for r in runs["on"])
    cpu_off = statistics.median(r["cpu_s"] for r in runs["off"])
    hooks = {k: statistics.median(r["hooks_s"][k] for r in runs["on"]) for k in HOOKS}
    fetch_on = statistics.median(r["fetch_s"] for r in runs["on"])
    fetch_off = statistics.median(r["fetch_s"] for r in runs["off"])
    wrapper = fetch_on - fetch_off - hooks["on_fetch"]
    nranks = len(runs["on"][0]["hooks_by_rank"])
    toggled = [r["toggle"] for r in runs.get("toggle", []) if "on_wall_s" in r.get("toggle", {})
               and "off_wall_s" in r["toggle"]]
    in_run = {f"{what}_ratios": [t[f"on_{what}_s"] / t[f"off_{what}_s"] for t in toggled] for what in ("wall", "cpu")}
    pairs = [p for r in runs.get("toggle", []) for p in r.get("block_pairs", [])]
    in_run["block_pairs"] = len(pairs)
    in_run["block_wall_ci"] = median_ci([w for w, _ in pairs]) if pairs else None
    in_run["block_cpu_ci"] = median_ci([c for _, c in pairs]) if pairs else None
    cpu_by_rank = [{k: statistics.median(r["hooks_cpu_by_rank"][i][k] for r in runs["on"]) for k in HOOKS}
                   for i in range(nranks)]
    thread_cpu = [statistics.median(r["thread_cpu_by_rank"][i] for r in runs["on"]) for i in range(nranks)]
    return {**in_run, "hooks_cpu_by_rank_s": cpu_by_rank, "thread_cpu_by_rank_s": thread_cpu, "on_s": on,
            "off_s": off, "cpu_on_s": cpu_on, "cpu_off_s": cpu_off, "hooks_s": hooks,
            "pair_ratios": [a["iter_s"] / b["iter_s"] for a, b in zip(runs["on"], runs["off"])],
            "cpu_pair_ratios": [a["cpu_s"] / b["cpu_s"] for a, b in zip(runs["on"], runs["off"])],
            "fetch_on_s": fetch_on, "fetch_off_s": fetch_off, "wrapper_s": wrapper,
            "direct_s": hooks["on_step"] + hooks["on_fetch"] + max(0.0, wrapper),
            "hooks_by_rank_s": [{k: statistics.median(r["hooks_by_rank"][i][k] for r in runs["on"]) for k in HOOKS}
                                for i in range(nranks)]}


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], s: dict[str, Any]) -> str:
    """The markdown tables and the verdict against the floor (< 3% of the iteration time): judged on the in-run
    A/B and on the time measured inside the runtime; the A/B between runs is shown, as its spread shows how far
    separate runs on this machine differ."""
    on, off, cpu_on, cpu_off = s["on_s"], s["off_s"], s["cpu_on_s"], s["cpu_off_s"]
    pct = lambda ratio: (ratio - 1) * 100  # noqa: E731
    lines = [f"Job: examples/jobs/gpt_train.py's build ({args.layers} layers, d_model {args.d_model}, {args.heads} "
             f"heads, block {args.block}, batch {args.batch} per process), {args.procs} DDP processes (gloo); "
             f"{args.iters} iterations per run, the first {args.warmup} left out; {args.pairs} on/off pairs, "
             "alternating order. Iteration time: median per run, then the median over runs (min–max over runs in "
             "brackets).", "", "| runtime | iteration time (wall) | process CPU time per iteration | batch fetch "
             "(median) |", "|:---|---:|---:|---:|"]
    for mode, value, cpu_value, fetch in (("off", off, cpu_off, s["fetch_off_s"]), ("on", on, cpu_on, s["fetch_on_s"])):
        values, cpus = [r["iter_s"] for r in runs[mode]], [r["cpu_s"] for r in runs[mode]]
        lines.append(f"| {mode} | {value * 1e3:.2f} ms ({min(values) * 1e3:.2f}–{max(values) * 1e3:.2f}) | "
                     f"{cpu_value * 1e3:.2f} ms ({min(cpus) * 1e3:.2f}–{max(cpus) * 1e3:.2f}) | {fetch * 1e6:.0f} µs |")
    pairs, cpu_pairs = s["pair_ratios"], s["cpu_pair_ratios"]
    lines += ["", f"Overhead, on vs off: **{pct(on / off):+.2f}%** (ratio of medians); median of the {len(pairs)} "
              f"pair ratios {pct(statistics.median(pairs)):+.2f}% (pairs from {pct(min(pairs)):+.1f}% to "
              f"{pct(max(pairs)):+.1f}%). Process CPU time per iteration (all of rank 0's threads): "
              f"{pct(cpu_on / cpu_off):+.2f}% (ratio of medians), median pair ratio "
              f"{pct(statistics.median(cpu_pairs)):+.2f}%. Floor: < 3%.", ""]
    walls, cpus = s["wall_ratios"], s["cpu_ratios"]
    wall_ci, cpu_ci = s["block_wall_ci"], s["block_cpu_ci"]
    ci = lambda c: f"{pct(c[1]):+.1f}% to {pct(c[2]):+.1f}%" if math.isfinite(c[1]) else "—"  # noqa: E731
    if walls and wall_ci:
        lines += [f"In-run A/B ({len(walls)} runs with the runtime on whose step hook is skipped in every other block "
                  f"of {args.toggle} iterations, the same iterations on every rank; the loader wrapper stays). Each "
                  "block with the hook against the next block without (the mean iteration of each; neighbours share "
                  f"the machine's load), {s['block_pairs']} pairs: wall **{pct(wall_ci[0]):+.2f}%** (median; 95% "
                  f"confidence interval {ci(wall_ci)}), process CPU time {pct(cpu_ci[0]):+.2f}% ({ci(cpu_ci)}). Per "
                  "run, the median iteration with the hook over the median without: "
                  f"{pct(statistics.median(walls)):+.2f}% "
                  f"(median over runs; runs from {pct(min(walls)):+.1f}% to {pct(max(walls)):+.1f}%); CPU "
                  f"{pct(statistics.median(cpus)):+.2f}%.", ""]
    by_rank, cpu_by_rank, tcpu = s["hooks_by_rank_s"], s["hooks_cpu_by_rank_s"], s["thread_cpu_by_rank_s"]
    nranks = len(by_rank)
    lines += ["Time inside the runtime per iteration (on runs; per rank, the median over runs of the per-run mean): "
              "wall time, and its share of rank 0's median iteration time; the calling thread's CPU time, and its "
              "share of that thread's CPU time per iteration (" + ", ".join(f"rank {i}: {c * 1e3:.1f} ms" for i, c in
                                                                       enumerate(tcpu)) + "). On a busy machine the "
              "wall time includes the time the thread waits for a core, so the CPU share is the better estimate of "
              "what the runtime costs where it has a core to itself:", "",
              "| where | " + " | ".join(f"rank {i}: µs per iteration | share | CPU µs | CPU share"
                                        for i in range(nranks)) + " |", "|:---|" + "---:|---:|---:|---:|" * nranks]
    for key in HOOKS:
        lines.append(f"| {HOOK_LABELS[key]} | " + " | ".join(
            f"{h[key] * 1e6:.0f} | {h[key] / on * 100:.3f}% | {c[key] * 1e6:.0f} | {c[key] / t * 100 if t else 0:.3f}%"
            for h, c, t in zip(by_rank, cpu_by_rank, tcpu)) + " |")
    pad = " |" * (4 * nranks - 2)
    lines.append(f"| loader wrapper (rank 0's fetch on − off − fetch hook) | {s['wrapper_s'] * 1e6:.0f} | "
                 f"{s['wrapper_s'] / on * 100:.3f}% |" + pad)
    lines.append(f"| **total on rank 0 (step hook + fetch hook + loader wrapper)** | {s['direct_s'] * 1e6:.0f} | "
                 f"**{s['direct_s'] / on * 100:.3f}%** |" + pad)
    # judged on the time inside the runtime (what the hook costs the loop directly), unless the in-run A/B shows
    # a larger cost (its confidence interval wholly at or above 3%: something the probes do not see)
    direct = s["direct_s"] / on * 100
    above = [name for name, c in (("wall", wall_ci), ("CPU", cpu_ci)) if c and pct(c[1]) >= 3.0]
    ok = direct < 3.0 and not above
    verdict = "not judged (a --tiny smoke run)" if args.tiny else ("met" if ok else "NOT met")
    ab = (f"in-run A/B {pct(wall_ci[0]):+.2f}% wall ({ci(wall_ci)}), {pct(cpu_ci[0]):+.2f}% CPU ({ci(cpu_ci)})"
          + (f", significantly above 3% ({', '.join(above)})" if above else ", not significantly above 3%")
          if wall_ci else "no in-run A/B")
    hook_cpu = (cpu_by_rank[0]["on_step"] + cpu_by_rank[0]["on_fetch"]) / tcpu[0] * 100 if tcpu[0] else 0.0
    lines += ["", f"**Floor, per-iteration runtime overhead < 3%: {verdict}** (time inside the runtime {direct:.2f}% "
              f"of the iteration, its CPU time {hook_cpu:.2f}% of the loop thread's; {ab}; between runs, which "
              f"differ by {pct(min(pairs)):+.0f}% to {pct(max(pairs)):+.0f}% here: wall {pct(on / off):+.2f}%, "
              f"process CPU {pct(cpu_on / cpu_off):+.2f}%, ratios of medians)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--iters", type=int, default=80, help="iterations per run")
    ap.add_argument("--warmup", type=int, default=10, help="first iterations left out")
    ap.add_argument("--pairs", type=int, default=8, help="on/off pairs of runs (each with an in-run A/B run)")
    ap.add_argument("--toggle", type=int, default=3, help="in-run A/B: the step hook skipped in every other block "
                    "of this many iterations (0: no in-run A/B runs)")
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tiny", action="store_true", help="seconds-long smoke run")
    args = ap.parse_args(argv)
    if args.tiny:
        args.layers, args.d_model, args.heads, args.block, args.batch = 1, 16, 2, 8, 2
        args.iters, args.warmup, args.pairs, args.toggle = 10, 2, 1, 2
    job_argv = ["--iters", str(args.iters), "--batch", str(args.batch), "--block", str(args.block),
                "--layers", str(args.layers), "--d-model", str(args.d_model), "--heads", str(args.heads)]
    from loom.run import git_commit

    raw = argv if argv is not None else sys.argv[1:]
    nice = f"nice -n {os.nice(0)} " if os.nice(0) else ""
    command = nice + "python bench/runtime_overhead.py" + (" " + shlex.join(raw) if raw else "")
    load0, started = os.getloadavg(), datetime.now(UTC).isoformat(timespec="seconds")
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": [], "toggle": []}
    with tempfile.TemporaryDirectory(prefix="loom-bench-overhead-") as tmpname:
        tmp = Path(tmpname)
        for pair in range(args.pairs):
            order = ["on", "off", "toggle"] if args.toggle else ["on", "off"]
            order = order[pair % len(order):] + order[:pair % len(order)]  # rotating, so drift hits all
            for mode in order:
                result = analyse(_run(job_argv, mode != "off", args.procs, tmp, f"{mode}-{pair}", args.timeout,
                                      args.toggle if mode == "toggle" else 0), args.warmup)
                result["pair"], result["loadavg"] = pair, os.getloadavg()[0]
                runs[mode].append(result)
                print(f"[runtime_overhead] pair {pair + 1}/{args.pairs} {mode}: {result['iter_s'] * 1e3:.1f} ms/it "
                      f"(load {result['loadavg']:.1f})", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    summary = summarise(runs)
    print("### `bench/runtime_overhead.py`: the per-iteration runtime hook\n\n"
          f"Command: `{command}`\n\nDate: {started}; machine: {machine()}; loom commit "
          f"{(git_commit() or 'unknown')[:10]}; load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end\n")
    print(report(args, runs, summary))
    if args.json:
        args.json.write_text(json.dumps({"command": command, "date": started, "machine": machine(),
                                         "loadavg": [load0, load1], "runs": runs, **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
