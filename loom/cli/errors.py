"""`user_errors`: turn a LoomInputError into one red line and exit status 2 (no traceback)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from loom.cli.common import WideConsole
from loom.errors import LoomInputError

F = TypeVar("F", bound=Callable[..., Any])
err_console = WideConsole(stderr=True)


def user_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LoomInputError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
