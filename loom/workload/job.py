"""The job spec every trace loader produces and every policy reads."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class JobClass(str, Enum):
    """LLM development job classes (Acme), plus catch-alls for generic traces."""

    PRETRAIN = "pretrain"
    SFT = "sft"
    EVAL = "eval"
    DEBUG = "debug"
    OTHER = "other"
    UNKNOWN = "unknown"


class FinalStatus(str, Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What was submitted. Immutable: runtime progress lives in `loom.core.jobs.Job`.

    `duration` is the trace's run time on the requested GPUs (the work of the
    trace-duration speed model); `announce_time` makes a planned job known to
    the scheduler ahead of `submit_time` (Arnold's reservations).
    """

    job_id: str
    submit_time: float
    gpus: int
    duration: float | None = None
    gpu_type: str | None = None
    job_class: JobClass = JobClass.UNKNOWN
    user: str | None = None
    vc: str | None = None
    final_status: FinalStatus = FinalStatus.UNKNOWN
    model: str | None = None
    preemptible: bool = False
    priority: int = 0
    announce_time: float | None = None
    # Optional trace detail (added for the Alibaba / Arena loaders; all default to "not given").
    gpu_types: tuple[str, ...] | None = None  # "any of these" GPU types; gpu_type is set when there is one
    gpu_fraction: float | None = None  # share of one GPU (e.g. 0.46) for fractional pods; gpus stays 1
    cpu_milli: int | None = None
    memory_mib: int | None = None
    iterations: int | None = None
    batch_size: int | None = None
    deadline: float | None = None  # absolute time, same clock as submit_time

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"job {self.job_id}: needs at least one GPU, got {self.gpus}")
        if self.duration is not None and self.duration < 0:
            raise ValueError(f"job {self.job_id}: negative duration {self.duration}")
        if self.announce_time is not None and self.announce_time > self.submit_time:
            raise ValueError(f"job {self.job_id}: announced after it is submitted")
