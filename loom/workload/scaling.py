"""Load scaling for real traces: compress arrivals (`--load X`) and replay a trace back to back
(`--repeat N`), so a light trace can load a large cluster.

`load=X` divides every gap between arrivals by X around the first arrival (X=2 doubles the
arrival rate; job sizes and durations are untouched). Announcements and deadlines keep their
offset from their own job's arrival, so reservations and SLAs mean what they did. `repeat=N`
appends N-1 copies of the (scaled) trace, each starting one arrival span plus the mean gap
after the previous copy began, with job ids suffixed `#2`, `#3`, … so every job stays unique.
Both are recorded in the run's manifest; scaling a generated workload is the generator's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from loom.errors import LoomInputError
from loom.workload.job import JobSpec


def scale_load(specs: Sequence[JobSpec], load: float = 1.0, repeat: int = 1) -> list[JobSpec]:
    """The trace with arrivals compressed by `load` and replayed `repeat` times."""
    if not load > 0:
        raise LoomInputError(f"--load must be a positive factor, got {load}", field="load")
    if repeat < 1:
        raise LoomInputError(f"--repeat must be at least 1, got {repeat}", field="repeat")
    if not specs or (load == 1.0 and repeat == 1):
        return list(specs)
    origin = min(s.submit_time for s in specs)
    scaled = [_shift(s, origin + (s.submit_time - origin) / load) for s in specs]
    if repeat == 1:
        return scaled
    last = max(s.submit_time for s in scaled)
    period = (last - origin) + ((last - origin) / (len(scaled) - 1) if len(scaled) > 1 else 1.0)
    period = period if period > 0 else 1.0  # every job arrived at once: copies one second apart
    out = list(scaled)
    for copy in range(2, repeat + 1):
        offset = (copy - 1) * period
        out.extend(_shift(s, s.submit_time + offset, f"#{copy}") for s in scaled)
    return out


def _shift(spec: JobSpec, submit: float, suffix: str = "") -> JobSpec:
    """The job arriving at `submit` instead, with its announcement and deadline moved along."""
    delta = submit - spec.submit_time
    changes: dict[str, object] = {"submit_time": submit}
    if suffix:
        changes["job_id"] = spec.job_id + suffix
    if spec.announce_time is not None:
        changes["announce_time"] = spec.announce_time + delta
    if spec.deadline is not None:
        changes["deadline"] = spec.deadline + delta
    return replace(spec, **changes)
