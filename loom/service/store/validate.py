"""Checks on what callers hand the store, so both databases reject the same things
(PostgreSQL enforces column lengths, SQLite does not) with a LoomInputError naming
the field instead of a driver error."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from loom.errors import LoomInputError, did_you_mean
from loom.service.store.rows import JOB_STATES
from loom.service.store.schema import ID_LEN, NAME_LEN

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]*")  # job ids go into URL paths: nothing to escape
_LABEL = re.compile(r"[!-~]+")  # printable ASCII, no spaces


def tenant_name(name: object, field: str = "tenant") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > NAME_LEN:
        raise LoomInputError(f"tenant name must be 1-{NAME_LEN} letters, digits, '.', '_' or '-' "
                             f"starting with a letter or digit (got {name!r})", field=field)
    return name


def identifier(value: object, field: str = "job_id") -> str:
    """A job id: letters, digits and . _ : @ -, at most ID_LEN characters."""
    if not isinstance(value, str) or not _ID.fullmatch(value) or len(value) > ID_LEN:
        raise LoomInputError(f"must be 1-{ID_LEN} characters of letters, digits and . _ : @ - starting with "
                             f"a letter or digit (got {value!r})", field=field)
    return value


def is_identifier(value: object) -> bool:
    """Could this be a stored job id? (Lookups of anything else answer "no such job" without
    asking the database: PostgreSQL rejects some strings, NUL bytes, outright.)"""
    return isinstance(value, str) and len(value) <= ID_LEN and _ID.fullmatch(value) is not None


def label(value: object, field: str) -> str:
    """A node name or idempotency key: printable ASCII without spaces, at most ID_LEN characters."""
    if not isinstance(value, str) or not _LABEL.fullmatch(value) or len(value) > ID_LEN:
        raise LoomInputError(f"must be 1-{ID_LEN} printable ASCII characters without spaces (got {value!r})",
                             field=field)
    return value


def job_state(state: object, field: str = "state") -> str:
    if state not in JOB_STATES:
        raise LoomInputError(f"unknown job state {state!r}{did_you_mean(str(state), JOB_STATES)}", field=field)
    return state  # type: ignore[return-value]


def choice(value: object, allowed: Iterable[str], field: str) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise LoomInputError(f"must be one of {', '.join(allowed)} (got {value!r})", field=field)
    return value  # type: ignore[return-value]


def time_s(value: object, field: str = "at") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise LoomInputError(f"must be a finite time in epoch seconds (got {value!r})", field=field)
    return float(value)


def integer(value: object, field: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LoomInputError(f"must be an integer >= {minimum} (got {value!r})", field=field)
    return value


def json_value(value: Any, field: str) -> Any:
    """`value` as it will read back (tuples become lists): JSON without NaN or infinity."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise LoomInputError(f"must be JSON (strings, numbers, lists, objects): {e}", field=field) from None


def json_object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LoomInputError(f"must be an object (got {type(value).__name__})", field=field)
    return json_value(value, field)


def allocation(value: Any, field: str = "allocation") -> dict[str, Any] | None:
    """None or {"nodes": [names], "gpus": [counts]} of equal lengths (extra keys kept)."""
    if value is None:
        return None
    value = json_object(value, field)
    nodes, gpus = value.get("nodes"), value.get("gpus")
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise LoomInputError("'nodes' must be a list of node names", field=f"{field}.nodes")
    if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0
                                             for g in gpus):
        raise LoomInputError("'gpus' must be a list of GPU counts", field=f"{field}.gpus")
    if len(nodes) != len(gpus):
        raise LoomInputError(f"{len(nodes)} nodes but {len(gpus)} GPU counts", field=field)
    return value


def limit(value: object, maximum: int = 10_000) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise LoomInputError(f"must be an integer from 1 to {maximum} (got {value!r})", field="limit")
    return value
