"""Trace loader registry: `--trace NAME` or `--trace FORMAT:PATH`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from loom.errors import LoomInputError
from loom.registry import Registry
from loom.workload.job import JobSpec

TraceLoader = Callable[[Path], list[JobSpec]]

# format name → loader(path); named traces → (format, path relative to shared traces)
LOADERS: Registry[TraceLoader] = Registry("trace format", "loom.trace_loaders", ("loom.workload.philly",))
NAMED_TRACES: dict[str, tuple[str, str]] = {"philly": ("rfold", "philly/rfold_philly_trace.csv")}


def load_trace(spec: str) -> list[JobSpec]:
    """Jobs sorted by submit time (stable), from a named trace or FORMAT:PATH."""
    from loom.paths import shared_traces_dir

    if spec in NAMED_TRACES:
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
    loader = LOADERS.get(fmt)
    if not path.is_file():
        raise LoomInputError("trace file not found", source=str(path), field="trace")
    jobs = loader(path)
    return sorted(jobs, key=lambda j: j.submit_time)
