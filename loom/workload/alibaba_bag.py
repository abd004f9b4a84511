"""Alibaba v2023 pod lists without times (`openb_pod_list_multigpu50.csv`): format `alibaba-multigpu`.

Columns: `name, cpu_milli, memory_mib, num_gpu, gpu_milli` (the FGD
re-sampling that emphasises multi-GPU pods; no `qos`, `pod_phase` or times).

This is a **placement / packing workload, not a replayable trace**: every pod
is submitted at 0 with `duration` None (a speed model or a packing experiment
must supply run times). Mapping, as `alibaba-pods` where the columns overlap:

* `job_id` = `name` (unique); `gpus` = `num_gpu`; pods with `num_gpu = 0` are
  **skipped**, counted as `cpu-only`.
* `num_gpu = 1` with `gpu_milli < 1000` → `gpu_fraction = gpu_milli / 1000`
  (gpus stays 1); `gpu_milli > 1000` on a 1-GPU pod is an error.
* `cpu_milli`, `memory_mib` copied.

(`alibaba-pods` needs `creation_time` / `deletion_time`, so it cannot read
this file; this module is a separate thin loader rather than a change to it.)
"""

from __future__ import annotations

from pathlib import Path

from loom.workload.alibaba import POD_RESOURCE_COLS, check_gpu_milli, gpu_fractions
from loom.workload.common import TraceJobs, build_specs, read_rows
from loom.workload.loaders import LOADERS, declare_columns

_COLS = POD_RESOURCE_COLS


declare_columns("alibaba-multigpu", _COLS)


@LOADERS.register("alibaba-multigpu")
def load_alibaba_multigpu(path: Path) -> TraceJobs:
    raw, frame = read_rows(path, _COLS, "name")
    check_gpu_milli(frame, raw, path)
    cpu_only = frame["num_gpu"] == 0
    kept = frame.filter(~cpu_only)
    n = kept.height
    fractions = gpu_fractions(kept)

    def opt(col: str) -> list | None:
        return kept[col].to_list() if col in kept.columns else None

    skipped = int(cpu_only.sum())
    return TraceJobs(build_specs(n, {
        "job_id": kept["name"].to_list(),
        "submit_time": 0.0,
        "gpus": kept["num_gpu"].to_list(),
        "duration": None,
        "gpu_fraction": fractions,
        "cpu_milli": opt("cpu_milli"),
        "memory_mib": opt("memory_mib"),
    }), skipped={"cpu-only": skipped} if skipped else {})
