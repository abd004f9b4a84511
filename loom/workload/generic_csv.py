"""A documented generic CSV job list: format `csv`.

Required columns: `job_id, submit_time, gpus, duration` (seconds; `gpus` an
integer ≥ 1; `duration` ≥ 0, 0 kept). Optional columns, one per `JobSpec` field:
`gpu_type, job_class` (pretrain/sft/eval/debug/other/unknown), `user, vc,
final_status` (completed/failed/cancelled/unknown), `model, preemptible`
(true/false/1/0/yes/no), `priority` (integer), `announce_time` (≤ submit_time),
`gpu_types` (`|`-separated), `gpu_fraction` (0 < f ≤ 1), `cpu_milli,
memory_mib, iterations, batch_size` (integers), `deadline`.
An empty cell means "not given" (the field's default). Any other column is an
error (it is most likely a typo).
"""

from __future__ import annotations

from pathlib import Path

from loom.workload.common import (CLASS_NAMES, STATUS_NAMES, Col, TraceJobs, build_specs, check_rows,
                                  parse_columns, read_csv, unique_ids)
from loom.workload.job import FinalStatus, JobClass
from loom.workload.loaders import LOADERS, declare_columns

_COLS = [
    Col("job_id"),
    Col("submit_time", "float"),
    Col("gpus", "int", min=1, min_message="GPU count must be ≥ 1"),
    Col("duration", "float", min=0, min_message="negative duration"),
    Col("gpu_type", required=False),
    Col("job_class", required=False),
    Col("user", required=False),
    Col("vc", required=False),
    Col("final_status", required=False),
    Col("model", required=False),
    Col("preemptible", "bool", required=False),
    Col("priority", "int", required=False),
    Col("announce_time", "float", required=False),
    Col("gpu_types", required=False),
    Col("gpu_fraction", "float", required=False, min=0, strict_min=True, min_message="must be > 0"),
    Col("cpu_milli", "int", required=False, min=0),
    Col("memory_mib", "int", required=False, min=0),
    Col("iterations", "int", required=False, min=1),
    Col("batch_size", "int", required=False, min=1),
    Col("deadline", "float", required=False),
]


declare_columns("csv", _COLS)


@LOADERS.register("csv")
def load_csv(path: Path) -> TraceJobs:
    raw = read_csv(path, _COLS, allow_unknown=False)
    frame = parse_columns(raw, path, _COLS)
    unique_ids(frame["job_id"], raw, path, "job_id")
    cols = frame.columns
    if "job_class" in cols:
        check_rows(frame["job_class"].is_not_null() & ~frame["job_class"].str.to_lowercase().is_in(list(CLASS_NAMES)),
                   raw, path, "job_class", f"unknown job class (known: {', '.join(CLASS_NAMES)})")
    if "final_status" in cols:
        check_rows(frame["final_status"].is_not_null()
                   & ~frame["final_status"].str.to_lowercase().is_in(list(STATUS_NAMES)),
                   raw, path, "final_status", f"unknown final status (known: {', '.join(STATUS_NAMES)})")
    if "announce_time" in cols:
        check_rows(frame["announce_time"] > frame["submit_time"], raw, path, "announce_time",
                   "announced after it is submitted")
    if "gpu_fraction" in cols:
        check_rows(frame["gpu_fraction"] > 1, raw, path, "gpu_fraction", "must be ≤ 1")
    n = frame.height
    columns: dict[str, object] = {
        "job_id": frame["job_id"].to_list(),
        "submit_time": frame["submit_time"].to_list(),
        "gpus": frame["gpus"].to_list(),
        "duration": frame["duration"].to_list(),
    }
    for name in ("gpu_type", "user", "vc", "model", "announce_time", "gpu_fraction", "cpu_milli", "memory_mib",
                 "iterations", "batch_size", "deadline"):
        if name in cols:
            columns[name] = frame[name].to_list()
    if "job_class" in cols:
        columns["job_class"] = [JobClass.UNKNOWN if v is None else CLASS_NAMES[v.lower()]
                                for v in frame["job_class"].to_list()]
    if "final_status" in cols:
        columns["final_status"] = [FinalStatus.UNKNOWN if v is None else STATUS_NAMES[v.lower()]
                                   for v in frame["final_status"].to_list()]
    if "preemptible" in cols:
        columns["preemptible"] = [bool(v) for v in frame["preemptible"].to_list()]
    if "priority" in cols:
        columns["priority"] = [0 if v is None else v for v in frame["priority"].to_list()]
    if "gpu_types" in cols:
        types = [None if not v else tuple(t.strip() for t in v.split("|") if t.strip()) or None
                 for v in frame["gpu_types"].to_list()]
        columns["gpu_types"] = types
        if "gpu_type" not in cols:
            columns["gpu_type"] = [t[0] if t and len(t) == 1 else None for t in types]
    return TraceJobs(build_specs(n, columns))
