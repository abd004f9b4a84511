"""User-facing errors.

A `LoomInputError` is a mistake in something the user gave us (a trace row, a
topology file, a config field). The CLI prints it as one clear line naming the
file, line and field, and never shows a traceback for it. `suggest` and
`did_you_mean` offer the names a user probably meant.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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


class FileLineError(LoomInputError):
    """A located error printed as `FILE:LINE: message` (editors and terminals make it clickable).

    `field` is kept for programs (the dotted config path) but not printed: the
    message names it in words, e.g. "unknown key 'polcy' in section 'outputs'".
    """

    def located(self) -> str:
        where = self.source or ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        return f"{where}: {self.message}" if where else self.message


class FileProblem(LoomInputError):
    """Something wrong with a whole file, printed as a sentence about it: `FILE is not text (...)`."""

    def located(self) -> str:
        return f"{self.source} {self.message}" if self.source else self.message


def suggest(name: str, candidates: Iterable[str], n: int = 4) -> list[str]:
    """Known names the user probably meant: those starting with `name` (an exact match in another
    case first), then those containing it (both case-insensitive, shortest first), then difflib's
    close matches."""
    known = sorted({str(c) for c in candidates})
    text = name.strip().lower()
    if not text:
        return []
    starts = sorted((k for k in known if k.lower().startswith(text)), key=_shortest_first)
    contains = sorted((k for k in known if text in k.lower()[1:]), key=_shortest_first)
    by_lower = {k.lower(): k for k in known}
    close = [by_lower[m] for m in difflib.get_close_matches(text, list(by_lower), n=n)]
    return list(dict.fromkeys([*starts, *contains, *close]))[:n]


def _shortest_first(name: str) -> tuple[int, str]:
    return len(name), name


def did_you_mean(name: str, candidates: Iterable[str], n: int = 4, quote: bool = False) -> str:
    """`"; did you mean A, B?"` (empty when nothing is close)."""
    names = suggest(name, candidates, n)
    if not names:
        return ""
    shown = ", ".join(f"'{s}'" if quote else s for s in names)
    return f"; did you mean {shown}?"

