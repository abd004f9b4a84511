"""`loom experiment FILE.yaml`: run a grid of simulations (local processes or Ray) and compare them."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from loom.cli.common import use_plan_cache
from loom.cli.errors import err_console, user_errors

TABLE_METRICS = ("avg_jct_s", "p99_jct_s", "avg_queue_s", "gpu_utilization")


def register(app: typer.Typer) -> None:
    """Add `experiment` as a top-level command of `loom`."""

    @app.command()
    @user_errors
    def experiment(
        file: Path = typer.Argument(..., help="Experiment YAML: config fields plus a `grid:` of lists."),
        out: Path = typer.Option(None, "--out", "-o", help="Output directory (default: the file's outputs.dir, "
                                 "else runs/<file name>); each run goes to OUT/<run-name>/."),
        workers: int = typer.Option(None, "--workers", "-j", min=1,
                                    help="Parallel local processes (default: the number of CPUs)."),
        ray_address: str = typer.Option(None, "--ray-address", help="Run each grid point as a Ray task: "
                                        "'local' (start Ray here), 'auto' or ray://HOST:PORT. Needs `pip install "
                                        "ray`; remote workers need loom installed and a shared --out."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the expanded grid and exit."),
        plan_cache: Path = typer.Option(None, "--plan-cache", help="SQLite file the runs share for plan "
                                        "searches' answers (the LOOM_PLAN_CACHE variable does the same)."),
    ) -> None:
        """Run the cartesian product of a grid of configs; write each run, summary.csv/.parquet and comparison.html."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Table

        from loom.experiment import RunResult, import_ray, load_experiment, run_points, value_label, write_combined

        use_plan_cache(plan_cache)
        console = Console()
        exp = load_experiment(file, out)
        points = exp.points
        invalid = [p for p in points if not p.valid]

        if dry_run:
            table = Table(*(a.key for a in exp.axes), "status",
                          title=f"{len(points)} runs → {exp.out}/<run>/ ({len(invalid)} invalid)")
            table.add_column("run", overflow="fold")
            for p in points:
                table.add_row(*(value_label(v) for v in p.values.values()),
                              "ok" if p.valid else "[red]invalid[/]", p.name)
            console.print(table)
            for p in invalid:
                err_console.print(f"[bold red]invalid:[/] {p.error}", highlight=False, soft_wrap=True)
            if invalid:
                raise typer.Exit(1)
            return

        if ray_address:
            import_ray()  # a clear error before anything runs
        for p in invalid:
            err_console.print(f"[bold red]invalid, skipped:[/] {p.error}", highlight=False, soft_wrap=True)
        where = f"Ray ({ray_address})" if ray_address else f"{workers or 'all'} local worker(s)"
        err_console.print(f"{len(points) - len(invalid)} of {len(points)} runs on {where} → {exp.out}",
                          highlight=False)

        t0 = time.perf_counter()
        counts = {"ok": 0, "failed": 0}
        with Progress(TextColumn("[bold]runs"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("[green]{task.fields[ok]} ok[/] [red]{task.fields[failed]} failed[/]"),
                      TimeElapsedColumn(), console=err_console, transient=False) as bar:
            task = bar.add_task("runs", total=len(points), ok=0, failed=0)

            def on_result(res: RunResult) -> None:
                counts["ok" if res.ok else "failed"] += 1
                bar.update(task, advance=1, ok=counts["ok"], failed=counts["failed"])
                if res.status == "failed":
                    bar.console.print(f"[bold red]failed:[/] {res.name}: {res.error}", highlight=False,
                                      soft_wrap=True)

            results = run_points(points, workers, ray_address, on_result)
        wall = time.perf_counter() - t0
        written = write_combined(exp, results, wall)

        table = Table(*(a.key for a in exp.axes), "status", *TABLE_METRICS,
                      title=f"experiment {file.name}: {len(results)} runs in {wall:.1f} s")
        for r in results:
            cells = [_fmt(r.summary.get(k)) for k in TABLE_METRICS]
            table.add_row(*(value_label(v) for v in r.values.values()),
                          "ok" if r.ok else f"[red]{r.status}[/]", *cells)
        console.print(table)
        console.print(f"outputs in [bold]{exp.out}[/]: {', '.join(written)} and one directory per run",
                      soft_wrap=True)
        failed = [r for r in results if not r.ok]
        if failed:
            err_console.print(f"[bold red]{len(failed)} of {len(results)} runs did not succeed:[/]")
            for r in failed:
                err_console.print(f"  {r.name}: {r.error}", highlight=False, soft_wrap=True, markup=False)
            raise typer.Exit(1)


def _fmt(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{value:,}" if isinstance(value, int) else str(value)
