"""Sia's Philly job list (`timestamp, duration, num_gpus, gpu_time, cluster`): format `sia-philly`.

* `timestamp` is a wall clock (e.g. `2017-10-09 07:01:55`), taken as the submit
  time; `submit_time` = seconds since the earliest timestamp in the file.
* `duration` (s, run time, ≥ 0; 0 is kept), `num_gpus` (integer ≥ 1).
* `cluster` is the Philly VC hash → `JobSpec.vc`.
* `gpu_time` (= duration × num_gpus) is read but not used.
* The file has no job id: `job_id` is the 0-based data-row index (line − 2).
"""

from __future__ import annotations

from pathlib import Path

from loom.workload.common import Col, TraceJobs, build_specs, epoch_seconds, parse_columns, read_csv
from loom.workload.loaders import LOADERS, declare_columns

_COLS = [
    Col("timestamp", "datetime"),
    Col("duration", "float", min=0, min_message="negative duration"),
    Col("num_gpus", "int", min=1, min_message="GPU count must be ≥ 1"),
    Col("gpu_time", "float", required=False),
    Col("cluster", required=False),
]


declare_columns("sia-philly", _COLS)


@LOADERS.register("sia-philly")
def load_sia_philly(path: Path) -> TraceJobs:
    frame = parse_columns(read_csv(path, _COLS), path, _COLS)
    n = frame.height
    seconds = epoch_seconds(frame["timestamp"])
    submit = (seconds - seconds.min()).to_list() if n else []
    return TraceJobs(build_specs(n, {
        "job_id": [str(i) for i in range(n)],
        "submit_time": submit,
        "gpus": frame["num_gpus"].to_list(),
        "duration": frame["duration"].to_list(),
        "vc": frame["cluster"].to_list() if "cluster" in frame.columns else None,
    }))
