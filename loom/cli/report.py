"""`loom report` and `loom compare`: look at simulation runs."""

from __future__ import annotations

import typer



def register(app: typer.Typer) -> None:
    """Add `report` and `compare` as top-level commands of `loom`."""
