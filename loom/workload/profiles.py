"""Synthetic-workload profiles (`loom/workload/data/profiles.yaml`): calibration targets + generator parameters.

Each profile pairs the **published** statistics of a real cluster (Acme Kalos / Seren,
with provenance in the YAML header) with the **model** parameters the generator
(`loom.workload.generate`) samples from. Hour-of-day and weekday arrival factors come
from the Helios Venus submission series.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from typing import Any

import numpy as np
import yaml

from loom.errors import LoomInputError, UnknownNameError
from loom.workload.job import JobClass

_SOURCE = "loom/workload/data/profiles.yaml"


@dataclass(frozen=True)
class ClassModel:
    job_class: JobClass
    job_share: float
    gpu_sizes: np.ndarray  # int
    gpu_probs: np.ndarray  # sums to 1
    median_s: float
    sigma: float
    p_failed: float
    p_cancelled: float
    failed_frac: tuple[float, float]
    cancelled_frac: tuple[float, float]
    preemptible: float
    priority: int


@dataclass(frozen=True)
class Profile:
    name: str
    cluster: str
    gpu_type: str
    job_prefix: str
    published: dict[str, Any]
    classes: tuple[ClassModel, ...]
    eval_batches: dict[str, Any]
    pretrain_announce_s: float | None
    models_by_gpus: dict[int, list[str]]
    vc_names: list[str]
    vc_weights: dict[str, np.ndarray]
    users_per_vc: int
    zipf_s: float
    hour_of_day: np.ndarray  # 24 factors, mean 1
    weekday: np.ndarray  # 7 factors (Mon..Sun), mean 1

    @property
    def jobs_per_day(self) -> float:
        return float(self.published["gpu_jobs"]) / float(self.published["span_days"])

    @property
    def max_run_s(self) -> float:
        return float(self.published.get("max_run_s", np.inf))

    def cls(self, job_class: JobClass) -> ClassModel | None:
        return next((c for c in self.classes if c.job_class == job_class), None)


def _err(profile: str, msg: str) -> LoomInputError:
    return LoomInputError(msg, source=_SOURCE, field=profile)


def _factors(raw: Any, n: int, what: str) -> np.ndarray:
    arr = np.asarray(raw, dtype=float)
    if arr.shape != (n,) or (arr < 0).any() or arr.sum() <= 0:
        raise LoomInputError(f"{what} needs {n} non-negative factors", source=_SOURCE, field=what)
    return arr / arr.mean()


def _class_model(profile: str, name: str, raw: dict[str, Any]) -> ClassModel:
    try:
        job_class = JobClass(name)
    except ValueError:
        raise _err(profile, f"unknown job class '{name}'") from None
    sizes = np.array([int(k) for k in raw["gpus"]], dtype=np.int64)
    probs = np.array([float(v) for v in raw["gpus"].values()])
    if (sizes < 1).any() or (probs < 0).any() or probs.sum() <= 0:
        raise _err(profile, f"{name}: bad GPU distribution")
    status = raw.get("status", {})
    p_f, p_c = float(status.get("failed", 0.0)), float(status.get("cancelled", 0.0))
    if p_f < 0 or p_c < 0 or p_f + p_c > 1:
        raise _err(profile, f"{name}: failed + cancelled probabilities must be in [0, 1]")
    return ClassModel(job_class, float(raw["job_share"]), sizes, probs / probs.sum(),
                      float(raw["duration"]["median_s"]), float(raw["duration"]["sigma"]), p_f, p_c,
                      tuple(raw.get("failed_frac", (0.5, 4.0))), tuple(raw.get("cancelled_frac", (1.0, 1.0))),
                      float(raw.get("preemptible", 0.0)), int(raw.get("priority", 0)))


@lru_cache(maxsize=1)
def _load() -> dict[str, Profile]:
    doc = yaml.safe_load((files("loom.workload") / "data" / "profiles.yaml").read_text(encoding="utf-8"))
    hours = _factors(doc["hour_of_day"], 24, "hour_of_day")
    week = _factors(doc["weekday"], 7, "weekday")
    out: dict[str, Profile] = {}
    for name, raw in doc["profiles"].items():
        model = raw["model"]
        classes = tuple(_class_model(name, c, v) for c, v in model["classes"].items())
        total = sum(c.job_share for c in classes)
        if abs(total - 1.0) > 1e-6:
            raise _err(name, f"class job shares sum to {total:g}, not 1")
        vcs = model["vcs"]
        weights = {}
        for c in classes:
            w = np.asarray(vcs["weights"][c.job_class.value], dtype=float)
            if w.shape != (len(vcs["names"]),) or w.sum() <= 0:
                raise _err(name, f"vcs.weights.{c.job_class.value} needs one weight per VC")
            weights[c.job_class.value] = w / w.sum()
        out[name] = Profile(
            name=name, cluster=raw["cluster"], gpu_type=raw["gpu_type"], job_prefix=raw.get("job_prefix", name),
            published=dict(raw["published"]), classes=classes, eval_batches=dict(model.get("eval_batches") or {}),
            pretrain_announce_s=model.get("pretrain_announce_s"),
            models_by_gpus={int(k): list(v) for k, v in model.get("models_by_gpus", {}).items()},
            vc_names=list(vcs["names"]), vc_weights=weights, users_per_vc=int(vcs.get("users_per_vc", 10)),
            zipf_s=float(vcs.get("zipf_s", 1.2)), hour_of_day=hours, weekday=week)
    return out


def profile_names() -> list[str]:
    return list(_load())


def get_profile(name: str) -> Profile:
    profiles = _load()
    if name not in profiles:
        raise UnknownNameError(f"unknown workload profile '{name}' (known: {', '.join(profiles)})",
                               field="profile")
    return profiles[name]
