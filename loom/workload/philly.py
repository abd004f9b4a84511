"""RFold-format traces (`#job id, arrival time (sec), topology, shape, size, duration (sec)`).

This is how the full 111,549-job Philly list is published (shuoshuc/RFold).
Rules: rows are validated with file and line; a duration of 0 is kept (the job
finishes the instant it starts); sizes must be positive integers.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from loom.errors import LoomInputError
from loom.workload.job import JobClass, JobSpec
from loom.workload.loaders import LOADERS

RFOLD_COLUMNS = ["#job id", "arrival time (sec)", "topology", "shape", "size", "duration (sec)"]


@LOADERS.register("rfold")
def load_rfold(path: Path) -> list[JobSpec]:
    frame = _read(path)
    ids = frame["#job id"].cast(pl.Utf8).to_list()
    arrivals = frame["arrival time (sec)"].to_list()
    sizes = frame["size"].to_list()
    durations = frame["duration (sec)"].to_list()
    return [
        JobSpec(job_id=i, submit_time=a, gpus=s, duration=d, job_class=JobClass.UNKNOWN)
        for i, a, s, d in zip(ids, arrivals, sizes, durations)
    ]


def _read(path: Path) -> pl.DataFrame:
    try:
        frame = pl.read_csv(path, infer_schema=False)
    except (pl.exceptions.ComputeError, pl.exceptions.NoDataError) as exc:
        raise LoomInputError(f"not a readable CSV: {str(exc).splitlines()[0]}", source=str(path)) from None
    missing = [c for c in RFOLD_COLUMNS if c not in frame.columns]
    if missing:
        raise LoomInputError(f"missing columns {missing}; expected {RFOLD_COLUMNS}", source=str(path), line=1)
    typed = frame.select(
        pl.col("#job id").str.strip_chars(),
        pl.col("arrival time (sec)").str.strip_chars().cast(pl.Float64, strict=False),
        pl.col("size").str.strip_chars().cast(pl.Int64, strict=False),
        pl.col("duration (sec)").str.strip_chars().cast(pl.Float64, strict=False),
    )
    _check(frame, typed, path)
    return typed


def _check(raw: pl.DataFrame, typed: pl.DataFrame, path: Path) -> None:
    """Name the first bad row: line numbers count the header as line 1."""
    checks = [
        ("#job id", typed["#job id"].is_null() | (typed["#job id"] == ""), "empty job id"),
        ("arrival time (sec)", typed["arrival time (sec)"].is_null(), "not a number"),
        ("arrival time (sec)", typed["arrival time (sec)"] < 0, "negative arrival time"),
        ("size", typed["size"].is_null(), "not an integer"),
        ("size", typed["size"] < 1, "GPU count must be ≥ 1"),
        ("duration (sec)", typed["duration (sec)"].is_null(), "not a number"),
        ("duration (sec)", typed["duration (sec)"] < 0, "negative duration"),
        ("#job id", ~typed["#job id"].is_first_distinct(), "duplicate job id"),
    ]
    for column, bad, message in checks:
        bad = bad.fill_null(False)
        if bad.any():
            row = int(bad.arg_true()[0])
            value = raw[column][row]
            raise LoomInputError(f"{message}: {value!r}", source=str(path), line=row + 2, field=column)
