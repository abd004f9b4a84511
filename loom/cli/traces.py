"""`loom traces ...`: validate and summarise trace files."""

from __future__ import annotations

import typer

app = typer.Typer(help="Validate and summarise traces.", no_args_is_help=True)
