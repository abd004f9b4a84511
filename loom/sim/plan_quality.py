"""How good the plans jobs run are: speed against the speed model's best plan on the same GPUs.

`PlanQuality` wraps a speed model that can answer `plan_quality(job, allocation,
topology)` (`EstimatorSpeed`: t(best plan) / t(the plan priced), both on the
allocation's placement) and samples it at every run segment (each `rate` call:
start, resume, migrate, resize). `job_time_average` weighs each segment by its
wall time, from the run's decision log — a segment runs from its decision to the
job's next decision (move or preempt) or its end — so a policy's figure is the
average plan speed over the time its jobs ran (issue 23: Crius ≥ 0.98×).
A speed model without `plan_quality` (e.g. Arena's profile database, which
prices the best plan whatever a job decided) samples 1.0.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from loom.core.decisions import Migrate, Preempt, Resize, Resume, Start
from loom.core.jobs import Job
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology

_SEGMENT_STARTS = (Start, Resume, Migrate, Resize)


class PlanQuality:
    """A speed model that also records each run segment's plan quality (see the module docstring)."""

    def __init__(self, speed: Any) -> None:
        self.speed = speed
        self.samples: dict[str, list[float]] = defaultdict(list)

    def __getattr__(self, name: str) -> Any:  # prepare, bind, name, counters: the wrapped model's
        return getattr(self.speed, name)

    def rate(self, job: Job, allocation: Allocation, topology: Topology) -> float:
        rate = self.speed.rate(job, allocation, topology)
        quality = getattr(self.speed, "plan_quality", None)
        self.samples[job.job_id].append(1.0 if quality is None else quality(job, allocation, topology))
        return rate

    def job_time_average(self, decisions: list[tuple[float, Any]], jobs: list[Job]) -> float:
        """Plan quality averaged over job run time (NaN when nothing ran)."""
        moments: dict[str, list[tuple[float, bool]]] = defaultdict(list)  # job → (time, starts a segment)
        for at, d in decisions:
            if isinstance(d, _SEGMENT_STARTS):
                moments[d.job_id].append((at, True))
            elif isinstance(d, Preempt):
                moments[d.job_id].append((at, False))
        total = weighted = 0.0
        for job in jobs:
            samples = iter(self.samples.get(job.job_id, ()))
            marks = moments.get(job.job_id, [])
            ends = [t for t, _ in marks[1:]] + [job.end_time if job.end_time is not None else marks[-1][0]] \
                if marks else []
            for (at, starts), end in zip(marks, ends):
                if not starts:
                    continue
                quality = next(samples, None)
                if quality is None:
                    break
                weighted += quality * max(0.0, end - at)
                total += max(0.0, end - at)
        return weighted / total if total > 0 else float("nan")


__all__ = ["PlanQuality"]
