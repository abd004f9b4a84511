"""`loom diagnose LOGFILE [--json]`: what made a training job fail, and whether Loom recovers it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from loom.cli.errors import err_console, user_errors


@user_errors
def diagnose(
    logfile: Path = typer.Argument(..., metavar="LOGFILE", help="The failed job's log (stdout and stderr of "
                                   "`loom run` or torchrun; streamed, any size)."),
    as_json: bool = typer.Option(False, "--json", help="Print {category, error_type, root_cause_lines, "
                                 "recoverable, mitigation} as JSON on stdout and nothing else there."),
    retrieval: bool = typer.Option(True, "--retrieval/--no-retrieval", help="Ask the store of past failures "
                                   "(a local embedding model) when the rules cannot settle the cause."),
) -> None:
    """Diagnose a failed training job from its log: Acme's error taxonomy, the root-cause lines behind
    secondary errors, whether recovery is automatic, and a mitigation. See docs/DIAGNOSIS.md."""
    from loom.diagnosis import diagnose as run_diagnosis

    result = run_diagnosis(logfile, retrieval=retrieval)
    for note in result.notes:
        err_console.print(f"note: {note}", style="yellow", highlight=False, soft_wrap=True)
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2, ensure_ascii=False) + "\n")
        return
    _show(result, logfile)


def _show(result: object, logfile: Path) -> None:
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    from loom.cli.common import WideConsole

    d = result  # a loom.diagnosis.Diagnosis
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("category", d.category)  # type: ignore[attr-defined]
    table.add_row("error type", d.error_type)  # type: ignore[attr-defined]
    table.add_row("recoverable", "yes, automatically" if d.recoverable else "no")  # type: ignore[attr-defined]
    table.add_row("mitigation", d.mitigation)  # type: ignore[attr-defined]
    found = {"rules": "rules", "retrieval": "retrieval of past failures", "llm": "external LLM",
             "none": "nothing found"}[d.source]  # type: ignore[attr-defined]
    table.add_row("found by", f"{found}; {d.lines_kept:,} of {d.lines_read:,} lines kept after compression")  # type: ignore[attr-defined]
    if d.ranks:  # type: ignore[attr-defined]
        table.add_row("ranks", ", ".join(map(str, d.ranks)))  # type: ignore[attr-defined]
    for number, line in zip(d.root_cause_line_numbers, d.root_cause_lines):  # type: ignore[attr-defined]
        table.add_row(f"line {number}", Text(line[:400]))
    style = "green" if d.recoverable else ("red" if d.category != "unknown" else "yellow")  # type: ignore[attr-defined]
    WideConsole().print(Panel(table, title=f"diagnosis of {logfile}", border_style=style, expand=False))


def register(app: typer.Typer) -> None:
    app.command("diagnose")(diagnose)
