"""RFold-format traces (`#job id, arrival time (sec), topology, shape, size, duration (sec)`).

This is how the full 111,549-job Philly list is published (shuoshuc/RFold), and
how RFold re-encodes the Alibaba v2023 pod list (`alibaba-rfold`).
Rules: rows are validated with file and line; a duration of 0 is kept (the job
finishes the instant it starts); a negative duration is an error. `size` must be
> 0; a fractional size (Alibaba GPU sharing, e.g. 0.46) is rounded up to whole
GPUs and the raw value is kept in `JobSpec.gpu_fraction` (the simulator places
such a job on one whole GPU for now).
"""

from __future__ import annotations

from pathlib import Path

from loom.errors import LoomInputError
from loom.workload.common import Col, TraceJobs, build_specs, ceil_gpus, parse_columns, read_csv, unique_ids
from loom.workload.job import JobClass
from loom.workload.loaders import LOADERS, declare_columns

RFOLD_COLUMNS = ["#job id", "arrival time (sec)", "topology", "shape", "size", "duration (sec)"]
_COLS = [
    Col("#job id"),
    Col("arrival time (sec)", "float", min=0, min_message="negative arrival time"),
    Col("topology", required=False),
    Col("shape", required=False),
    Col("size", "float", min=0, strict_min=True, min_message="GPU count must be > 0 (≥ 1 after rounding up)",
        type_message="not an integer"),
    Col("duration (sec)", "float", min=0, min_message="negative duration"),
]


declare_columns("rfold", _COLS)


@LOADERS.register("rfold")
def load_rfold(path: Path) -> TraceJobs:
    raw = read_csv(path, _COLS)
    missing = [c for c in RFOLD_COLUMNS if c not in raw.columns]
    if missing:
        raise LoomInputError(f"missing columns {missing}; expected {RFOLD_COLUMNS}", source=str(path), line=1)
    frame = parse_columns(raw, path, _COLS)
    unique_ids(frame["#job id"], raw, path, "#job id")
    gpus, fractions = ceil_gpus(frame["size"])
    n = frame.height
    return TraceJobs(build_specs(n, {
        "job_id": frame["#job id"].to_list(),
        "submit_time": frame["arrival time (sec)"].to_list(),
        "gpus": gpus,
        "duration": frame["duration (sec)"].to_list(),
        "job_class": JobClass.UNKNOWN,
        "gpu_fraction": fractions if any(f is not None for f in fractions) else None,
    }))
