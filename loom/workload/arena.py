"""Crius / Arena simulator traces (`simulate_trace_{philly,pai,venus}.csv`): format `arena`.

Columns: `job_id, submission_time, num_iteration, model_name, deadline,
batch_size, num_gpu, gpu_type`.

* `submit_time` = `submission_time` (seconds, as in the file: Philly/PAI are
  relative, Venus is a Unix time); `deadline` is on the same clock.
* `model` = `model_name` (e.g. `bert__2.6B`); `iterations` = `num_iteration`;
  `batch_size`, `deadline` copied; `gpus` = `num_gpu`.
* `gpu_type` (lower case) → Loom GPU names: a100 → A100-40GB (Crius' simulated
  cluster; the paper names only "A100"), a40 → A40, a10 → A10, v100 → V100.
  Unknown names are an error naming the row.
* **`duration` is None**: the trace gives iterations, not run time. A speed
  model (iterations × per-iteration time of the model on the GPU type) must
  supply it; the plain trace-duration replay cannot run these jobs.
"""

from __future__ import annotations

from pathlib import Path

from loom.workload.common import Col, TraceJobs, build_specs, check_rows, read_rows
from loom.workload.loaders import LOADERS, declare_columns

GPU_NAMES = {"a100": "A100-40GB", "a40": "A40", "a10": "A10", "v100": "V100"}
_COLS = [
    Col("job_id"),
    Col("submission_time", "float", min=0, min_message="negative submission time"),
    Col("num_iteration", "int", min=1, min_message="iterations must be ≥ 1"),
    Col("model_name"),
    Col("deadline", "float", required=False),
    Col("batch_size", "int", required=False, min=1, min_message="batch size must be ≥ 1"),
    Col("num_gpu", "int", min=1, min_message="GPU count must be ≥ 1"),
    Col("gpu_type"),
]


declare_columns("arena", _COLS)


@LOADERS.register("arena")
def load_arena(path: Path) -> TraceJobs:
    raw, frame = read_rows(path, _COLS, "job_id")
    lowered = frame["gpu_type"].str.to_lowercase()
    check_rows(~lowered.is_in(list(GPU_NAMES)), raw, path, "gpu_type",
               f"unknown GPU type (known: {', '.join(GPU_NAMES)})")
    if "deadline" in frame.columns:
        check_rows(frame["deadline"] < frame["submission_time"], raw, path, "deadline", "deadline before submission")
    n = frame.height
    return TraceJobs(build_specs(n, {
        "job_id": frame["job_id"].to_list(),
        "submit_time": frame["submission_time"].to_list(),
        "gpus": frame["num_gpu"].to_list(),
        "duration": None,
        "gpu_type": [GPU_NAMES[t] for t in lowered.to_list()],
        "model": frame["model_name"].to_list(),
        "iterations": frame["num_iteration"].to_list(),
        "batch_size": frame["batch_size"].to_list() if "batch_size" in frame.columns else None,
        "deadline": frame["deadline"].to_list() if "deadline" in frame.columns else None,
    }))
