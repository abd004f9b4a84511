"""`loom traces ...`: validate and summarise trace files."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from loom.cli.errors import user_errors

app = typer.Typer(help="Validate and summarise traces.", no_args_is_help=True)
console = Console()

SIZE_BUCKETS = [(1, 1, "1"), (2, 4, "2-4"), (5, 8, "5-8"), (9, 32, "9-32"), (33, 128, "33-128"),
                (129, 512, "129-512"), (513, 10**9, ">512")]


def _load(spec: str, cache: bool) -> Any:
    from loom.workload.loaders import load_trace

    return load_trace(spec, cache=cache)


@app.command("validate")
@user_errors
def validate(trace: str = typer.Argument(..., help="A named trace or FORMAT:PATH (e.g. csv:jobs.csv)."),
             cache: bool = typer.Option(True, "--cache/--no-cache", help="Use the Parquet trace cache.")) -> None:
    """Parse every row; print 'ok: N jobs' or the first bad row (file, line, column) and exit 2."""
    jobs = _load(trace, cache)
    skipped = getattr(jobs, "skipped", {})
    extra = f" ({', '.join(f'{n} {why} skipped' for why, n in skipped.items())})" if skipped else ""
    console.print(f"ok: {len(jobs)} jobs{extra}", highlight=False)


def _bucket(gpus: int) -> str:
    for lo, hi, label in SIZE_BUCKETS:
        if lo <= gpus <= hi:
            return label
    return ">512"


def trace_stats(jobs: list) -> dict[str, Any]:
    """Summary numbers of a loaded trace (what `loom traces stats --json` prints)."""
    n = len(jobs)
    first = min((j.submit_time for j in jobs), default=0.0)
    last = max((j.submit_time for j in jobs), default=0.0)
    sizes = Counter(j.gpus for j in jobs)
    gpu_time: dict[str, float] = defaultdict(float)
    per_class: dict[str, dict[str, float]] = defaultdict(lambda: {"jobs": 0, "gpu_seconds": 0.0})
    per_vc: dict[str, dict[str, float]] = defaultdict(lambda: {"jobs": 0, "gpu_seconds": 0.0})
    unknown_duration = 0
    for j in jobs:
        gs = 0.0
        if j.duration is None:
            unknown_duration += 1
        else:
            gs = j.duration * j.gpus
        gpu_time[_bucket(j.gpus)] += gs
        for table, key in ((per_class, j.job_class.value), (per_vc, j.vc or "-")):
            table[key]["jobs"] += 1
            table[key]["gpu_seconds"] += gs
    total = sum(gpu_time.values())
    return {
        "jobs": n,
        "skipped": dict(getattr(jobs, "skipped", {})),
        "first_submit": first,
        "last_submit": last,
        "span_seconds": last - first,
        "span_days": (last - first) / 86400,
        "gpus_total_requested": sum(j.gpus for j in jobs),
        "unknown_duration": unknown_duration,
        "gpu_size_histogram": {str(k): v for k, v in sorted(sizes.items())},
        "gpu_time_share_by_size": {label: (gpu_time[label] / total if total else 0.0)
                                   for _, _, label in SIZE_BUCKETS if label in gpu_time},
        "gpu_seconds_total": total,
        "per_class": dict(sorted(per_class.items())),
        "per_vc": dict(sorted(per_vc.items(), key=lambda kv: -kv[1]["gpu_seconds"])),
    }


@app.command("stats")
@user_errors
def stats(trace: str = typer.Argument(..., help="A named trace or FORMAT:PATH."),
          as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
          cache: bool = typer.Option(True, "--cache/--no-cache", help="Use the Parquet trace cache.")) -> None:
    """Jobs, span, GPU-size histogram, GPU-time shares by size, per class and per VC."""
    s = trace_stats(_load(trace, cache))
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
    head = f"[bold]{trace}[/]: {s['jobs']} jobs over {s['span_days']:.1f} days"
    if s["skipped"]:
        head += " (skipped: " + ", ".join(f"{n} {why}" for why, n in s["skipped"].items()) + ")"
    if s["unknown_duration"]:
        head += f"; {s['unknown_duration']} jobs without duration"
    console.print(head, highlight=False)
    sizes = Table("GPUs", "jobs", "share", title="GPU-size histogram")
    for k, v in s["gpu_size_histogram"].items():
        sizes.add_row(k, str(v), f"{v / max(1, s['jobs']):.1%}")
    console.print(sizes)
    shares = Table("size bucket", "GPU-time share", title="GPU time by job size")
    for k, v in s["gpu_time_share_by_size"].items():
        shares.add_row(k, f"{v:.1%}")
    console.print(shares)
    total = s["gpu_seconds_total"] or 1.0
    for key, title in (("per_class", "per job class"), ("per_vc", "per VC")):
        table = Table(title.split()[-1], "jobs", "GPU-hours", "GPU-time share", title=title)
        rows = list(s[key].items())
        for name, row in rows[:20]:
            table.add_row(name, str(int(row["jobs"])), f"{row['gpu_seconds'] / 3600:,.0f}",
                          f"{row['gpu_seconds'] / total:.1%}")
        if len(rows) > 20:
            table.add_row(f"... {len(rows) - 20} more", "", "", "")
        console.print(table)
