"""User-facing errors.

A `LoomInputError` is a mistake in something the user gave us (a trace row, a
topology file, a config field). The CLI prints it as one clear line naming the
file, line and field, and never shows a traceback for it.
"""

from __future__ import annotations


class LoomInputError(ValueError):
    """Bad user input, located as precisely as we can."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.field = field
        super().__init__(self.located())

    def located(self) -> str:
        parts = []
        if self.source:
            parts.append(str(self.source))
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.field:
            parts.append(f"field '{self.field}'")
        return f"{', '.join(parts)}: {self.message}" if parts else self.message


class UnknownNameError(LoomInputError):
    """A name (policy, placer, cluster, GPU type...) that no registry knows."""
