"""`loom report` and `loom compare`: look at simulation runs."""

from __future__ import annotations

from pathlib import Path

import typer


from loom.cli.errors import user_errors


def register(app: typer.Typer) -> None:
    """Add `report` and `compare` as top-level commands of `loom`."""

    @app.command()
    def report(
        run_dir: Path = typer.Argument(..., help="A run directory written by `loom simulate`."),
        out: Path = typer.Option(None, "--out", "-o", help="HTML file to write (default RUN_DIR/report.html)."),
    ) -> None:
        """Write a self-contained HTML report of one run (CDFs, utilisation, heatmap, placements, decisions)."""

        from rich.console import Console

        from loom.report.html import write_report

        path = user_errors(write_report)(run_dir, out)
        Console().print(f"report written to [bold]{path}[/]", soft_wrap=True)

    @app.command()
    def compare(
        run_dirs: list[Path] = typer.Argument(..., help="Run directories; ratios are relative to the first."),
        out: Path = typer.Option(None, "--out", "-o", help="Also plot the runs' CDFs overlaid (.png or .html)."),
    ) -> None:
        """Key metrics of several runs side by side; with --out, their JCT and queueing-delay CDFs."""

        @user_errors
        def body() -> None:
            from rich.console import Console
            from rich.table import Table

            from loom.report.compare import cell, check_out, comparison, run_labels, write_comparison
            from loom.report.data import load_run

            if out is not None:
                check_out(out)
            runs = [load_run(p) for p in run_dirs]
            labels = run_labels(run_dirs)
            table = Table("metric", *labels, title="runs compared (ratio vs the first run)")
            for row in comparison(runs):
                key = row["metric"]
                table.add_row(key, *(cell(key, v, q, i == 0)
                                     for i, (v, q) in enumerate(zip(row["values"], row["ratios"]))))
            console = Console()
            console.print(table)
            if out is not None:
                console.print(f"comparison written to [bold]{write_comparison(runs, labels, out)}[/]")

        body()
