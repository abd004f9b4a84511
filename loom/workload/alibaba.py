"""Alibaba GPU v2023 pod lists (`openb_pod_list_*.csv`, the FGD trace): format `alibaba-pods`.

Columns: `name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos,
pod_phase, creation_time, deletion_time, scheduled_time` (times: seconds from
the trace start). `gpu_spec` is optional (empty in the `default` file).

Mapping rules:

* `job_id` = `name`; `submit_time` = `creation_time`.
* `duration` = `deletion_time − scheduled_time` (run time, excludes queueing);
  negative → error naming the row; 0 is kept.
* Pods never scheduled (`scheduled_time` empty — all are `Pending` pods that were
  deleted while queued) have no run time: **skipped**, counted as
  `never scheduled`. `scheduled_time = 0` is a real time (the trace's first pod).
* CPU-only pods (`num_gpu = 0`) are **skipped**, counted as `cpu-only`.
* Fractional GPUs: `num_gpu = 1` with `gpu_milli < 1000` keeps `gpus = 1` and
  records `gpu_fraction = gpu_milli / 1000`; the simulator gives such a pod one
  whole GPU for now.
* `gpu_spec`: a `|`-separated set of allowed GPU models (`T4`,
  `V100M16|V100M32`), mapped to GPU spec names through data/gpu_aliases.yaml
  (V100M16 → V100-16GB, V100M32 → V100, ...). `gpu_types` holds the set (the
  job runs on any one of them, never across); `gpu_type` is set when the set
  has one member.
* `qos`: `BE` (best effort) → `preemptible = True`; LS, Burstable, Guaranteed →
  not preemptible. Priority stays 0.
* `pod_phase`: Succeeded → completed, Failed → failed, Running / Pending →
  unknown (still running when the trace was cut).
* `cpu_milli`, `memory_mib` are copied to the spec.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from loom.hardware.gpus import resolve_gpu_type

from loom.workload.common import Col, TraceJobs, build_specs, check_rows, parse_columns, read_csv, unique_ids
from loom.workload.job import FinalStatus
from loom.workload.loaders import LOADERS, declare_columns

# The pod's resources: shared with the time-less multi-GPU bag (alibaba_bag.py).
POD_RESOURCE_COLS = [
    Col("name"),
    Col("cpu_milli", "int", required=False, min=0, min_message="negative CPU"),
    Col("memory_mib", "int", required=False, min=0, min_message="negative memory"),
    Col("num_gpu", "int", min=0, min_message="negative GPU count"),
    Col("gpu_milli", "int", required=False, min=0, min_message="negative gpu_milli"),
]
_COLS = [
    *POD_RESOURCE_COLS,
    Col("gpu_spec", required=False),
    Col("qos", required=False),
    Col("pod_phase", required=False),
    Col("creation_time", "float", min=0, min_message="negative creation time"),
    Col("deletion_time", "float"),
    Col("scheduled_time", "float", required=False),
]
_PHASES = {"succeeded": FinalStatus.COMPLETED, "failed": FinalStatus.FAILED}


declare_columns("alibaba-pods", _COLS)


@LOADERS.register("alibaba-pods")
def load_alibaba_pods(path: Path) -> TraceJobs:
    raw = read_csv(path, _COLS)
    if "scheduled_time" not in raw.columns:
        raw = raw.with_columns(pl.lit(None, pl.Utf8).alias("scheduled_time"))
    frame = parse_columns(raw, path, _COLS)
    unique_ids(frame["name"], raw, path, "name")
    frame = frame.with_row_index("_row")
    duration = frame["deletion_time"] - frame["scheduled_time"]
    check_rows(duration < 0, raw, path, "deletion_time", "deleted before it was scheduled (negative duration)")
    check_gpu_milli(frame, raw, path)
    frame = frame.with_columns(duration.alias("_duration"))
    cpu_only = frame["num_gpu"] == 0
    unscheduled = frame["scheduled_time"].is_null() & ~cpu_only
    skipped = {"cpu-only": int(cpu_only.sum()), "never scheduled": int(unscheduled.sum())}
    kept = frame.filter(~cpu_only & ~unscheduled)
    n = kept.height

    fractions = gpu_fractions(kept)
    gpu_types: list[tuple[str, ...] | None] = [None] * n
    gpu_type: list[str | None] = [None] * n
    if "gpu_spec" in kept.columns:
        for i, (spec, row) in enumerate(zip(kept["gpu_spec"].to_list(), kept["_row"].to_list())):
            if spec:
                types = tuple(resolve_gpu_type(t, source=str(path), line=row + 2, field="gpu_spec")
                              for t in spec.split("|") if t.strip())
                gpu_types[i] = types or None
                gpu_type[i] = types[0] if len(types) == 1 else None

    def opt(col: str) -> list | None:
        return kept[col].to_list() if col in kept.columns else None

    qos = opt("qos")
    phase = opt("pod_phase")
    return TraceJobs(build_specs(n, {
        "job_id": kept["name"].to_list(),
        "submit_time": kept["creation_time"].to_list(),
        "gpus": kept["num_gpu"].to_list(),
        "duration": kept["_duration"].to_list(),
        "gpu_type": gpu_type,
        "gpu_types": gpu_types,
        "gpu_fraction": fractions,
        "cpu_milli": opt("cpu_milli"),
        "memory_mib": opt("memory_mib"),
        "preemptible": [q is not None and q.upper() == "BE" for q in qos] if qos is not None else False,
        "final_status": ([_PHASES.get((p or "").lower(), FinalStatus.UNKNOWN) for p in phase]
                         if phase is not None else FinalStatus.UNKNOWN),
    }), skipped={k: v for k, v in skipped.items() if v})


def check_gpu_milli(frame: pl.DataFrame, raw: pl.DataFrame, path: Path) -> None:
    if "gpu_milli" in frame.columns:
        check_rows((frame["num_gpu"] == 1) & (frame["gpu_milli"] > 1000), raw, path, "gpu_milli",
                   "gpu_milli above 1000 for a 1-GPU pod")


def gpu_fractions(kept: pl.DataFrame) -> list[float | None] | None:
    """A 1-GPU pod asking for less than a whole GPU records the share (it still gets one GPU)."""
    if "gpu_milli" not in kept.columns:
        return None
    return [m / 1000 if (g == 1 and m is not None and m < 1000) else None
            for g, m in zip(kept["num_gpu"].to_list(), kept["gpu_milli"].to_list())]
