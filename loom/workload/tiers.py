"""SLA tiers (Singularity): which tier a job is in and how many of its requested
GPUs that tier guarantees — the workload's entitlements, shared by the `sla`
policy (which honours them) and the SLA-attainment report (which measures a
run against them).

They live here, not in the policy, because a report or a live service's
config loader must read them without importing a scheduling algorithm.

* **Tiers.** `premium`, `standard`, `basic` guarantee a fraction of the job's
  requested GPUs: by default 1.0, 0.5 and 0.0 (best effort). A job's tier comes
  from `tier_by`: `priority` (default: ≥ 2 premium, 1 standard, ≤ 0 basic),
  `job_class` or `vc`; `tiers_map` maps values of that field to tiers (for
  `priority` its keys are priorities and override the thresholds); unmapped
  values get `default_tier`.
* **Sizes.** A job never runs below `min_devices` of its plan (its own, else
  `default_plan(request)`: ZeRO shards and model-parallel shards need their own
  device, Singularity §5.4). Valid sizes are the multiples of that minimum up to
  the request, plus the request. A tier's guarantee in GPUs is the smallest
  valid size ≥ fraction × request (0 when the fraction is 0).

Today a run declares its tiers in the sla policy's parameters, so errors are
located under `policy.params` (`PARAMS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.perf.interruptions import InterruptionModel, default_plan
from loom.workload.job import JobSpec

TIERS = ("premium", "standard", "basic")  # highest first: a tier's rank is its index
TIER_BY = ("priority", "job_class", "vc")
PARAMS = "policy.params"  # where a config declares the tiers (the sla policy's parameters)
_MODEL = InterruptionModel()

__all__ = ["PARAMS", "TIERS", "TIER_BY", "TierRule", "min_devices", "tier_rule", "valid_sizes"]


def min_devices(spec: JobSpec, plan: ParallelPlan | None = None) -> int:
    """Fewest devices the job can be time-sliced onto (never more than its request)."""
    return max(1, min(spec.gpus, _MODEL.min_devices(plan or default_plan(spec.gpus))))


def valid_sizes(spec: JobSpec, plan: ParallelPlan | None = None) -> list[int]:
    """Multiples of the minimum size up to the request, plus the request; ascending."""
    step = min_devices(spec, plan)
    return sorted({*range(step, spec.gpus + 1, step), spec.gpus})


def _fraction(value: Any, name: str) -> None:
    """A tier's guaranteed fraction: a number in [0, 1] (worded as `loom.policies.params` words it)."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and 0 <= value <= 1)
    if not ok:
        raise LoomInputError(f"must be a number in [0, 1], got {value!r}", field=f"{PARAMS}.{name}")


def _one_of(value: Any, name: str, options: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in options:
        raise LoomInputError(f"must be one of {', '.join(options)}, got {value!r}", field=f"{PARAMS}.{name}")


@dataclass(frozen=True)
class TierRule:
    """Which tier a job is in and how many GPUs that guarantees it."""

    fractions: Mapping[str, float] = field(default_factory=lambda: {"premium": 1.0, "standard": 0.5, "basic": 0.0})
    tier_by: str = "priority"
    tiers_map: Mapping[Any, str] | None = None
    default_tier: str = "basic"

    def __post_init__(self) -> None:
        for tier in TIERS:
            _fraction(self.fractions.get(tier), tier)
        _one_of(self.tier_by, "tier_by", TIER_BY)
        _one_of(self.default_tier, "default_tier", TIERS)
        if self.tiers_map is not None:
            if not isinstance(self.tiers_map, Mapping):
                raise LoomInputError(f"must be a mapping of values to tiers, got {self.tiers_map!r}",
                                     field=f"{PARAMS}.tiers_map")
            for key, tier in self.tiers_map.items():
                _one_of(tier, f"tiers_map.{key}", TIERS)

    def tier(self, spec: JobSpec) -> str:
        mapping = self.tiers_map or {}
        if self.tier_by == "priority":
            p = spec.priority
            if p in mapping or str(p) in mapping:
                return mapping.get(p) or mapping[str(p)]
            return "premium" if p >= 2 else "standard" if p == 1 else "basic"
        value = spec.job_class.value if self.tier_by == "job_class" else spec.vc
        return mapping.get(value, self.default_tier)

    def rank(self, spec: JobSpec) -> int:
        return TIERS.index(self.tier(spec))

    def guarantee(self, spec: JobSpec, plan: ParallelPlan | None = None) -> int:
        """GPUs the job's tier guarantees: the smallest valid size ≥ fraction × request."""
        want = self.fractions[self.tier(spec)] * spec.gpus
        if want <= 0:
            return 0
        need = math.ceil(want - 1e-9)
        return next(s for s in valid_sizes(spec, plan) if s >= need)


def tier_rule(params: Mapping[str, Any]) -> TierRule:
    """The tier rule from the sla policy's parameters (`premium`, `standard`, `basic`, `tier_by`,
    `tiers_map`, `default_tier`, each with its default); other keys (the policy's pacing and
    elasticity) are ignored, so a run's config can be read without building the policy."""
    tiers_map = params.get("tiers_map")
    return TierRule({"premium": params.get("premium", 1.0), "standard": params.get("standard", 0.5),
                     "basic": params.get("basic", 0.0)},
                    params.get("tier_by", "priority"),
                    dict(tiers_map) if isinstance(tiers_map, Mapping) else tiers_map,
                    params.get("default_tier", "basic"))
