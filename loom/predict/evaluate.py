"""Time-ordered evaluation of the JCT predictor against the recent-history baseline.

Split: jobs with a duration, sorted by submit time; the first `train_frac`
(default 70 %) train, the rest test. Training drops jobs killed early
(`features.killed_early`); the test set keeps every job with a duration.
Test jobs' history features see the training jobs and the test jobs that
ended before their submit (what an online scheduler would know).

Metrics (bins of 10 min, last bin open-ended):
* `rmse_bins`: RMSE of the expected bin (the distribution's mean) vs the true bin;
* `rmse_bins_point`: RMSE of the point bin (classifier argmax / bin of the median);
* `acc`: point bin exact; `within1`: |point − true| ≤ 1;
* `mae_s`: mean |expected seconds − duration|; `mae_p50_s`: same for the p50
  (the MAE-optimal point; heavy tails make the mean a poor one); `mae_bins`;
* `cov_p50` / `cov_p90`: fraction of jobs whose duration ≤ predicted p50 / p90
  (calibrated: 0.5 / 0.9).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loom.errors import LoomInputError
from loom.predict import features as F
from loom.predict.baseline import RecentHistoryBaseline
from loom.predict.model import JctPredictor, Prediction, ProgressFn
from loom.workload.job import JobSpec


@dataclass(frozen=True)
class Split:
    train: list[JobSpec]
    test: list[JobSpec]


def time_split(specs: Sequence[JobSpec], train_frac: float = 0.7) -> Split:
    if not 0.0 < train_frac < 1.0:
        raise LoomInputError(f"train fraction must be in (0, 1), got {train_frac}", field="train_frac")
    jobs = sorted((s for s in specs if s.duration is not None), key=lambda s: s.submit_time)
    cut = int(len(jobs) * train_frac)
    if cut < 10 or len(jobs) - cut < 1:
        raise LoomInputError(f"trace too small to split: {len(jobs)} jobs with durations", field="trace")
    return Split(jobs[:cut], jobs[cut:])


def metrics(pred: Prediction, specs: Sequence[JobSpec]) -> dict[str, float]:
    dur = np.array([s.duration for s in specs], dtype=float)
    true = F.duration_bin(dur).astype(float)
    point = pred.bin.astype(float)
    out = {
        "jobs": float(len(specs)),
        "rmse_bins": float(np.sqrt(np.mean((pred.expected_bin - true) ** 2))),
        "rmse_bins_point": float(np.sqrt(np.mean((point - true) ** 2))),
        "mae_bins": float(np.mean(np.abs(pred.expected_bin - true))),
        "acc": float(np.mean(point == true)),
        "within1": float(np.mean(np.abs(point - true) <= 1)),
        "mae_s": float(np.mean(np.abs(pred.seconds - dur))),
    }
    if 0.5 in pred.quantiles:
        out["mae_p50_s"] = float(np.mean(np.abs(pred.quantiles[0.5] - dur)))
    for q, v in pred.quantiles.items():
        out[f"cov_p{round(q * 100)}"] = float(np.mean(dur <= v))
    return out


def evaluate_specs(specs: Sequence[JobSpec], modes: Sequence[str] = ("classify",), train_frac: float = 0.7,
                   seed: int = 0, n_bags: int = 5, model: JctPredictor | None = None,
                   baseline: bool = True, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Train (unless `model` is given) and evaluate on a time-ordered split; `progress`
    hears each predictor's phases as "NAME: phase" (features, training bags, predicting).

    Returns {"train_jobs", "test_jobs", "removed_killed_early", "results": {name: metrics}}.
    """
    split = time_split(specs, train_frac)
    train_used = len(F.training_jobs(split.train))
    predictors: list[tuple[str, Any]] = []
    if model is not None:
        predictors.append((f"gbm-{model.mode}", model))
    else:
        predictors += [(f"gbm-{m}", JctPredictor(mode=m, seed=seed, n_bags=n_bags)) for m in modes]
    if baseline:
        predictors.append(("baseline", RecentHistoryBaseline()))
    results = {name: _evaluate_one(name, pred, split, trained=pred is model, progress=progress)
               for name, pred in predictors}
    return {"train_jobs": train_used, "test_jobs": len(split.test),
            "removed_killed_early": len(split.train) - train_used, "results": results}


def _evaluate_one(name: str, pred: Any, split: Split, trained: bool, progress: ProgressFn | None) -> dict[str, float]:
    """Fit (unless `trained`) and score one predictor; its phases reported as "NAME: phase"."""
    def report(phase: str, done: int, total: int) -> None:
        if progress is not None:
            progress(f"{name}: {phase}", done, total)

    gbm = isinstance(pred, JctPredictor)
    t0 = time.perf_counter()
    if gbm and not trained:
        pred.fit(split.train, progress=report)
    elif not trained:
        report("fitting", 0, 1)
        pred.fit(split.train)
    fit_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    if gbm:
        p = pred.predict(split.test, history=split.test, progress=report)
    else:
        report("predicting", 0, 1)
        p = pred.predict(split.test, history=split.test)
    row = metrics(p, split.test)
    row["train_s"] = fit_s
    row["predict_s"] = time.perf_counter() - t1
    return row


def evaluate_trace(trace: str, **kwargs: Any) -> dict[str, Any]:
    from loom.workload.loaders import load_trace

    out = evaluate_specs(load_trace(trace), **kwargs)
    out["trace"] = trace
    return out
