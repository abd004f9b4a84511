"""`loom traces ...`: validate and summarise trace files."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Column, Table

from loom.cli.common import busy
from loom.cli.errors import err_console, user_errors

app = typer.Typer(help="Validate and summarise traces.", no_args_is_help=True)
console = Console()

SIZE_BUCKETS = [(1, 1, "1"), (2, 4, "2-4"), (5, 8, "5-8"), (9, 32, "9-32"), (33, 128, "33-128"),
                (129, 512, "129-512"), (513, 10**9, ">512")]


def _load(spec: str, cache: bool) -> Any:
    from loom.workload.loaders import load_trace

    with busy(f"reading {spec}…"):
        return load_trace(spec, cache=cache)


TRACE_HELP = "A named trace (`loom traces list`), FORMAT:PATH (e.g. csv:jobs.csv) or a trace file's path."


@app.command("validate")
@user_errors
def validate(trace: str = typer.Argument(..., help=TRACE_HELP),
             cache: bool = typer.Option(True, "--cache/--no-cache", help="Use the Parquet trace cache.")) -> None:
    """Parse every row; print 'ok: N jobs' or the first bad row (file, line, column) and exit 2."""
    from loom.workload.loaders import trace_source

    source = trace_source(trace)
    jobs = _load(f"{source.fmt}:{source.path}", cache)
    skipped = getattr(jobs, "skipped", {})
    extra = f" ({', '.join(f'{n} {why} skipped' for why, n in skipped.items())})" if skipped else ""
    how = f"; format {source.fmt}, recognised from the header" if source.how == "inferred" else ""
    console.print(f"ok: {len(jobs)} jobs{extra}{how}", highlight=False)


@app.command("list")
@user_errors
def list_traces(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Named traces: format, jobs (when the trace cache knows), file, and whether it is present."""
    rows, problem = named_trace_rows()
    if problem:
        err_console.print(f"[yellow]warning:[/] {problem}", highlight=False, soft_wrap=True)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    root = rows[0]["root"] if rows else None
    table = Table(Column("name", no_wrap=True), "format", Column("jobs", justify="right"),
                  Column("file", overflow="fold"), "status",
                  title=f"named traces in {root}" if root else "named traces (traces folder not found)",
                  caption="jobs: shown once the trace has been parsed (kept in the trace cache)")
    for row in rows:
        jobs = "" if row["jobs"] is None else f"{row['jobs']:,}"
        status = "[green]present[/]" if row["present"] else "[red]missing[/]"
        table.add_row(row["name"], row["format"], jobs, row["file"], status)
    console.print(table)


def named_trace_rows() -> tuple[list[dict[str, Any]], str | None]:
    """One dict per named trace, and why the traces folder was not found (None when it was)."""
    from loom.errors import LoomInputError
    from loom.paths import shared_traces_dir
    from loom.workload.loaders import NAMED_TRACES

    try:
        root: Path | None = shared_traces_dir()
        problem = None
    except LoomInputError as exc:
        root, problem = None, f"{exc}; every trace is shown as missing"
    rows = []
    for name, (fmt, rel) in NAMED_TRACES.items():
        path = root / rel if root is not None else None
        present = path is not None and path.is_file()
        rows.append({"name": name, "format": fmt, "jobs": _cached_jobs(fmt, path) if present else None,
                     "file": rel, "root": str(root) if root else None, "present": present})
    return rows, problem


def _cached_jobs(fmt: str, path: Path | None) -> int | None:
    """The job count of a trace already in the Parquet cache (None when it was never parsed)."""
    from loom.workload.cache import cache_path

    try:
        target = cache_path(fmt, path) if path is not None else None
        if target is None or not target.is_file():
            return None
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(target).metadata.num_rows)
    except Exception:  # noqa: BLE001 - an unreadable cache only means "unknown"
        return None


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
def stats(trace: str = typer.Argument(..., help=TRACE_HELP),
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
