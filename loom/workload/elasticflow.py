"""ElasticFlow's Philly VC trace (`philly_103959.csv`): format `elasticflow`.

Columns: `job_id, submit_time, real_iteration, model_name, ddl, batch_size,
num_gpu, real_duration, duration, iteration` (times in seconds, relative to
the first job of VC 103959).

* `submit_time` copied; `gpus` = `num_gpu`; `vc` = "103959" (the file holds
  the jobs of that one Philly VC).
* `duration` = `real_duration`: the measured run time on `num_gpu` GPUs. The
  file's `duration` column is ElasticFlow's *estimate* given to its scheduler
  (equal to `real_duration` in this file, but not by definition); it is read
  but not used. Likewise `iteration` (the estimate) vs `real_iteration`.
* `iterations` = `real_iteration`; `batch_size` copied.
* `model` = `model_name`: **synthetic** (vgg16, resnet50, bert, ...), drawn by
  ElasticFlow's generator, not recorded by Philly.
* `deadline` = `ddl`: an **absolute** time on the `submit_time` clock (in the
  file `ddl ≥ submit_time` always and `(ddl − submit_time) / real_duration`
  is uniform in [0.5, 1.5]; `ddl / real_duration` is not). Also synthetic. A
  deadline before `submit_time` is an error naming the row. About half the
  jobs (466 of 876) cannot meet their deadline at their requested size: the
  trace is meant for elastic (scale-out) deadline schedulers.
"""

from __future__ import annotations

from pathlib import Path

from loom.workload.common import Col, TraceJobs, build_specs, check_rows, read_rows
from loom.workload.loaders import LOADERS, declare_columns

VC = "103959"
_COLS = [
    Col("job_id"),
    Col("submit_time", "float", min=0, min_message="negative submit time"),
    Col("real_iteration", "int", required=False, min=1, min_message="iterations must be ≥ 1"),
    Col("model_name", required=False),
    Col("ddl", "float", required=False),
    Col("batch_size", "int", required=False, min=1, min_message="batch size must be ≥ 1"),
    Col("num_gpu", "int", min=1, min_message="GPU count must be ≥ 1"),
    Col("real_duration", "float", min=0, min_message="negative duration"),
    Col("duration", "float", required=False),
    Col("iteration", "int", required=False),
]


declare_columns("elasticflow", _COLS)


@LOADERS.register("elasticflow")
def load_elasticflow(path: Path) -> TraceJobs:
    raw, frame = read_rows(path, _COLS, "job_id")
    if "ddl" in frame.columns:
        check_rows(frame["ddl"] < frame["submit_time"], raw, path, "ddl", "deadline before submission")

    def opt(col: str) -> list | None:
        return frame[col].to_list() if col in frame.columns else None

    return TraceJobs(build_specs(frame.height, {
        "job_id": frame["job_id"].to_list(),
        "submit_time": frame["submit_time"].to_list(),
        "gpus": frame["num_gpu"].to_list(),
        "duration": frame["real_duration"].to_list(),
        "vc": VC,
        "model": opt("model_name"),
        "iterations": opt("real_iteration"),
        "batch_size": opt("batch_size"),
        "deadline": opt("ddl"),
    }))
