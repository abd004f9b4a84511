"""The one YAML configuration format (cluster, trace, policy, placer, seed,
outputs), shared by `loom simulate` and later commands. Command-line flags
override fields; every problem is reported with the file and field path."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from loom.errors import LoomInputError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Component(_Strict):
    """A registered component by name, with keyword parameters for its constructor."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class FailureSpec(_Strict):
    node: str
    at: float = Field(ge=0)
    repair_after: float = Field(default=float("inf"), gt=0)


class Outputs(_Strict):
    dir: Path = Path("runs/latest")
    decision_log: bool = True
    job_records: bool = True
    report: bool = True  # report.html (needs job_records)


class SimConfig(_Strict):
    cluster: str = "philly"
    trace: str = "philly"
    policy: Component = Component(name="fcfs")
    placer: Component = Component(name="best-fit")
    speed_model: Component = Component(name="trace")
    seed: int = 0
    round_interval_s: float | None = Field(default=None, gt=0)
    limit_jobs: int | None = Field(default=None, gt=0)
    failures: tuple[FailureSpec, ...] = ()
    # node failures from a source: "infinitehbd" (the real fault trace), "rate:R" (per node per
    # day) or a fault-trace JSON path, over the trace's span; turns interruptions and recovery on
    failures_from: str | None = None
    # with failures_from: trace jobs recorded as failed already end at their recorded failure;
    # "drop" removes them so failures are not counted twice, "keep" replays them as recorded
    recorded_failures: Literal["drop", "keep"] = "drop"
    # job-level failures (Acme taxonomy) injected into jobs that did not fail in the trace:
    # "acme" (scheduler-calibrated) or "acme-log" (§5 log sample); turns interruptions and recovery on
    job_failures: str | None = None
    # interruption costs (loom.perf.interruptions.InterruptionCosts fields); {} = defaults, null = off
    interruptions: dict[str, Any] | None = None
    # failure recovery (loom.core.recovery.RecoveryConfig fields); {} = defaults, null = off
    recovery: dict[str, Any] | None = None
    # modelled launches (loom.sim.launch.LaunchModel fields: profile, latency_s, default_s,
    # failure_probability, seed); null = instant launches (the default), a string = a profile name
    launch: dict[str, Any] | None = None
    outputs: Outputs = Outputs()

    @field_validator("policy", "placer", "speed_model", mode="before")
    @classmethod
    def _name_shorthand(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("launch", mode="before")
    @classmethod
    def _launch_shorthand(cls, value: Any) -> Any:
        return launch_section(value)


def launch_section(value: Any) -> Any:
    """`launch: acme` is `launch: {profile: acme}`; `launch: none` is off (instant launches)."""
    if isinstance(value, str):
        return None if value == "none" else {"profile": value}
    return value


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> SimConfig:
    """Read YAML (if given), apply non-None overrides (dotted keys allowed), validate."""
    data: dict[str, Any] = {}
    source = str(path) if path else "command line"
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise LoomInputError(f"cannot read config: {exc.strerror}", source=source) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            raise LoomInputError(f"invalid YAML: {getattr(exc, 'problem', exc)}", source=source, line=line) from None
        if loaded is not None and not isinstance(loaded, dict):
            raise LoomInputError("the config must be a mapping of fields", source=source)
        data = loaded or {}
    if "launch" in data:  # the profile shorthand, so that flags can set fields beside the profile
        data["launch"] = launch_section(data["launch"])
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, leaf = key.split(".")
        for part in parents:
            if target.get(part) is None:  # absent, or `section: null` (off) being turned on by a flag
                target[part] = {}
            target = target[part]
            if isinstance(target, str):  # "policy: fcfs" shorthand being overridden by policy.params
                raise LoomInputError(f"cannot set '{key}' on a shorthand value", source=source, field=key)
            if not isinstance(target, dict):
                raise LoomInputError(f"cannot set '{key}': '{part}' is not a mapping", source=source, field=part)
        target[leaf] = value
    try:
        return SimConfig.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first, rest = errors[0], errors[1:]
        message = first["msg"] + "".join(f"; field '{_loc(e)}': {e['msg']}" for e in rest)
        raise LoomInputError(message, source=source, field=_loc(first)) from None


def _loc(error: Any) -> str:
    return ".".join(str(p) for p in error["loc"])


def config_to_dict(config: SimConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")
