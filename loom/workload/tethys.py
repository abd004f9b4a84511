"""Tethys simulator job lists (e.g. `converted_kalos_trace.csv`): format `tethys`.

Columns: `job_id, arrival_time, num_iteration, iteration_computing_time,
iteration_networking_time, gpu_workers, ps, gpu_per_worker,
cpu_per_gpu_worker, cpu_per_ps_worker, tensorsizes, profiled_network`.
The shared file is 319 large Acme-Kalos jobs re-encoded by a third party.

* `submit_time` = `arrival_time` (seconds from the first job).
* `gpus` = `gpu_workers × gpu_per_worker` (both integers ≥ 1; `8.0` is read
  as 8).
* `iterations` = `num_iteration`.
* `duration` = `num_iteration × (iteration_computing_time +
  iteration_networking_time)`, in **seconds** (per-iteration times are 0.5 s
  compute + 0.25 or 0.75 s network in the Kalos file; the result has p50 498 s
  and max 18.1 days, matching the README). This is **inferred**, not
  documented by the converter; the per-iteration times look synthetic, so the
  run time is only as good as the conversion's.
* `job_class` stays unknown (type, state and user were dropped by the
  conversion); `gpu_type` None. `ps`, CPU, `tensorsizes` and
  `profiled_network` are read but not used.
"""

from __future__ import annotations

from pathlib import Path

from loom.workload.common import Col, TraceJobs, build_specs, read_rows
from loom.workload.loaders import LOADERS, declare_columns

_COLS = [
    Col("job_id"),
    Col("arrival_time", "float", min=0, min_message="negative arrival time"),
    Col("num_iteration", "int", min=0, min_message="negative iteration count"),
    Col("iteration_computing_time", "float", min=0, min_message="negative time"),
    Col("iteration_networking_time", "float", min=0, min_message="negative time"),
    Col("gpu_workers", "int", min=1, min_message="worker count must be ≥ 1"),
    Col("ps", "int", required=False, min=0, min_message="negative PS count"),
    Col("gpu_per_worker", "int", min=1, min_message="GPUs per worker must be ≥ 1"),
    Col("cpu_per_gpu_worker", "float", required=False),
    Col("cpu_per_ps_worker", "float", required=False),
    Col("tensorsizes", "float", required=False),
    Col("profiled_network", "float", required=False),
]


declare_columns("tethys", _COLS)


@LOADERS.register("tethys")
def load_tethys(path: Path) -> TraceJobs:
    raw, frame = read_rows(path, _COLS, "job_id")
    per_iter = frame["iteration_computing_time"] + frame["iteration_networking_time"]
    duration = frame["num_iteration"].cast(float) * per_iter
    return TraceJobs(build_specs(frame.height, {
        "job_id": frame["job_id"].to_list(),
        "submit_time": frame["arrival_time"].to_list(),
        "gpus": (frame["gpu_workers"] * frame["gpu_per_worker"]).to_list(),
        "duration": duration.to_list(),
        "iterations": frame["num_iteration"].to_list(),
    }))
