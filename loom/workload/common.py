"""Shared pieces of the CSV trace loaders: reading, typed columns, located errors.

Every loader reads its file as strings (`infer_schema=False`), casts each column
with `parse_columns`, and lets `parse_columns` name the *first* bad row: the
error gives the file, the line (the header is line 1, the first data row line 2)
and the column. Rules shared by all formats:

* a zero duration is kept (the job finishes the instant it starts);
* a negative duration is an error naming the row;
* a job larger than any cluster is kept here; the simulator rejects it at
  arrival with a reason (`loom.sim.engine`);
* rows a format deliberately drops (CPU-only pods, jobs that never ran) are
  counted in `TraceJobs.skipped`, which `loom traces validate/stats` print.
"""

from __future__ import annotations

import csv
import gc
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from itertools import repeat
from pathlib import Path
from typing import Any

import polars as pl

from loom.errors import FileProblem, LoomInputError
from loom.workload.job import FinalStatus, JobClass, JobSpec
from loom.workload.sniff import diagnose, open_text

SPEC_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(JobSpec))
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(JobSpec)}
_SETTERS = {name: JobSpec.__dict__[name].__set__ for name in SPEC_FIELDS}


class TraceJobs(list):  # type: ignore[type-arg]
    """A list of `JobSpec` that also says how many rows were skipped, and why."""

    skipped: dict[str, int]

    def __init__(self, jobs: Iterable[JobSpec] = (), skipped: dict[str, int] | None = None) -> None:
        super().__init__(jobs)
        self.skipped = dict(skipped or {})


@dataclass(frozen=True)
class Col:
    """One CSV column: its kind (str, float, int, bool, datetime), whether it must have a value, a lower bound."""

    name: str
    kind: str = "str"
    required: bool = True
    min: float | None = None
    min_message: str | None = None
    strict_min: bool = False  # value must be > min instead of ≥ min
    type_message: str | None = None  # instead of "not a number" etc.


INT_LIMIT = 1e15  # whole-number columns (GPUs, ids, iterations, ...) beyond this are typos, not data


def read_csv(path: Path, columns: Sequence[Col], *, allow_unknown: bool = True) -> pl.DataFrame:
    """The file as strings; checks the header for missing (and optionally unknown) columns."""
    try:
        if path.stat().st_size == 0:
            raise LoomInputError("empty file (no header line)", source=str(path), line=1)
        frame = pl.read_csv(path, infer_schema=False)
    except pl.exceptions.NoDataError:
        raise LoomInputError("empty file (no header line)", source=str(path), line=1) from None
    except pl.exceptions.ComputeError as exc:
        raise (_not_csv(path) or _ragged(path, exc)) from None
    duplicated = [c for c in frame.columns if "_duplicated_" in c]
    if duplicated:
        name = duplicated[0].split("_duplicated_")[0].strip()
        raise LoomInputError(f"column '{name}' appears more than once in the header", source=str(path), line=1,
                             field=name)
    frame = frame.rename({c: c.strip() for c in frame.columns})
    # trailing blank lines read as all-null rows: drop them (blank lines mid-file stay, and fail as missing values)
    if frame.height and frame.width:
        blank = pl.all_horizontal(pl.all().is_null())
        filled = frame.select((~blank).arg_true()).to_series()
        last = int(filled[-1]) + 1 if filled.len() else 0
        if last < frame.height:
            frame = frame.head(last)
    names = [c.name for c in columns]
    missing = [c.name for c in columns if c.required and c.name not in frame.columns]
    if missing:
        raise _not_csv(path) or LoomInputError(f"missing columns {missing}; expected {names}", source=str(path),
                                               line=1)
    if not allow_unknown:
        unknown = [c for c in frame.columns if c not in names]
        if unknown:
            raise LoomInputError(f"unknown columns {unknown}; allowed: {names}", source=str(path), line=1,
                                 field=unknown[0])
    return frame


def _not_csv(path: Path) -> LoomInputError | None:
    """Why the file is not comma-separated text (semicolons, binary, compressed...), if it is not."""
    problem = diagnose(path)
    return FileProblem(problem, source=str(path)) if problem else None


def _ragged(path: Path, exc: Exception) -> LoomInputError:
    """Locate the first row whose field count differs from the header's."""
    with open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is not None:
            for row in reader:
                if row and len(row) != len(header):
                    return LoomInputError(f"row has {len(row)} fields, the header has {len(header)}",
                                          source=str(path), line=reader.line_num)
    return LoomInputError(f"not a readable CSV: {str(exc).splitlines()[0]}", source=str(path))


_NOT_A = {"float": "not a number", "int": "not an integer", "bool": "not true/false",
          "datetime": "not a timestamp"}


def parse_columns(raw: pl.DataFrame, path: Path, columns: Sequence[Col]) -> pl.DataFrame:
    """Typed columns (Float64, Int64, Boolean, Datetime or stripped Utf8); raises on the first bad row."""
    exprs: list[pl.Expr] = []
    present = [c for c in columns if c.name in raw.columns]
    for c in present:
        s = pl.col(c.name).str.strip_chars()
        s = pl.when(s == "").then(None).otherwise(s)
        if c.kind == "float" or c.kind == "int":
            e = s.cast(pl.Float64, strict=False)
        elif c.kind == "bool":
            low = s.str.to_lowercase()
            e = (pl.when(low.is_in(["true", "1", "yes"])).then(True)
                 .when(low.is_in(["false", "0", "no"])).then(False).otherwise(None))
        elif c.kind == "datetime":
            # `2023-05-17 11:00:58+08:00` (→ UTC), `2017-10-09 07:01:55` or ISO `...T...` (naive, taken as UTC)
            e = pl.coalesce(
                s.str.to_datetime("%Y-%m-%d %H:%M:%S%z", strict=False, time_unit="ms")
                .dt.convert_time_zone("UTC").dt.replace_time_zone(None),
                s.str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False, time_unit="ms"),
                s.str.to_datetime("%Y-%m-%dT%H:%M:%S", strict=False, time_unit="ms"),
            )
        else:
            e = s
        exprs.append(e.alias(c.name))
    typed = raw.select(exprs) if exprs else pl.DataFrame()
    checks: list[tuple[str, pl.Series, str]] = []
    for c in present:
        rawcol = raw[c.name].str.strip_chars()
        empty = rawcol.is_null() | (rawcol == "")
        col = typed[c.name]
        if c.required:
            checks.append((c.name, empty, "missing value"))
        if c.kind in _NOT_A:
            checks.append((c.name, col.is_null() & ~empty, c.type_message or _NOT_A[c.kind]))
        if c.kind == "float":
            checks.append((c.name, col.is_nan() | col.is_infinite(), "not a finite number"))
        if c.kind == "int":
            not_int = col.is_nan() | col.is_infinite() | (col != col.floor())
            checks.append((c.name, col.is_not_null() & not_int, "not an integer"))
            checks.append((c.name, col.abs() > INT_LIMIT, f"out of range (|value| > {INT_LIMIT:.0e})"))
        if c.min is not None:
            bad = (col <= c.min) if c.strict_min else (col < c.min)
            checks.append((c.name, bad, c.min_message or f"must be {'>' if c.strict_min else '≥'} {c.min:g}"))
    first: tuple[int, str, str] | None = None
    for column, bad, message in checks:
        bad = bad.fill_null(False)
        if bad.any():
            row = int(bad.arg_true()[0])
            if first is None or row < first[0]:
                first = (row, column, message)
    if first is not None:
        row, column, message = first
        value = raw[column][row]
        shown = "empty" if value is None or not value.strip() else repr(value)
        raise LoomInputError(f"{message}: {shown}", source=str(path), line=row + 2, field=column)
    casts = [pl.col(c.name).cast(pl.Int64) for c in present if c.kind == "int"]
    return typed.with_columns(casts) if casts else typed


def check_rows(bad: pl.Series, raw: pl.DataFrame, path: Path, column: str, message: str) -> None:
    """Raise naming the first row where `bad` holds."""
    bad = bad.fill_null(False)
    if bad.any():
        row = int(bad.arg_true()[0])
        raise LoomInputError(f"{message}: {raw[column][row]!r}", source=str(path), line=row + 2, field=column)


def unique_ids(ids: pl.Series, raw: pl.DataFrame, path: Path, column: str) -> None:
    check_rows(~ids.is_first_distinct(), raw, path, column, "duplicate job id")


def epoch_seconds(col: pl.Series) -> pl.Series:
    """Datetime → seconds since the Unix epoch (float)."""
    return col.dt.epoch("ms").cast(pl.Float64) / 1000.0


def ceil_gpus(size: pl.Series) -> tuple[list[int], list[float | None]]:
    """Fractional GPU sizes → (whole GPUs rounded up, fraction or None when whole)."""
    values = size.to_list()
    gpus = [max(1, math.ceil(v)) for v in values]
    fractions = [None if v == int(v) else float(v) for v in values]
    return gpus, fractions


def build_specs(n: int, columns: dict[str, Any]) -> list[JobSpec]:
    """`n` JobSpecs from per-field lists (or one constant per field).

    The values must already be validated (every loader checks its columns with
    `parse_columns` first): this bypasses `JobSpec.__init__`/`__post_init__`,
    which takes most of the time for 100k-job traces.
    """
    unknown = set(columns) - set(SPEC_FIELDS)
    if unknown:
        raise TypeError(f"not JobSpec fields: {sorted(unknown)}")
    values: list[tuple[Any, Any]] = []
    for name in SPEC_FIELDS:
        value = columns.get(name, _DEFAULTS[name])
        if isinstance(value, list):
            if len(value) != n:
                raise ValueError(f"column {name}: {len(value)} values for {n} jobs")
        else:
            value = repeat(value, n)
        values.append((_SETTERS[name], value))
    enabled = gc.isenabled()
    gc.disable()  # 100k new objects would trigger many useless GC passes
    try:
        jobs = list(map(object.__new__, repeat(JobSpec, n)))
        for setter, value in values:
            # map/deque keep the per-attribute loop in C: ~0.1 s for 111k jobs × 20 fields
            deque(map(setter, jobs, value), maxlen=0)
    finally:
        if enabled:
            gc.enable()
    return jobs


STATUS_NAMES: dict[str, FinalStatus] = {s.value: s for s in FinalStatus}
CLASS_NAMES: dict[str, JobClass] = {c.value: c for c in JobClass}


def read_rows(path: Path, columns: Sequence[Col], id_column: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Raw strings and typed columns of a trace file whose `id_column` must be unique."""
    raw = read_csv(path, columns)
    frame = parse_columns(raw, path, columns)
    unique_ids(frame[id_column], raw, path, id_column)
    return raw, frame
