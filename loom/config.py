"""The one YAML configuration format (cluster, trace, policy, placer, seed,
outputs), shared by `loom simulate` and later commands. Command-line flags
override fields; every problem is reported with the file and field path."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from loom.errors import FileLineError, FileProblem, LoomInputError, did_you_mean


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
    # arrival compression (2 = twice the arrival rate) and back-to-back replays of the trace, so a
    # light trace can load its cluster (loom.workload.scaling); applied after limit_jobs
    load: float = Field(default=1.0, gt=0)
    repeat: int = Field(default=1, ge=1)
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
    """Read YAML (if given), apply non-None overrides (dotted keys allowed), validate.

    Problems in the file are reported as `FILE:LINE: ...` from the YAML node marks,
    e.g. `c.yaml:3: unknown key 'polcy' at the top level; did you mean 'policy'?`.
    """
    source = str(path) if path else "command line"
    data, root = _read_yaml(Path(path)) if path is not None else ({}, None)
    if "launch" in data:  # the profile shorthand, so that flags can set fields beside the profile
        data["launch"] = launch_section(data["launch"])
    applied = _apply_overrides(data, overrides or {}, source)
    try:
        return SimConfig.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, source, root, applied) from None


def _read_yaml(path: Path) -> tuple[dict[str, Any], yaml.Node | None]:
    """The config's data and its YAML node tree (which keeps line numbers)."""
    source = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise LoomInputError(f"cannot read config: {exc.strerror}", source=source) from None
    except UnicodeDecodeError:
        raise FileProblem("is not UTF-8 text (is it a YAML config?)", source=source) from None
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            _check_duplicate_keys(root, source)
        loaded = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise LoomInputError(f"invalid YAML: {getattr(exc, 'problem', exc)}", source=source, line=line) from None
    finally:
        loader.dispose()
    if loaded is not None and not isinstance(loaded, dict):
        raise FileLineError("the config must be a mapping of fields", source=source, line=_line(root))
    return loaded or {}, root


def _check_duplicate_keys(node: yaml.Node, source: str) -> None:
    """A key given twice in one mapping (yaml.safe_load would silently keep the last)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value != "<<":
                if key.value in seen:
                    raise FileLineError(f"key '{key.value}' appears twice in one section "
                                        f"(first at line {seen[key.value]})", source=source, line=_line(key))
                seen[key.value] = _line(key)
            _check_duplicate_keys(value, source)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(item, source)


def _apply_overrides(data: dict[str, Any], overrides: dict[str, Any], source: str) -> list[str]:
    """Set the non-None overrides (dotted keys) in `data`; return the keys set."""
    applied = []
    for key, value in overrides.items():
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
        applied.append(key)
    return applied


def _validation_error(exc: ValidationError, source: str, root: yaml.Node | None,
                      overrides: list[str]) -> LoomInputError:
    """One error naming the file and line (or the command line) of each problem, first line first."""
    located = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        dotted = ".".join(str(p) for p in loc)
        from_flag = any(dotted == k or dotted.startswith(k + ".") or k.startswith(dotted + ".") for k in overrides)
        line = None if from_flag or root is None else _line_of(root, loc)
        typo_first = 0 if error["type"] == "extra_forbidden" else 1  # a misspelt key explains a missing one
        located.append(((line or 0, typo_first), line, dotted, _describe(error, loc)))
    located.sort(key=lambda item: item[0])
    _, line, dotted, message = located[0]
    where = "command line" if line is None and root is not None else source
    rest = "".join(f"; {_where(other_line)}: {text}" for _, other_line, _, text in located[1:])
    return FileLineError(message + rest, source=where, line=line, field=dotted)


def _where(line: int | None) -> str:
    return f"line {line}" if line is not None else "command line"


def _describe(error: Any, loc: tuple[Any, ...]) -> str:
    """Words for one pydantic error: unknown keys get a suggestion, the rest name the field."""
    dotted = _dotted(loc)
    *section, key = loc or ("",)
    where = f"in section '{_dotted(section)}'" if section else "at the top level"
    known = _known_keys(tuple(section))
    if error["type"] == "extra_forbidden":
        hint = did_you_mean(str(key), known, n=2, quote=True) if known else ""
        listed = f"; known keys: {', '.join(known)}" if known and not hint else ""
        path = f" ({dotted})" if section else ""
        return f"unknown key '{key}' {where}{path}{hint}{listed}"
    if error["type"] == "missing":
        return f"missing key '{key}' {where} ({dotted})"
    shown = repr(error.get("input"))
    got = f", got {shown}" if len(shown) <= 60 else ""
    return f"field '{dotted}': {error['msg']}{got}"


def _dotted(loc: Any) -> str:
    """`failures[0].at` from a pydantic loc."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _known_keys(section: tuple[Any, ...]) -> list[str]:
    """The field names of the config model at `section` (a pydantic loc); [] when it is not a model."""
    model: Any = SimConfig
    for part in section:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        model = _model_in(field.annotation)
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside an annotation (`Outputs`, `tuple[FailureSpec, ...]`, `X | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


def _line_of(root: yaml.Node, loc: tuple[Any, ...]) -> int | None:
    """The line of the deepest YAML node on the path `loc` (a key's line for mapping entries)."""
    node, line = root, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)),
                         None)
            if match is None:
                break
            line, node = _line(match[0]), match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = _line(node)
        else:
            break
    return line


def _line(node: yaml.Node | None) -> int | None:
    return node.start_mark.line + 1 if node is not None else None


def config_line(path: Path, field: str) -> int | None:
    """The line of a dotted field in a YAML config (None when it is not there): for errors
    found after validation (component params, interruption and recovery settings)."""
    try:
        root = yaml.compose(Path(path).read_text(), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None
    parts = tuple(int(p) if p.isdigit() else p for p in field.split("."))
    return _line_of(root, parts) if root is not None else None


def locate_in_config(exc: LoomInputError, path: Path | None) -> LoomInputError:
    """`exc` (raised with a config field but no file, e.g. by `loom.run`) located in the config file."""
    if path is None or exc.source is not None or not exc.field:
        return exc
    line = config_line(path, exc.field)
    if line is None:
        return exc
    return FileLineError(f"field '{exc.field}': {exc.message}", source=str(path), line=line, field=exc.field)


def config_to_dict(config: SimConfig) -> dict[str, Any]:
    return config.model_dump(mode="json")
