"""Job-level failures from the Acme taxonomy (NSDI'24 §5): which jobs fail, how, and when.

Acme (shared/seeds/001_*.txt §5, Table 3; DESIGN.md §6) sorts failures into three kinds:

* **infrastructure** — GPU / NVLink / network / storage faults. 11% of failed jobs but > 82%
  of failed jobs' GPU time: they hit large, long pretraining jobs in the middle of a run, often
  several times. Recoverable: the job restarts from its last checkpoint.
* **framework** — runtime errors (RuntimeError, ValueError, ...) at the start of a job; fixed by
  changing the configuration, so the job ends for good.
* **script** — user programming errors; most failures, early, end the job for good.

plus **hangs** (§5.3: "training stalls"): the job stops progressing without an error and a
progress watchdog has to notice; recoverable like infrastructure failures.

A `FailurePlan` says "at `at_progress_s` seconds of progress (work at the requested size,
`JobSpec.duration` seconds at rate 1) this job fails with `kind`". The simulator fires each plan
once, in order; a recoverable one rolls the job back to its last checkpoint, and the re-done work
counts towards the next plan, so plans stay in progress coordinates.

Do not count failures twice. A trace's FAILED / CANCELLED jobs already end at their recorded
time, so by default `sample_failures` only injects into COMPLETED / UNKNOWN jobs. Injection is
meant for synthetic workloads with *would-be* durations: `generate(..., outcomes="would-be")`.

Calibration (defaults of `AcmeFailureModel`, checked by tests/test_job_failures.py on
`generate("acme-kalos", 30, seed=0, outcomes="would-be")`, 3,230 jobs, ~480k would-be GPU-hours):

* `fail_probability` is the chance of a terminal (framework or script) failure per class. The
  scheduler trace has 39.7% of Kalos GPU jobs failed ([CS] fail_rate_gpu; Seren 42.9%); Kalos is
  92.9% evaluation jobs, so evaluation must fail at ~0.38 for the job-level total to reach ~40%.
  Acme's log analysis says only 6.7% of evaluation *tasks* fail; its unit (32,500 logged tasks, a
  pretraining restart being a new task) is not the scheduler's job, and the two figures cannot both
  hold for one job population (0.929 × 0.067 + 0.071 ≤ 13%). `AcmeFailureModel.log_sample()` is
  the §5 variant (evaluation 0.067); the default follows the scheduler, like `generate`.
* `infra_rate_per_gpu_hour` — infrastructure failures are a Poisson process in GPU time (a job of
  g GPUs fails at rate g × rate per hour of progress), so they land on large, long jobs. Failure
  *events* are counted (each restart is a new failed job in Acme's accounting). With ~0.37 terminal
  failures per job, 11% infrastructure needs 0.11 / 0.89 × 0.37 ≈ 0.046 infrastructure events per
  job ≈ 150 per 30 Kalos days; the exposed GPU time (would-be GPU-hours before any terminal failure)
  is ~430k GPU-hours, so ~3.5e-4 per GPU-hour; that gave 10.1% on average over seeds 0-3, hence
  3.8e-4 (a 1024-GPU job fails every ~2.6 h of progress, one 8-GPU node every ~14 days). Nearly all of it lands on pretraining jobs, which run for
  hours, whereas terminal failures are early in small jobs, so infrastructure holds ~90% of failed
  GPU time (> 82% published).
* `hang_rate_per_gpu_hour` — [ASSUMED] a tenth of the infrastructure rate (Acme gives no count).
* Early-failure times — [ASSUMED] Beta fractions of the would-be duration: script Beta(0.5, 6)
  (median ~3%), framework Beta(0.6, 10) (median ~2%): "at the start of a job"; `framework_share`
  0.3 of terminal failures [ASSUMED] so that scripts are "most failures".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from loom.errors import LoomInputError
from loom.workload.job import FinalStatus, JobClass, JobSpec

FailureKind = Literal["infrastructure", "framework", "script", "hang"]
KINDS: tuple[str, ...] = ("infrastructure", "framework", "script", "hang")
RECOVERABLE = frozenset({"infrastructure", "hang"})
DEFAULT_INJECT_INTO = (FinalStatus.COMPLETED, FinalStatus.UNKNOWN)
_CLASS_NAMES = frozenset(c.value for c in JobClass)
_DEFAULT_FAIL = {"pretrain": 0.15, "sft": 0.40, "eval": 0.38, "debug": 0.45, "unknown": 0.40}


@dataclass(frozen=True, slots=True)
class FailurePlan:
    """One failure of one job, at `at_progress_s` seconds of progress at its requested size."""

    job_id: str
    kind: FailureKind
    at_progress_s: float

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise LoomInputError(f"unknown failure kind {self.kind!r} (one of {', '.join(KINDS)})", field="kind")
        if not (math.isfinite(self.at_progress_s) and self.at_progress_s >= 0):
            raise LoomInputError(f"at_progress_s must be >= 0, got {self.at_progress_s}", field="at_progress_s")

    @property
    def recoverable(self) -> bool:
        """Infrastructure failures and hangs restart from a checkpoint; the others end the job."""
        return self.kind in RECOVERABLE


def _bad(name: str, message: str) -> LoomInputError:
    return LoomInputError(f"{name} {message}", field=name)


def _check_prob(name: str, value: Any) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value <= 1.0):
        raise _bad(name, f"must be a probability in [0, 1], got {value!r}")


def _check_beta(name: str, value: Any) -> None:
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in value)
    if not ok:
        raise _bad(name, f"must be two positive Beta parameters (a, b), got {value!r}")


def _check_rate(name: str, value: Any) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise _bad(name, f"must be a finite rate >= 0, got {value!r}")


@dataclass(frozen=True)
class AcmeFailureModel:
    """Parameters of the failure injector (provenance and calibration: module docstring).

    `fail_probability` maps a `JobClass` value to the chance of a terminal (framework or script)
    failure; classes not listed use "unknown". Rates are per GPU-hour of progress.
    """

    fail_probability: Mapping[str, float] = field(default_factory=lambda: dict(_DEFAULT_FAIL))
    framework_share: float = 0.3  # of terminal failures; the rest are script errors
    script_frac: tuple[float, float] = (0.5, 6.0)  # Beta(a, b) fraction of the duration
    framework_frac: tuple[float, float] = (0.6, 10.0)
    infra_rate_per_gpu_hour: float = 3.8e-4
    hang_rate_per_gpu_hour: float = 3.8e-5

    def __post_init__(self) -> None:
        fp = self.fail_probability
        if not isinstance(fp, Mapping):
            raise _bad("fail_probability", f"must map job classes to probabilities, got {fp!r}")
        for cls, p in fp.items():
            if cls not in _CLASS_NAMES:
                raise _bad("fail_probability", f"has unknown job class {cls!r} "
                                               f"(one of {', '.join(sorted(_CLASS_NAMES))})")
            _check_prob("fail_probability", p)
        if "unknown" not in fp:
            raise _bad("fail_probability", "needs an 'unknown' entry (used for unlisted classes)")
        object.__setattr__(self, "fail_probability", MappingProxyType(dict(fp)))
        _check_prob("framework_share", self.framework_share)
        _check_beta("script_frac", self.script_frac)
        _check_beta("framework_frac", self.framework_frac)
        _check_rate("infra_rate_per_gpu_hour", self.infra_rate_per_gpu_hour)
        _check_rate("hang_rate_per_gpu_hour", self.hang_rate_per_gpu_hour)

    def p_fail(self, job_class: JobClass | str) -> float:
        name = job_class.value if isinstance(job_class, JobClass) else str(job_class)
        return float(self.fail_probability.get(name, self.fail_probability["unknown"]))

    @classmethod
    def log_sample(cls) -> AcmeFailureModel:
        """The §5 log-analysis variant: evaluation jobs fail 6.7% of the time (Kalos)."""
        return replace(cls(), fail_probability={**_DEFAULT_FAIL, "eval": 0.067})


def _poisson_events(rng: np.random.Generator, rate_per_gpu_hour: float, gpus: np.ndarray,
                    dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner index, progress seconds) of a Poisson process in GPU time over each job's [0, duration)."""
    counts = rng.poisson(rate_per_gpu_hour * gpus * dur / 3600.0)
    owner = np.repeat(np.arange(len(dur)), counts)
    return owner, rng.random(len(owner)) * dur[owner]


def _progress(at: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Millisecond progress (as traces round), strictly inside (0, duration): a plan that fires at
    0 or at the end would be no failure (durations are >= 1 s in generated traces)."""
    return np.clip(np.round(at, 3), np.minimum(1e-3, dur / 2), dur - np.minimum(1e-3, dur / 2))


def sample_failures(specs: Sequence[JobSpec], model: AcmeFailureModel | None = None, seed: int = 0,
                    inject_into: Iterable[FinalStatus] = DEFAULT_INJECT_INTO) -> dict[str, list[FailurePlan]]:
    """Failure plans per job id (only jobs that fail appear), sorted by progress; same seed, same plans.

    Only jobs whose `final_status` is in `inject_into` (default COMPLETED / UNKNOWN: recorded
    failures already end early) and that have a duration are eligible. A job gets at most one
    terminal failure; recoverable ones after it are dropped. Draws are per eligible job in trace
    order, so plans depend on the whole eligible list, not on each job alone.
    """
    model = model or AcmeFailureModel()
    allowed = set(inject_into)
    jobs = [j for j in specs if j.final_status in allowed and j.duration is not None and j.duration > 0]
    rng = np.random.default_rng(seed)
    n = len(jobs)
    if n == 0:
        return {}
    dur = np.array([j.duration for j in jobs], dtype=float)
    gpus = np.array([j.gpus for j in jobs], dtype=float)
    p = np.array([model.p_fail(j.job_class) for j in jobs])

    terminal = rng.random(n) < p
    framework = rng.random(n) < model.framework_share
    frac = np.where(framework, rng.beta(*model.framework_frac, n), rng.beta(*model.script_frac, n))
    term_at = np.where(terminal, _progress(frac * dur, dur), np.inf)
    infra = _poisson_events(rng, model.infra_rate_per_gpu_hour, gpus, dur)
    hang = _poisson_events(rng, model.hang_rate_per_gpu_hour, gpus, dur)

    t_owner = np.flatnonzero(terminal)
    owner = np.concatenate([infra[0], hang[0], t_owner])
    at = np.concatenate([_progress(infra[1], dur[infra[0]]), _progress(hang[1], dur[hang[0]]), term_at[t_owner]])
    kind = np.concatenate([np.zeros(len(infra[0]), np.int8), np.full(len(hang[0]), 3, np.int8),
                           np.where(framework[t_owner], 1, 2).astype(np.int8)])
    keep = (at < term_at[owner]) | (kind == 1) | (kind == 2)  # nothing after the terminal failure
    owner, at, kind = owner[keep], at[keep], kind[keep]
    order = np.lexsort((kind, at, owner))
    plans: dict[str, list[FailurePlan]] = {}
    for o, a, k in zip(owner[order].tolist(), at[order].tolist(), kind[order].tolist()):
        jid = jobs[o].job_id
        plans.setdefault(jid, []).append(FailurePlan(jid, KINDS[k], a))  # type: ignore[arg-type]
    return plans


def summarise(plans: Mapping[str, Sequence[FailurePlan]], specs: Sequence[JobSpec]) -> dict[str, Any]:
    """Shares to compare with Acme (§5, Table 3).

    * `fail_share`: jobs with at least one failure / jobs with a duration; `fail_share_by_class`.
    * `share_by_kind`: failure *events* per kind / all events — each restart is a new failed job in
      Acme's accounting, so this is Table 3's "count" share. `jobs_with_kind`: failing jobs with at
      least one failure of the kind / failing jobs.
    * `gpu_time_share_by_kind`: failed GPU time (GPU × progress until the last failure) split by
      the failure that ends each stretch; work re-done after a rollback is not counted.
    * `median_fraction_by_kind`: median progress fraction (at / duration) of each kind (NaN: none).
    """
    by_id = {j.job_id: j for j in specs}
    considered = [j for j in specs if j.duration is not None and j.duration > 0]
    classes = sorted({j.job_class.value for j in considered})
    failing = {jid for jid, ps in plans.items() if ps}
    events = {k: 0 for k in KINDS}
    jobs_with = {k: 0 for k in KINDS}
    gpu_s = {k: 0.0 for k in KINDS}
    fracs: dict[str, list[float]] = {k: [] for k in KINDS}
    for jid in failing:
        spec = by_id.get(jid)
        if spec is None or not spec.duration:
            raise LoomInputError(f"plans name job {jid!r}, which has no duration in specs", field="plans")
        prev = 0.0
        for plan in sorted(plans[jid], key=lambda q: q.at_progress_s):
            events[plan.kind] += 1
            gpu_s[plan.kind] += spec.gpus * max(0.0, plan.at_progress_s - prev)
            prev = max(prev, plan.at_progress_s)
            fracs[plan.kind].append(plan.at_progress_s / spec.duration)
        for k in {q.kind for q in plans[jid]}:
            jobs_with[k] += 1
    n_events = sum(events.values()) or 1
    total_gpu = sum(gpu_s.values()) or 1.0
    n_failing = len(failing) or 1

    def share_of(cls: str) -> float:
        group = [j for j in considered if j.job_class.value == cls]
        return sum(j.job_id in failing for j in group) / len(group)

    return {
        "jobs": len(considered),
        "failed_jobs": len(failing),
        "fail_share": len(failing) / max(1, len(considered)),
        "fail_share_by_class": {c: share_of(c) for c in classes},
        "failures": sum(events.values()),
        "share_by_kind": {k: events[k] / n_events for k in KINDS},
        "jobs_with_kind": {k: jobs_with[k] / n_failing for k in KINDS},
        "failed_gpu_hours": sum(gpu_s.values()) / 3600.0,
        "gpu_time_share_by_kind": {k: gpu_s[k] / total_gpu for k in KINDS},
        "median_fraction_by_kind": {k: float(np.median(fracs[k])) if fracs[k] else math.nan for k in KINDS},
    }
