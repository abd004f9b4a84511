"""Validation of policy constructor parameters: one set of checks, one wording.

Every check raises `LoomInputError` located at `policy.params.<name>` — where
`loom.run.build` reports a policy's parameters — and states the whole rule
("must be a finite number ≥ 0, got -1"), so the first error a user sees
already gives the valid range. Checks return the value (floats as `float`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from loom.errors import LoomInputError

FIELD = "policy.params"


def field(name: str) -> str:
    """The config path of a policy parameter, for errors a policy raises itself."""
    return f"{FIELD}.{name}"


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _rule(integer: bool, low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """The rule in words: 'a finite number ≥ 0', 'a number in [0, 1)', 'an integer ≥ 1', ..."""
    if low is not None and high is not None:
        interval = f"{'(' if low_open else '['}{_bound(low)}, {_bound(high)}{')' if high_open else ']'}"
        return f"{'an integer' if integer else 'a number'} in {interval}"
    kind = "an integer" if integer else "a finite number"
    if low is not None:
        return f"{kind} {'>' if low_open else '≥'} {_bound(low)}"
    if high is not None:
        return f"{kind} {'<' if high_open else '≤'} {_bound(high)}"
    return kind


def _check(value: Any, name: str, integer: bool, low: float | None, high: float | None,
           low_open: bool, high_open: bool) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float)) and math.isfinite(value)
    ok = ok and (low is None or value > low or (not low_open and value == low))
    ok = ok and (high is None or value < high or (not high_open and value == high))
    if not ok:
        raise LoomInputError(f"must be {_rule(integer, low, high, low_open, high_open)}, got {value!r}",
                             field=field(name))


def number(value: Any, name: str, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number (not a bool) within the bounds; `*_open`: the bound itself is excluded."""
    _check(value, name, False, low, high, low_open, high_open)
    return float(value)


def integer(value: Any, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """A Python int (not a bool, not 4.0) within the closed bounds."""
    _check(value, name, True, low, high, False, False)
    return int(value)


def boolean(value: Any, name: str) -> bool:
    """True or false exactly (YAML `yes`/`1` written as strings or numbers are refused)."""
    if not isinstance(value, bool):
        raise LoomInputError(f"must be true or false, got {value!r}", field=field(name))
    return value


def choice(value: Any, name: str, options: Sequence[str]) -> str:
    """One of `options`."""
    if not isinstance(value, str) or value not in options:
        raise LoomInputError(f"must be one of {', '.join(options)}, got {value!r}", field=field(name))
    return value


__all__ = ["FIELD", "boolean", "choice", "field", "integer", "number"]
