"""`loom report` and `loom compare`: look at simulation runs."""

from __future__ import annotations

from pathlib import Path

import typer


from loom.cli.common import busy
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

        with busy(f"writing the report of {run_dir}…"):
            path = user_errors(write_report)(run_dir, out)
        Console().print(f"report written to [bold]{path}[/]", soft_wrap=True)

    @app.command()
    def compare(
        run_dirs: list[Path] = typer.Argument(..., help="Run directories; grouped by trace, ratios are relative to "
                                                        "the first run of each trace group."),
        out: Path = typer.Option(None, "--out", "-o", help="Also plot the runs' CDFs overlaid (.png or .html); "
                                                          "comparison.json is written beside it."),
    ) -> None:
        """Key metrics of several runs side by side, per trace; with --out, their CDFs and comparison.json."""

        @user_errors
        def body() -> None:
            from rich.console import Console
            from rich.markup import escape
            from rich.table import Table

            from loom.report.compare import (
                cell,
                check_out,
                chunks,
                comparison,
                group_by_trace,
                policy_colours,
                policy_of,
                run_labels,
                write_comparison,
            )
            from loom.report.data import load_run

            if out is not None:
                check_out(out)
            with busy(f"reading {len(run_dirs)} runs…"):
                runs = [load_run(p) for p in run_dirs]
            labels = run_labels(run_dirs)
            colours = policy_colours([policy_of(r) for r in runs])
            console = Console()
            for trace, idx in group_by_trace(runs):
                rows = comparison([runs[i] for i in idx])
                for part in chunks(list(range(len(idx)))):
                    heads = [f"[{colours[policy_of(runs[idx[p]])]}]■[/] {escape(labels[idx[p]])}\n"
                             f"{escape(policy_of(runs[idx[p]]))}"
                             for p in part]
                    table = Table("metric", *heads, title=f"trace {escape(trace)} — baseline {escape(labels[idx[0]])} "
                                                          "(ratios vs the baseline)")
                    for row in rows:
                        key = row["metric"]
                        table.add_row(key, *(cell(key, row["values"][p], row["ratios"][p], p == 0) for p in part))
                    console.print(table)
            if out is not None:
                with busy(f"plotting the comparison to {out}…"):
                    written = write_comparison(runs, labels, out)
                console.print(f"comparison written to [bold]{written}[/] "
                              f"(and {out.parent / 'comparison.json'})", soft_wrap=True)

        body()
