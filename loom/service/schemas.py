"""What the service's REST API accepts and returns (pydantic models; the OpenAPI spec is made from them).

A submission is a job spec in the same vocabulary as a trace row (`loom.workload.job.JobSpec`,
the generic CSV format's columns) plus what a live job needs to run: the command, its process
count, an expected duration for sleep-style jobs. Unknown fields are refused (most are typos),
and every problem names its field.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from loom.errors import suggest
from loom.workload.job import JobClass

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_GPUS = 1_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def known_gpu_types() -> list[str]:
    from loom.hardware.gpus import load_gpu_specs

    return sorted(load_gpu_specs())


def _check_gpu_type(name: str) -> str:
    known = known_gpu_types()
    if name not in known:
        close = suggest(name, known)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown GPU type '{name}'{hint}")
    return name


class JobSubmission(_Strict):
    """A job to run on `gpus` GPUs. Give `command` for a real job (run through `loom run`); without
    one the job is sleep-style (it holds its GPUs for its run time and answers checkpoint and stop
    requests). Its run time is `duration`, or what the estimator predicts for `model` +
    `batch_size` + `iterations` on the GPUs it gets (as `--speed-model estimator` prices trace jobs)."""

    job_id: str | None = Field(None, description="unique id; generated when absent ('j-…')")
    gpus: StrictInt = Field(..., ge=1, le=MAX_GPUS, description="GPUs (logical data-parallel ranks)")
    command: list[str] | None = Field(None, min_length=1, max_length=256,
                                      description="argv of the training script, run through `loom run`")
    procs: StrictInt | None = Field(None, ge=1, le=MAX_GPUS,
                              description="processes for `loom run` (≤ gpus; ranks are time-sliced)")
    duration: float | None = Field(None, gt=0, le=10 * 365 * 86400,
                                   description="seconds: how long a sleep-style job runs; for a real job, "
                                               "the expected run time the policy may use")
    job_class: JobClass = Field(JobClass.UNKNOWN, description="pretrain, sft, eval, debug, other, unknown")
    priority: StrictInt = Field(0, ge=-1_000_000, le=1_000_000)
    preemptible: StrictBool = True
    gpu_type: str | None = Field(None, description="run only on this GPU type")
    gpu_types: list[str] | None = Field(None, min_length=1, max_length=64,
                                        description="run on any one of these GPU types")
    vc: str | None = Field(None, max_length=128, description="virtual cluster / quota group")
    model: str | None = Field(None, max_length=128, description="model preset for estimator-priced jobs")
    batch_size: StrictInt | None = Field(None, ge=1, le=1 << 30)
    iterations: StrictInt | None = Field(None, ge=1, le=1 << 40)
    deadline: float | None = Field(None, description="epoch seconds")
    env: dict[str, str] | None = Field(None, max_length=128, description="extra environment variables")

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, value: str | None) -> str | None:
        if value is not None and not JOB_ID.match(value):
            raise ValueError("1–64 characters: letters, digits, '.', '_', '-'; starting with a letter or digit")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not arg or len(arg) > 4096 or "\x00" in arg for arg in value):
            raise ValueError("every argument must be a non-empty string without NUL, at most 4096 characters")
        return value

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, value: str | None) -> str | None:
        return None if value is None else _check_gpu_type(value)

    @field_validator("gpu_types")
    @classmethod
    def _gpu_types(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_check_gpu_type(v) for v in value]

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, item in (value or {}).items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", key) or len(item) > 4096 or "\x00" in item:
                raise ValueError(f"'{key[:40]}': names are letters, digits and '_'; values at most 4096 characters")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSubmission:
        if self.command is None and self.duration is None and self.model is None:
            raise ValueError("give 'command' (a real job), or 'duration' or 'model' + 'batch_size' + "
                             "'iterations' (a sleep-style job)")
        if self.procs is not None and self.procs > self.gpus:
            raise ValueError(f"'procs' ({self.procs}) must not exceed 'gpus' ({self.gpus})")
        if self.gpu_type is not None and self.gpu_types is not None:
            raise ValueError("give 'gpu_type' or 'gpu_types', not both")
        priced = (self.model, self.batch_size, self.iterations)
        if any(v is not None for v in priced) and any(v is None for v in priced):
            raise ValueError("an estimator-priced job gives all of 'model', 'batch_size' and 'iterations'")
        if self.model is not None:
            from loom.perf.presets import preset_names

            if self.model not in preset_names():
                close = suggest(self.model, preset_names())
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ValueError(f"unknown model '{self.model}'{hint}")
        return self

    def spec(self) -> dict[str, Any]:
        """The spec as stored: every field that was given (JSON types)."""
        return self.model_dump(mode="json", exclude_none=True)


class Allocation(BaseModel):
    nodes: list[str]
    gpus: list[int]


class JobView(BaseModel):
    job_id: str
    tenant: str
    state: str
    spec: dict[str, Any]
    submitted_at: float
    updated_at: float | None = None
    cancel_requested: bool = False
    allocation: Allocation | None = None
    plan: dict[str, Any] | None = None


class JobList(BaseModel):
    jobs: list[JobView]


class TransitionView(BaseModel):
    old: str
    new: str
    at: float
    event: str


class DecisionView(BaseModel):
    ticket: int
    kind: str
    at: float
    reason: str
    status: str
    answer: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)


class Explanation(BaseModel):
    job: JobView
    summary: str = Field(description="one sentence: where the job is, or why it waits")
    decisions: list[DecisionView]
    transitions: list[TransitionView]


class NodeView(BaseModel):
    name: str
    gpus: int
    gpu_type: str
    state: str
    free: int
    switches: list[str] = Field(default_factory=list)
    jobs: list[str] = Field(default_factory=list)


class NodeList(BaseModel):
    generation: int
    nodes: list[NodeView]


class TenantCreate(_Strict):
    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    admin: StrictBool = False


class TenantToken(BaseModel):
    tenant: str
    admin: bool
    token: str = Field(description="shown once; the service stores only its hash")


class Problem(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    error: str
    problems: list[Problem] = Field(default_factory=list)


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str
    backend: str | None = None
    policy: str | None = None


class PolicyView(BaseModel):
    policy: str
    placer: str
    round_interval: float | None
    paused: bool


class PolicyUpdate(_Strict):
    """What an admin may change while the service runs."""

    paused: StrictBool | None = Field(None, description="true: no policy rounds (running jobs go on); false: resume")
    round_interval: float | None = Field(None, gt=0, le=86_400, description="seconds between periodic rounds")
