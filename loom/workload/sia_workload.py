"""Sia / Pollux elastic workloads (`workload-N.csv`): format `sia-workload`.

Columns: `name, time, application, num_replicas, batch_size` (Sia's
`sia-simulator/workloads/{philly,saturn}/`; 160 jobs over 8 h each).

* `job_id` = `name` (e.g. `cifar10-0`; must be unique); `submit_time` = `time`
  (seconds from the workload start).
* `gpus` = `num_replicas` (one GPU per replica); `model` = `application`
  (cifar10, imagenet, bert, deepspeech2, yolov3, ...); `batch_size` copied.
* Only the arrival time (and the GPU-time bucket the generator drew from) come
  from Philly / Helios-Saturn; `application` and `num_replicas` are randomly
  assigned by Sia's generator.
* **`duration` is None**: the file gives no run time or iteration count (Sia's
  simulator runs each application to its target from a throughput profile). A
  speed model must supply it; the trace-duration replay cannot run these jobs
  as they are.
"""

from __future__ import annotations

from pathlib import Path

from loom.workload.common import Col, TraceJobs, build_specs, read_rows
from loom.workload.loaders import LOADERS, declare_columns

_COLS = [
    Col("name"),
    Col("time", "float", min=0, min_message="negative submit time"),
    Col("application"),
    Col("num_replicas", "int", min=1, min_message="replica count must be ≥ 1"),
    Col("batch_size", "int", required=False, min=1, min_message="batch size must be ≥ 1"),
]


declare_columns("sia-workload", _COLS)


@LOADERS.register("sia-workload")
def load_sia_workload(path: Path) -> TraceJobs:
    raw, frame = read_rows(path, _COLS, "name")
    return TraceJobs(build_specs(frame.height, {
        "job_id": frame["name"].to_list(),
        "submit_time": frame["time"].to_list(),
        "gpus": frame["num_replicas"].to_list(),
        "duration": None,
        "model": frame["application"].to_list(),
        "batch_size": frame["batch_size"].to_list() if "batch_size" in frame.columns else None,
    }))
