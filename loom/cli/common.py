"""Helpers more than one `loom` command uses.

They live here, not in `loom/cli/main.py`, because `main` imports every
command module: a command importing `main` back would be an import loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console, ConsoleDimensions

PIPED_WIDTH = 200  # columns when the output is not a terminal (rich would assume 80 and cut tables)


class WideConsole(Console):
    """A rich console that, writing to a pipe or a file, is `PIPED_WIDTH` wide instead of 80,
    so tables are not cut with '…'. A terminal, an explicit `width` or `$COLUMNS` still rule."""

    @property  # type: ignore[override]
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and "COLUMNS" not in self._environ and not self.is_terminal:
            return ConsoleDimensions(max(size.width, PIPED_WIDTH), size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


def use_plan_cache(path: Path | None) -> None:
    """Point `loom.perf.plan_cache` at `path` for this process and the workers it starts."""
    if path is not None:
        import os

        from loom.perf.plan_cache import ENV, PlanCache

        PlanCache(path).close()  # a clear error now if it cannot be opened
        os.environ[ENV] = str(path)


@contextmanager
def busy(text: str) -> Iterator[None]:
    """A spinner on stderr naming what a slow step is doing (a trace load, a search, a MIP, a
    report), so no command sits silent for seconds; nothing when stderr is not a terminal, so
    pipes and `--json` output stay clean. Transient: the line is gone when the step ends."""
    from loom.cli import errors  # late: `errors` imports this module; tests swap `errors.err_console`

    console = errors.err_console
    if not console.is_terminal:
        yield
        return
    with console.status(text, spinner="dots"):
        yield
