"""Trace loader registry: `--trace NAME`, `--trace FORMAT:PATH` or `--trace PATH` (format read off the header).

Formats (each a module of `loom.workload`, documented in docs/TRACES.md):
`rfold`, `sia-philly`, `alibaba-pods`, `arena`, `acme`, `csv`, `elasticflow`,
`sia-workload`, `tethys`, `alibaba-multigpu`. Loaded traces
are cached as Parquet (see `loom.workload.cache`); pass `cache=False` or set
`LOOM_CACHE=off` to read the source every time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loom.errors import FileProblem, LoomInputError, did_you_mean
from loom.registry import Registry
from loom.workload.job import JobSpec

TraceLoader = Callable[[Path], list[JobSpec]]

# format name → loader(path); named traces → (format, path relative to shared traces)
LOADERS: Registry[TraceLoader] = Registry("trace format", "loom.trace_loaders", (
    "loom.workload.philly", "loom.workload.sia_philly", "loom.workload.alibaba", "loom.workload.arena",
    "loom.workload.acme", "loom.workload.generic_csv", "loom.workload.elasticflow", "loom.workload.sia_workload",
    "loom.workload.tethys", "loom.workload.alibaba_bag",
), homes={"rfold": "loom.workload.philly", "alibaba-pods": "loom.workload.alibaba", "csv": "loom.workload.generic_csv",
          "alibaba-multigpu": "loom.workload.alibaba_bag"})
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


# format → (required columns, all columns it reads), declared by each built-in format module;
# a plain path (no FORMAT:) is matched against these headers (`infer_format`)
FORMAT_COLUMNS: dict[str, tuple[frozenset[str], frozenset[str]]] = {}


def declare_columns(fmt: str, columns: Iterable[Any]) -> None:
    """Record the header of a format (its `Col`s) so that plain paths of that format are recognised."""
    cols = list(columns)
    FORMAT_COLUMNS[fmt] = (frozenset(c.name for c in cols if c.required), frozenset(c.name for c in cols))


@dataclass(frozen=True)
class TraceSource:
    """Where a trace spec points: its format, its file and how the format was chosen."""

    fmt: str
    path: Path
    how: str  # "named" | "given" (FORMAT:PATH) | "inferred" (a plain path, from its header)


def resolve_trace(spec: str) -> tuple[str, Path]:
    """(format, path) of a named trace, FORMAT:PATH or a plain path; the file must exist."""
    source = trace_source(spec)
    return source.fmt, source.path


def trace_source(spec: str) -> TraceSource:
    """Resolve a named trace, `FORMAT:PATH` or an existing plain path (format inferred from its header)."""
    if spec in NAMED_TRACES:
        from loom.paths import shared_traces_dir

        fmt, rel = NAMED_TRACES[spec]
        return _existing(TraceSource(fmt, shared_traces_dir() / rel, "named"))
    fmt, sep, raw = spec.partition(":")
    if sep and (fmt in LOADERS or not Path(spec).is_file()):
        LOADERS.get(fmt)  # unknown format → UnknownNameError listing the known ones
        return _existing(TraceSource(fmt, Path(raw), "given"))
    path = Path(spec)
    if path.is_file():
        return TraceSource(infer_format(path), path, "inferred")
    if path.exists() or any(ch in spec for ch in "/\\") or path.suffix:
        raise LoomInputError("trace file not found (and not a named trace: see `loom traces list`)",
                             source=spec, field="trace")
    raise LoomInputError(f"unknown trace '{spec}'{did_you_mean(spec, NAMED_TRACES, quote=True)} "
                         f"(`loom traces list` shows the named traces; or give FORMAT:PATH with FORMAT one of "
                         f"{', '.join(LOADERS.names())}, or the path of a trace file)", field="trace")


def _existing(source: TraceSource) -> TraceSource:
    if not source.path.is_file():
        raise LoomInputError("trace file not found", source=str(source.path), field="trace")
    return source


def infer_format(path: Path) -> str:
    """The built-in format whose columns the file's header has (the most specific one)."""
    from loom.workload.sniff import diagnose, header_columns

    LOADERS.names()  # imports the format modules, which declare their columns
    if problem := diagnose(path):
        raise FileProblem(problem, source=str(path))
    header = set(header_columns(path))
    if not header - {""}:
        raise LoomInputError("empty file (no header line)", source=str(path), line=1)
    fits = {fmt: len(header & known) for fmt, (required, known) in FORMAT_COLUMNS.items() if required <= header}
    best = sorted(fits, key=lambda f: -fits[f])
    if best and (len(best) == 1 or fits[best[0]] > fits[best[1]]):
        return best[0]
    known = ", ".join(sorted(FORMAT_COLUMNS))
    if best:
        tied = [f for f in best if fits[f] == fits[best[0]]]
        raise LoomInputError(f"the header fits the trace formats {', '.join(tied)}; name one as FORMAT:PATH",
                             source=str(path), line=1)
    raise LoomInputError(f"cannot tell the trace format from the header{_closest(header)}; "
                         f"name it as FORMAT:PATH (FORMAT one of {known}; see docs/TRACES.md)",
                         source=str(path), line=1)


def _closest(header: set[str]) -> str:
    """"; closest: csv (missing duration)" — the format missing the fewest required columns."""
    def missing(fmt: str) -> list[str]:
        return sorted(FORMAT_COLUMNS[fmt][0] - header)

    ranked = sorted(FORMAT_COLUMNS, key=lambda f: (len(missing(f)), -len(header & FORMAT_COLUMNS[f][1]), f))
    if not ranked or not header & FORMAT_COLUMNS[ranked[0]][1]:
        return ""
    fmt = ranked[0]
    return f"; closest: {fmt} (missing {', '.join(missing(fmt))})"


def load_trace(spec: str, cache: bool = True) -> list[JobSpec]:
    """Jobs sorted by submit time (stable), from a named trace, FORMAT:PATH or a plain path.

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
