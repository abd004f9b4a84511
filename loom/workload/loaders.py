"""Trace loader registry: `--trace NAME` or `--trace FORMAT:PATH`.

Formats (each a module of `loom.workload`, documented in docs/TRACES.md):
`rfold`, `sia-philly`, `alibaba-pods`, `arena`, `acme`, `csv`, `elasticflow`,
`sia-workload`, `tethys`, `alibaba-multigpu`. Loaded traces
are cached as Parquet (see `loom.workload.cache`); pass `cache=False` or set
`LOOM_CACHE=off` to read the source every time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from loom.errors import LoomInputError
from loom.registry import Registry
from loom.workload.job import JobSpec

TraceLoader = Callable[[Path], list[JobSpec]]

# format name → loader(path); named traces → (format, path relative to shared traces)
LOADERS: Registry[TraceLoader] = Registry("trace format", "loom.trace_loaders", (
    "loom.workload.philly", "loom.workload.sia_philly", "loom.workload.alibaba", "loom.workload.arena",
    "loom.workload.acme", "loom.workload.generic_csv", "loom.workload.elasticflow", "loom.workload.sia_workload",
    "loom.workload.tethys", "loom.workload.alibaba_bag",
))
NAMED_TRACES: dict[str, tuple[str, str]] = {
    "philly": ("rfold", "philly/rfold_philly_trace.csv"),
    "philly-vc": ("sia-philly", "philly/sia_philly.csv"),
    "alibaba-v2023": ("alibaba-pods", "alibaba/gpu-v2023/openb_pod_list_gpuspec33.csv"),
    "alibaba-v2023-default": ("alibaba-pods", "alibaba/gpu-v2023/openb_pod_list_default.csv"),
    "alibaba-rfold": ("rfold", "alibaba/gpu-v2023/rfold_alibaba_v2023.csv"),
    "arena-philly": ("arena", "crius_arena/simulate_trace_philly.csv"),
    "arena-pai": ("arena", "crius_arena/simulate_trace_pai.csv"),
    "arena-venus": ("arena", "crius_arena/simulate_trace_venus.csv"),
    "philly-elasticflow": ("elasticflow", "philly/elasticflow_philly_103959.csv"),
    "acme-kalos-large": ("tethys", "acme/converted_kalos_trace.csv"),
    "alibaba-v2023-multigpu": ("alibaba-multigpu", "alibaba/gpu-v2023/openb_pod_list_multigpu50.csv"),
}
# Sia / Pollux workloads: sia-philly-w1 … w8 and sia-saturn-w1 … w10 (160 jobs each, no durations)
NAMED_TRACES.update({f"sia-philly-w{i}": ("sia-workload", f"philly/sia_workloads_philly/workload-{i}.csv")
                     for i in range(1, 9)})
NAMED_TRACES.update({f"sia-saturn-w{i}": ("sia-workload", f"helios/sia_workloads_saturn/workload-{i}.csv")
                     for i in range(1, 11)})


def resolve_trace(spec: str) -> tuple[str, Path]:
    """(format, path) of a named trace or FORMAT:PATH; the file must exist."""
    if spec in NAMED_TRACES:
        from loom.paths import shared_traces_dir

        fmt, rel = NAMED_TRACES[spec]
        path = shared_traces_dir() / rel
    else:
        fmt, sep, raw = spec.partition(":")
        if not sep:
            raise LoomInputError(
                f"unknown trace '{spec}': use a named trace ({', '.join(NAMED_TRACES)}) or FORMAT:PATH "
                f"with FORMAT one of {', '.join(LOADERS.names())}",
                field="trace",
            )
        path = Path(raw)
    LOADERS.get(fmt)  # unknown format → UnknownNameError listing the known ones
    if not path.is_file():
        raise LoomInputError("trace file not found", source=str(path), field="trace")
    return fmt, path


def load_trace(spec: str, cache: bool = True) -> list[JobSpec]:
    """Jobs sorted by submit time (stable), from a named trace or FORMAT:PATH.

    The result is a `TraceJobs` list: `.skipped` counts rows the format drops on
    purpose (CPU-only pods, jobs that never ran).
    """
    from loom.workload.cache import cached_load
    from loom.workload.common import TraceJobs

    fmt, path = resolve_trace(spec)
    loader = LOADERS.get(fmt)

    def parse() -> TraceJobs:
        jobs = loader(path)
        skipped = getattr(jobs, "skipped", {})
        return TraceJobs(sorted(jobs, key=lambda j: j.submit_time), skipped)

    if not cache:
        return parse()
    return cached_load(fmt, path, parse)
