"""Parquet cache of parsed traces.

Where: `$LOOM_CACHE` (a directory; `off`, `0` or `none` disables the cache), else
`~/.cache/loom/traces`. Key: SHA-256 of (format, absolute path, file size,
mtime_ns, `CACHE_VERSION`, the JobSpec field names), so editing or touching the
source, changing a loader (bump `CACHE_VERSION`) or adding a JobSpec field
invalidates it. The table has one column per JobSpec field that any job sets (enums as
their values, `gpu_types` as a list); skip counts and the fields no job sets travel in
the Parquet metadata.
A cache file that cannot be read is ignored and rewritten; a cache that cannot
be written is skipped silently (the trace still loads).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import polars as pl

from loom.workload.common import _DEFAULTS, SPEC_FIELDS, TraceJobs, build_specs
from loom.workload.job import FinalStatus, JobClass

CACHE_VERSION = "3"
_SCHEMA = {
    "job_id": pl.Utf8, "submit_time": pl.Float64, "gpus": pl.Int64, "duration": pl.Float64, "gpu_type": pl.Utf8,
    "job_class": pl.Utf8, "user": pl.Utf8, "vc": pl.Utf8, "final_status": pl.Utf8, "model": pl.Utf8,
    "preemptible": pl.Boolean, "priority": pl.Int64, "announce_time": pl.Float64, "gpu_types": pl.List(pl.Utf8),
    "gpu_fraction": pl.Float64, "cpu_milli": pl.Int64, "memory_mib": pl.Int64, "iterations": pl.Int64,
    "batch_size": pl.Int64, "deadline": pl.Float64,
}
_CLASSES = {c.value: c for c in JobClass}
_STATUSES = {s.value: s for s in FinalStatus}


def cache_dir() -> Path | None:
    env = os.environ.get("LOOM_CACHE")
    if env is not None and env.strip().lower() in ("", "0", "off", "none", "false"):
        return None
    return Path(env) if env else Path.home() / ".cache" / "loom" / "traces"


def cache_path(fmt: str, path: Path) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    st = path.stat()
    key = "\x00".join([fmt, str(path.resolve()), str(st.st_size), str(st.st_mtime_ns), CACHE_VERSION,
                       ",".join(SPEC_FIELDS)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return root / f"{fmt}-{path.stem}-{digest}.parquet"


def cached_load(fmt: str, path: Path, parse: Callable[[], TraceJobs]) -> TraceJobs:
    target = cache_path(fmt, path)
    if target is not None and target.is_file():
        try:
            return read_cache(target)
        except Exception:  # noqa: BLE001 - a corrupt cache is rebuilt, never fatal
            pass
    jobs = parse()
    if target is not None:
        try:
            write_cache(target, jobs)
        except OSError:
            pass
    return jobs


def write_cache(target: Path, jobs: TraceJobs) -> None:
    """The jobs as Parquet: a column per JobSpec field that any job sets; the fields no job sets
    (all None) are listed in the metadata instead (`absent`), so a read skips them."""
    data: dict[str, list] = {}
    absent: list[str] = []
    for name in SPEC_FIELDS:
        values = [getattr(j, name) for j in jobs]
        if jobs and _DEFAULTS[name] is None and all(v is None for v in values):
            absent.append(name)
            continue
        if name in ("job_class", "final_status"):
            values = [v.value for v in values]
        elif name == "gpu_types":
            values = [list(v) if v is not None else None for v in values]
        data[name] = values
    frame = pl.DataFrame(data, schema={name: _SCHEMA[name] for name in data})
    meta = {"skipped": jobs.skipped, "absent": absent}
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    os.close(fd)
    try:
        frame.write_parquet(tmp, metadata={"loom": json.dumps(meta)})
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_cache(target: Path) -> TraceJobs:
    """The jobs of a cache file. Read with polars alone (pyarrow's reader pulls in pyarrow.dataset
    and pandas: ~0.5 s and ~100 MB for a 1 MB file). A column holding one value for every job
    (e.g. `job_class` of Philly) is passed on as that constant, and repeated strings share one
    object, so the specs hold no per-job copies of them."""
    meta = json.loads(pl.read_parquet_metadata(target)["loom"])
    absent = set(meta["absent"])
    present = [name for name in SPEC_FIELDS if name not in absent]
    frame = pl.read_parquet(target, columns=present)  # absent fields: nothing to read (~15 MB less RSS)
    if frame.columns != present or not absent <= set(SPEC_FIELDS):
        raise ValueError("cache columns do not match JobSpec")
    n = frame.height
    columns: dict[str, object] = {}
    for name in present:
        col = frame[name]
        nulls = col.null_count()
        if nulls == n and n:
            continue  # all defaults
        if n and not nulls and col.dtype != pl.List(pl.Utf8) and col.n_unique() == 1:
            values: list = col.head(1).to_list()  # one value for every job: passed on as a constant
        else:
            values = col.to_list()
        if name == "job_class":
            values = [_CLASSES[v] for v in values]
        elif name == "final_status":
            values = [_STATUSES[v] for v in values]
        elif name == "gpu_types":
            values = [tuple(v) if v is not None else None for v in values]
        elif col.dtype == pl.Utf8 and name != "job_id":
            shared: dict[str, str] = {}
            values = list(map(shared.setdefault, values, values))  # one object per distinct string
        columns[name] = values if len(values) == n else values[0]
    return TraceJobs(build_specs(n, columns), meta.get("skipped", {}))
