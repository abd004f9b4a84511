"""`loom workload ...`: generate synthetic Acme-like LLM workloads and validate them against published stats."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from loom.cli.common import busy
from loom.cli.errors import user_errors

app = typer.Typer(help="Generate synthetic LLM-cluster workloads (Acme Kalos / Seren).", no_args_is_help=True)
console = Console()


def register(app_: typer.Typer) -> None:
    """Add the `workload` sub-app to `loom` (call from loom/cli/main.py)."""
    app_.add_typer(app, name="workload")


def _print_validation(rows: list[dict[str, Any]], title: str) -> None:
    from loom.workload.generate import format_value

    table = Table("metric", "generated", "published", "source", title=title)
    for r in rows:
        pub = format_value(r["published"], r["kind"])
        if r["relation"] in ("<", ">"):
            pub = f"{r['relation']} {pub}"
        table.add_row(r["metric"], format_value(r["generated"], r["kind"]), pub, r["source"])
    console.print(table)
    console.print("sources: [CS] AcmeTrace cluster_summary.csv, [NSDI] Acme paper (NSDI'24), "
                  "[VEN] Helios Venus submissions; '—' = not published", highlight=False, soft_wrap=True)


@app.command("generate")
@user_errors
def generate_cmd(
    profile: str = typer.Option(..., "--profile", "-p", help="Workload profile: acme-kalos or acme-seren."),
    days: float = typer.Option(..., "--days", "-d", help="Length of the trace in days (> 0)."),
    out: Path = typer.Option(..., "--out", "-o", help="CSV file to write (generic `csv` trace format)."),  # noqa: B008
    seed: int = typer.Option(0, "--seed", "-s", help="Random seed; the same seed gives the same trace."),
    scale: float = typer.Option(1.0, "--scale", help="Multiply the arrival rate (jobs per day) by F."),
    outcomes: str = typer.Option("recorded", "--outcomes",
                                 help="recorded: failed/cancelled jobs end early (as logged); would-be: every "
                                      "job runs its full would-be time and is completed (inject failures "
                                      "with loom.workload.job_failures)."),
    validate: bool = typer.Option(False, "--validate", help="Also print generated vs published statistics."),
    as_json: bool = typer.Option(False, "--json", help="With --validate: print the rows as JSON."),
) -> None:
    """Write a synthetic trace calibrated to Acme; replay it with `loom simulate --trace csv:FILE`."""
    from loom.workload.generate import generate, write_csv
    from loom.workload.generate import validate as validate_rows
    from loom.workload.profiles import get_profile

    prof = get_profile(profile)
    started = time.perf_counter()
    with busy(f"generating {days:g} days of {prof.name}…"):
        specs = generate(prof, days, seed, scale, outcomes=outcomes)
        elapsed = time.perf_counter() - started
        path = write_csv(specs, out)
        rows = validate_rows(specs, prof, days) if validate else None
    if as_json and rows is not None:
        typer.echo(json.dumps({"out": str(path), "jobs": len(specs), "validation": rows}, indent=2))
        return
    console.print(f"wrote [bold]{len(specs):,}[/] jobs ({prof.name}, {days:g} days, seed {seed}, scale {scale:g}) "
                  f"to [bold]{path}[/] in {elapsed:.2f} s; replay with `loom simulate --trace csv:{path} "
                  f"--cluster {prof.cluster}`", highlight=False, soft_wrap=True)
    if rows is not None:
        _print_validation(rows, f"{prof.name}: generated vs published")


@app.command("validate")
@user_errors
def validate_cmd(
    trace: str = typer.Argument(..., help="A trace: FILE.csv (generic CSV), FORMAT:PATH or a named trace."),
    profile: str = typer.Option(..., "--profile", "-p", help="Profile to compare with: acme-kalos or acme-seren."),
    days: float = typer.Option(None, "--days", help="Trace length in days (default: from the submit times)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Print a trace's statistics next to the profile's published ones."""
    from loom.workload.generate import validate as validate_rows
    from loom.workload.loaders import NAMED_TRACES, load_trace
    from loom.workload.profiles import get_profile

    prof = get_profile(profile)
    spec = trace if (trace in NAMED_TRACES or ":" in trace and not Path(trace).exists()) else f"csv:{trace}"
    with busy(f"reading {trace} and computing its statistics…"):
        rows = validate_rows(load_trace(spec, cache=False), prof, days)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    _print_validation(rows, f"{trace} vs {prof.name} (published)")


@app.command("profiles")
def profiles_cmd() -> None:
    """Known workload profiles."""
    from loom.workload.profiles import get_profile, profile_names

    table = Table("profile", "cluster", "GPU jobs/day", "classes")
    for name in profile_names():
        p = get_profile(name)
        table.add_row(name, p.cluster, f"{p.jobs_per_day:,.0f}", ", ".join(c.job_class.value for c in p.classes))
    console.print(table)
