"""A stored submission as the core's `JobSpec` (the same spec every trace loader produces), and
what the backend needs to run it (`LaunchSpec`: the command, its process count, environment)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loom.workload.job import JobClass, JobSpec


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """How a backend runs the job: `command` through `loom run` on `procs` processes, or, without a
    command, a sleep-style job of `duration` seconds."""

    job_id: str
    command: tuple[str, ...] | None
    procs: int | None
    duration: float | None
    env: tuple[tuple[str, str], ...] = ()


def job_spec(row: Any) -> JobSpec:
    """The core's view of stored job `row` (a `JobRow`): submitted at its commit time, owned by its tenant."""
    spec: dict[str, Any] = row.spec
    types = spec.get("gpu_types")
    return JobSpec(
        job_id=row.job_id, submit_time=row.submitted_at, gpus=int(spec["gpus"]), duration=spec.get("duration"),
        gpu_type=spec.get("gpu_type") or (types[0] if types and len(types) == 1 else None),
        gpu_types=tuple(types) if types else None, job_class=JobClass(spec.get("job_class", "unknown")),
        user=row.tenant, vc=spec.get("vc"), model=spec.get("model"), preemptible=bool(spec.get("preemptible", True)),
        priority=int(spec.get("priority", 0)), iterations=spec.get("iterations"), batch_size=spec.get("batch_size"),
        deadline=spec.get("deadline"))


def launch_spec(row: Any) -> LaunchSpec:
    spec: dict[str, Any] = row.spec
    command = spec.get("command")
    return LaunchSpec(job_id=row.job_id, command=tuple(command) if command else None, procs=spec.get("procs"),
                      duration=spec.get("duration"), env=tuple(sorted((spec.get("env") or {}).items())))
