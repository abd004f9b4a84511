"""GPU quotas per virtual cluster (VC) and which jobs are best-effort: the
workload's entitlements, shared by the `quota` policy (which enforces them)
and the fairness report (which measures a run against them).

They live here, not in the policy, because they describe what each VC is
owed, not how a scheduler honours it: a report (or a live service's config
loader) must read them without importing a policy.

* **Quotas.** VC name → guaranteed GPUs (whole numbers ≥ 0), given inline or
  as a YAML file (`{vc: gpus}` or `{quotas: {vc: gpus}}`); VCs not listed —
  and jobs without a VC — get `default_quota`.
* **Best-effort jobs.** A job is best-effort when `spec.preemptible` is True
  or its `spec.job_class` is one of `best_effort_classes` (default: eval and
  debug, Acme's short, restartable jobs); every other job is guaranteed.

Today a run declares its quotas in the quota policy's parameters, so errors
are located under `policy.params` (`PARAMS`) unless the caller says where.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loom.errors import LoomInputError
from loom.workload.job import JobClass, JobSpec

DEFAULT_BEST_EFFORT_CLASSES = ("eval", "debug")
PARAMS = "policy.params"  # where a config declares quotas (the quota policy's parameters)

__all__ = [
    "DEFAULT_BEST_EFFORT_CLASSES",
    "PARAMS",
    "QuotaEntitlements",
    "best_effort_classes_of",
    "best_effort_rule",
    "check_quota_value",
    "load_quota_file",
    "parse_quotas",
    "quota_entitlements",
]


def check_quota_value(value: Any, field: str, source: str | None = None) -> int:
    """A VC quota: whole GPUs ≥ 0. The error names the file (`source`) when quotas come from one
    and says what a quota is, so a user can fix it without reading code."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LoomInputError(f"a quota must be a whole number of GPUs, got {value!r}", source=source, field=field)
    if value < 0:
        raise LoomInputError(f"a quota cannot be negative, got {value}", source=source, field=field)
    return value


def parse_quotas(quotas: Any, field: str = f"{PARAMS}.quotas", source: str | None = None) -> dict[str, int]:
    """VC → guaranteed GPUs, checked: a mapping of names to whole numbers ≥ 0.

    Keys are turned into strings (YAML reads a VC named 103959 as a number).
    """
    if not isinstance(quotas, Mapping):
        raise LoomInputError(f"quotas must be a mapping of VC name to GPUs, got {type(quotas).__name__}",
                             source=source, field=field)
    return {str(vc): check_quota_value(gpus, f"{field}.{vc}", source) for vc, gpus in quotas.items()}


def load_quota_file(path: str | Path, field: str = f"{PARAMS}.quota_file") -> dict[str, int]:
    """Quotas from YAML: `{vc: gpus, ...}` or `{quotas: {vc: gpus, ...}}` (errors name the file)."""
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise LoomInputError(f"cannot read quota file: {exc.strerror}", source=source, field=field) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise LoomInputError(f"invalid YAML: {getattr(exc, 'problem', exc)}", source=source,
                             line=mark.line + 1 if mark is not None else None) from None
    if isinstance(data, dict) and set(data) == {"quotas"}:
        return parse_quotas(data["quotas"], "quotas", source)
    return parse_quotas(data if data is not None else {}, "quotas", source)


def best_effort_classes_of(best_effort_classes: Iterable[str | JobClass] | str | None,
                           field: str = f"{PARAMS}.best_effort_classes") -> frozenset[str]:
    """The job-class values named (None: none), each checked against the known classes."""
    if best_effort_classes is None:
        best_effort_classes = ()
    if isinstance(best_effort_classes, str):
        best_effort_classes = (best_effort_classes,)
    known = {c.value for c in JobClass}
    classes = set()
    for name in best_effort_classes:
        value = name.value if isinstance(name, JobClass) else name
        if value not in known:
            raise LoomInputError(f"unknown job class {name!r} (known: {', '.join(sorted(known))})", field=field)
        classes.add(value)
    return frozenset(classes)


def _is_best_effort(spec: JobSpec, classes: frozenset[str]) -> bool:
    return spec.preemptible or getattr(spec.job_class, "value", spec.job_class) in classes


def best_effort_rule(best_effort_classes: Iterable[str | JobClass] | str | None = DEFAULT_BEST_EFFORT_CLASSES,
                     field: str = f"{PARAMS}.best_effort_classes") -> Callable[[JobSpec], bool]:
    """The predicate `spec -> bool`: preemptible, or of a best-effort job class."""
    classes = best_effort_classes_of(best_effort_classes, field)

    def is_best_effort(spec: JobSpec) -> bool:
        return _is_best_effort(spec, classes)

    return is_best_effort


@dataclass(frozen=True)
class QuotaEntitlements:
    """What each VC is guaranteed and which jobs only borrow: all a policy or report needs."""

    quotas: Mapping[str, int]
    default_quota: int = 0
    best_effort_classes: frozenset[str] = frozenset(DEFAULT_BEST_EFFORT_CLASSES)

    def quota_of(self, vc: str | None) -> int:
        return self.quotas.get(vc, self.default_quota) if vc is not None else self.default_quota

    def is_best_effort(self, spec: JobSpec) -> bool:
        return _is_best_effort(spec, self.best_effort_classes)


def quota_entitlements(params: Mapping[str, Any], where: str = PARAMS) -> QuotaEntitlements:
    """Entitlements from the quota policy's parameters (`quotas` or `quota_file` — exactly one —,
    `default_quota`, `best_effort_classes`); other keys (the policy's `order`) are ignored, so a
    run's config can be read without building the policy. Errors are located under `where`."""
    quotas, quota_file = params.get("quotas"), params.get("quota_file")
    if quotas is not None and quota_file is not None:
        raise LoomInputError("give quotas or quota_file, not both", field=f"{where}.quotas")
    if quotas is None and quota_file is None:
        raise LoomInputError("the quota policy needs per-VC quotas: set quotas ({vc: gpus}) or quota_file",
                             field=f"{where}.quotas")
    parsed = (parse_quotas(quotas, f"{where}.quotas") if quotas is not None
              else load_quota_file(quota_file, f"{where}.quota_file"))
    return QuotaEntitlements(
        parsed,
        check_quota_value(params.get("default_quota", 0), f"{where}.default_quota"),
        best_effort_classes_of(params.get("best_effort_classes", DEFAULT_BEST_EFFORT_CLASSES),
                               f"{where}.best_effort_classes"),
    )
