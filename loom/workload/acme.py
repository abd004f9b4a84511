"""Acme raw job traces (InternLM/AcmeTrace `data/job_trace/trace_{seren,kalos}.csv`): format `acme`.

Columns (confirmed from a public description of `trace_kalos.csv`): `job_id,
user, node_num, gpu_num, cpu_num, mem_per_pod_GB, shared_mem_per_pod, type,
state, submit_time, start_time, end_time, fail_time, stop_time, duration, queue,
gpu_time`. Timestamps look like `2023-05-17 11:00:58+00:00`. Required here:
`job_id, gpu_num, type, state, submit_time, start_time, end_time`; the others
may be absent and are not used. The raw files are not in ../shared/traces (they
are ≥ 4 MiB); this loader is tested on small files in the same schema.

Mapping rules:

* `submit_time` = seconds since the earliest `submit_time` in the file.
* `duration` = `end_time − start_time` (run time only). The file's own
  `duration` column is ignored: in the published sample row it equals
  `end_time − submit_time`, i.e. it includes queueing.
* `type` → job class: Pretrain → pretrain, SFT → sft, Evaluation → eval,
  Debug → debug, anything else (MLLM, Other, ...) → other.
* `state` → final status: COMPLETED → completed; FAILED, NODE_FAIL, TIMEOUT,
  OUT_OF_MEMORY → failed; CANCELLED → cancelled; anything else → unknown.
* Skipped and counted: CPU-only jobs (`gpu_num = 0`, `cpu-only`), jobs that never
  started (`start_time` empty, `never started`) and jobs with no `end_time`
  (still running at the cut, `never ended`).
* `user` copied; `gpu_type` left None (Acme is homogeneous A100).
"""

from __future__ import annotations

from pathlib import Path

from loom.errors import LoomInputError
from loom.workload.common import (Col, TraceJobs, build_specs, check_rows, epoch_seconds, parse_columns, read_csv,
                                  unique_ids)
from loom.workload.job import FinalStatus, JobClass
from loom.workload.loaders import LOADERS, declare_columns

_COLS = [
    Col("job_id"),
    Col("user", required=False),
    Col("gpu_num", "int", min=0, min_message="negative GPU count"),
    Col("type", required=False),
    Col("state", required=False),
    Col("submit_time", "datetime"),
    Col("start_time", "datetime", required=False),
    Col("end_time", "datetime", required=False),
]
CLASSES = {"pretrain": JobClass.PRETRAIN, "sft": JobClass.SFT, "evaluation": JobClass.EVAL, "debug": JobClass.DEBUG}
STATES = {"completed": FinalStatus.COMPLETED, "failed": FinalStatus.FAILED, "node_fail": FinalStatus.FAILED,
          "timeout": FinalStatus.FAILED, "out_of_memory": FinalStatus.FAILED, "cancelled": FinalStatus.CANCELLED}


declare_columns("acme", _COLS)


@LOADERS.register("acme")
def load_acme(path: Path) -> TraceJobs:
    raw = read_csv(path, _COLS)
    for name in ("type", "state", "start_time", "end_time"):
        if name not in raw.columns:
            raise LoomInputError(f"missing columns ['{name}']", source=str(path), line=1)
    frame = parse_columns(raw, path, _COLS)
    unique_ids(frame["job_id"], raw, path, "job_id")
    submit = epoch_seconds(frame["submit_time"])
    start = epoch_seconds(frame["start_time"])
    duration = epoch_seconds(frame["end_time"]) - start
    check_rows(duration < 0, raw, path, "end_time", "ends before it starts (negative duration)")
    check_rows(start < submit, raw, path, "start_time", "starts before it is submitted")
    origin = submit.min() if frame.height else 0.0
    frame = frame.with_columns((submit - origin).alias("_submit"), duration.alias("_duration"))
    cpu_only = frame["gpu_num"] == 0
    not_started = frame["start_time"].is_null() & ~cpu_only
    not_ended = frame["end_time"].is_null() & ~cpu_only & ~not_started
    skipped = {"cpu-only": int(cpu_only.sum()), "never started": int(not_started.sum()),
               "never ended": int(not_ended.sum())}
    kept = frame.filter(~cpu_only & ~not_started & ~not_ended)
    n = kept.height
    return TraceJobs(build_specs(n, {
        "job_id": kept["job_id"].to_list(),
        "submit_time": kept["_submit"].to_list(),
        "gpus": kept["gpu_num"].to_list(),
        "duration": kept["_duration"].to_list(),
        "job_class": [CLASSES.get((t or "").strip().lower(), JobClass.OTHER) for t in kept["type"].to_list()],
        "final_status": [STATES.get((s or "").strip().lower(), FinalStatus.UNKNOWN) for s in kept["state"].to_list()],
        "user": kept["user"].to_list() if "user" in kept.columns else None,
    }), skipped={k: v for k, v in skipped.items() if v})
