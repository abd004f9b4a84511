"""`JctPredictor`: bagged LightGBM over submit-time features (paper, App. G).

* `mode="classify"`: B bootstrap LightGBM multiclass models over the 10-minute
  bins; their averaged class probabilities are the predictive distribution.
  Point bin = argmax; expected bin = probability-weighted mean; quantiles
  interpolate the distribution's CDF linearly inside a bin (the open-ended
  last bin uses the training durations that fell in it).
* `mode="regress"`: B bootstrap LightGBM regressors on log1p(duration); the
  ensemble mean is the centre; quantiles add the out-of-bag residual
  quantiles, widened per job by the ensemble spread
  (scale = sqrt(1 + var_ensemble / var_residual)).

Saved as JSON (LightGBM model strings + plain numbers and the history pool),
never a pickle. Deterministic for a seed (`deterministic=True`, 2 threads).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np

from loom.errors import LoomInputError
from loom.predict import features as F
from loom.workload.job import FinalStatus, JobClass, JobSpec

FORMAT_VERSION = 1
MODES = ("classify", "regress")
# progress(phase, done, total): called as each long phase starts and advances (e.g. a CLI bar)
ProgressFn = Callable[[str, int, int], None]
_RES_GRID = np.linspace(0.005, 0.995, 100)


@dataclass(frozen=True)
class Prediction:
    """Per-job arrays (same order as the input specs)."""

    bin: np.ndarray  # most likely bin (classify) / bin of the median (regress)
    expected_bin: np.ndarray  # mean of the predictive distribution over bins (the RMSE-optimal point)
    seconds: np.ndarray  # expected duration in seconds
    quantiles: dict[float, np.ndarray]  # q → seconds
    std_bins: np.ndarray  # spread of the predictive distribution, in bins

    def quantile(self, q: float) -> np.ndarray:
        return self.quantiles[q]


def _params(mode: str, seed: int, num_threads: int) -> dict[str, Any]:
    p: dict[str, Any] = {
        "learning_rate": 0.08, "num_leaves": 31, "min_data_in_leaf": 20, "feature_fraction": 0.9,
        "lambda_l2": 1.0, "max_bin": 63, "max_cat_to_onehot": 8, "cat_smooth": 10.0,
        "seed": seed, "deterministic": True, "force_row_wise": True, "num_threads": num_threads, "verbose": -1,
    }
    if mode == "classify":  # 31 trees per round: fewer, smaller trees, a larger step
        p.update(objective="multiclass", num_class=F.N_BINS, learning_rate=0.15, num_leaves=15, min_data_in_leaf=40)
    else:
        p.update(objective="regression")
    return p


def _silent(phase: str, done: int, total: int) -> None:
    """The default progress callback: report nothing."""


class JctPredictor:
    def __init__(self, mode: str = "classify", n_bags: int = 5, num_rounds: int | None = None, seed: int = 0,
                 quantiles: Sequence[float] = (0.5, 0.9), num_threads: int = 2, history_k: int = F.HISTORY_K):
        if mode not in MODES:
            raise LoomInputError(f"unknown predictor mode '{mode}': use one of {', '.join(MODES)}", field="mode")
        if n_bags < 1:
            raise LoomInputError("n_bags must be ≥ 1", field="n_bags")
        self.mode = mode
        self.n_bags = n_bags
        self.num_rounds = num_rounds if num_rounds is not None else (30 if mode == "classify" else 200)
        self.seed = seed
        self.quantile_levels = tuple(sorted(float(q) for q in quantiles))
        self.num_threads = num_threads
        self.history_k = history_k
        self.boosters: list[lgb.Booster] = []
        self.vocab: dict[str, list[str]] = {}
        self.pool: list[JobSpec] = []
        self.last_bin_durations: np.ndarray = np.array([F.MAX_BIN * F.BIN_SECONDS])
        self.residuals: np.ndarray = np.zeros(1)
        self.n_train = 0

    # ------------------------------------------------------------------ fit
    def fit(self, specs: Sequence[JobSpec], progress: ProgressFn | None = None) -> JctPredictor:
        """Train on jobs with a duration, minus those killed early (`features.killed_early`);
        `progress` hears the feature building and each bag's training."""
        report = progress or _silent
        train = sorted(F.training_jobs(specs), key=lambda s: s.submit_time)
        if len(train) < 10:
            raise LoomInputError(f"need at least 10 jobs with durations to train, got {len(train)}", field="trace")
        self.pool = list(train)
        self.vocab = F.build_vocab(train)
        report(f"building features of {len(train):,} training jobs", 0, 1)
        X = F.feature_matrix(train, self.pool, self.vocab, self.history_k)
        report(f"building features of {len(train):,} training jobs", 1, 1)
        dur = np.array([s.duration for s in train], dtype=float)
        bins = F.duration_bin(dur)
        last = np.sort(dur[bins == F.MAX_BIN])
        self.last_bin_durations = last if len(last) else np.array([F.MAX_BIN * F.BIN_SECONDS])
        y = bins.astype(float) if self.mode == "classify" else np.log1p(dur)
        rng = np.random.default_rng(self.seed)
        n = len(train)
        self.boosters = []
        oob_res: list[np.ndarray] = []
        for b in range(self.n_bags):
            report(f"training {self.n_bags} {self.mode} bag(s)", b, self.n_bags)
            idx = rng.integers(0, n, n) if self.n_bags > 1 else np.arange(n)
            weight = np.bincount(idx, minlength=n).astype(float)
            keep = weight > 0
            ds = lgb.Dataset(X[keep], label=y[keep], weight=weight[keep], feature_name=F.feature_names(),
                             categorical_feature=F.categorical_indices(), free_raw_data=True,
                             params={"max_bin": 63, "verbose": -1})
            booster = lgb.train(_params(self.mode, self.seed + b, self.num_threads), ds,
                                num_boost_round=self.num_rounds)
            self.boosters.append(booster)
            if self.mode == "regress":
                out = ~keep if (~keep).any() else keep
                oob_res.append(y[out] - booster.predict(X[out], num_threads=self.num_threads))
        report(f"training {self.n_bags} {self.mode} bag(s)", self.n_bags, self.n_bags)
        if self.mode == "regress":
            self.residuals = np.sort(np.concatenate(oob_res))
        self.n_train = n
        return self

    # -------------------------------------------------------------- predict
    def predict(self, specs: Sequence[JobSpec], history: Sequence[JobSpec] = (),
                progress: ProgressFn | None = None) -> Prediction:
        """Predict from submit-time features. History features use the training
        jobs plus `history` (e.g. the evaluated jobs themselves: each job only sees
        the ones that ended before its submit); `progress` hears features and prediction."""
        if not self.boosters:
            raise LoomInputError("predictor is not trained", field="model")
        report = progress or _silent
        pool = self.pool + list(history) if history else self.pool
        report(f"building features of {len(specs):,} jobs", 0, 1)
        X = F.feature_matrix(list(specs), pool, self.vocab, self.history_k)
        report(f"building features of {len(specs):,} jobs", 1, 1)
        report(f"predicting {len(specs):,} jobs", 0, 1)
        out = self._classify(X) if self.mode == "classify" else self._regress(X)
        report(f"predicting {len(specs):,} jobs", 1, 1)
        return out

    def _classify(self, X: np.ndarray) -> Prediction:
        probs = np.mean([b.predict(X, num_threads=self.num_threads) for b in self.boosters], axis=0)
        probs = probs.reshape(len(X), F.N_BINS)
        probs = probs / probs.sum(axis=1, keepdims=True)
        ks = np.arange(F.N_BINS, dtype=float)
        expected_bin = probs @ ks
        std = np.sqrt(np.maximum(probs @ ks**2 - expected_bin**2, 0.0))
        centers = (ks + 0.5) * F.BIN_SECONDS
        centers[-1] = float(self.last_bin_durations.mean())
        cdf = np.cumsum(probs, axis=1)
        qs = {q: self._bin_quantile(probs, cdf, q) for q in self.quantile_levels}
        return Prediction(np.argmax(probs, axis=1), expected_bin, probs @ centers, qs, std)

    def _bin_quantile(self, probs: np.ndarray, cdf: np.ndarray, q: float) -> np.ndarray:
        k = np.minimum((cdf < q).sum(axis=1), F.MAX_BIN)
        rows = np.arange(len(probs))
        below = np.where(k > 0, cdf[rows, np.maximum(k - 1, 0)], 0.0)
        frac = np.clip((q - below) / np.maximum(probs[rows, k], 1e-12), 0.0, 1.0)
        sec = (k + frac) * F.BIN_SECONDS
        last = k == F.MAX_BIN
        if last.any():
            sec[last] = np.quantile(self.last_bin_durations, frac[last])
        return sec

    def _regress(self, X: np.ndarray) -> Prediction:
        preds = np.array([b.predict(X, num_threads=self.num_threads) for b in self.boosters])
        mu = preds.mean(axis=0)
        var_ens = preds.var(axis=0)
        var_res = max(float(self.residuals.var()), 1e-9)
        scale = np.sqrt(1.0 + var_ens / var_res)
        grid = np.quantile(self.residuals, _RES_GRID)
        sec_grid = np.expm1(mu[:, None] + grid[None, :] * scale[:, None]).clip(min=0.0)
        bin_grid = F.duration_bin(sec_grid).astype(float)
        qs = {q: np.expm1(mu + float(np.quantile(self.residuals, q)) * scale).clip(min=0.0)
              for q in self.quantile_levels}
        median = np.expm1(mu + float(np.quantile(self.residuals, 0.5)) * scale).clip(min=0.0)
        return Prediction(F.duration_bin(median), bin_grid.mean(axis=1), sec_grid.mean(axis=1), qs,
                          bin_grid.std(axis=1))

    # ------------------------------------------------------------ save/load
    def to_dict(self) -> dict[str, Any]:
        pool = {
            "job_id": [s.job_id for s in self.pool], "submit_time": [s.submit_time for s in self.pool],
            "gpus": [s.gpus for s in self.pool], "duration": [s.duration for s in self.pool],
            "gpu_type": [s.gpu_type for s in self.pool],
            "gpu_types": [list(s.gpu_types) if s.gpu_types else None for s in self.pool],
            "job_class": [s.job_class.value for s in self.pool], "user": [s.user for s in self.pool],
            "vc": [s.vc for s in self.pool], "final_status": [s.final_status.value for s in self.pool],
            "model": [s.model for s in self.pool], "preemptible": [s.preemptible for s in self.pool],
            "gpu_fraction": [s.gpu_fraction for s in self.pool], "cpu_milli": [s.cpu_milli for s in self.pool],
            "memory_mib": [s.memory_mib for s in self.pool], "priority": [s.priority for s in self.pool],
        }
        return {
            "format": "loom-jct-predictor", "version": FORMAT_VERSION, "mode": self.mode, "n_bags": self.n_bags,
            "num_rounds": self.num_rounds, "seed": self.seed, "quantiles": list(self.quantile_levels),
            "num_threads": self.num_threads, "history_k": self.history_k, "n_train": self.n_train,
            "vocab": self.vocab, "last_bin_durations": self.last_bin_durations.tolist(),
            "residuals": self.residuals.tolist(), "pool": pool,
            "boosters": [b.model_to_string() for b in self.boosters],
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict()))
        return path

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JctPredictor:
        if d.get("format") != "loom-jct-predictor" or d.get("version") != FORMAT_VERSION:
            raise LoomInputError("not a loom JCT predictor file (format/version mismatch)", field="model")
        m = cls(mode=d["mode"], n_bags=d["n_bags"], num_rounds=d["num_rounds"], seed=d["seed"],
                quantiles=d["quantiles"], num_threads=d["num_threads"], history_k=d["history_k"])
        m.n_train = d["n_train"]
        m.vocab = {k: list(v) for k, v in d["vocab"].items()}
        m.last_bin_durations = np.array(d["last_bin_durations"], dtype=float)
        m.residuals = np.array(d["residuals"], dtype=float)
        p = d["pool"]
        m.pool = [JobSpec(job_id=p["job_id"][i], submit_time=p["submit_time"][i], gpus=p["gpus"][i],
                          duration=p["duration"][i], gpu_type=p["gpu_type"][i],
                          gpu_types=tuple(p["gpu_types"][i]) if p["gpu_types"][i] else None,
                          job_class=JobClass(p["job_class"][i]), user=p["user"][i], vc=p["vc"][i],
                          final_status=FinalStatus(p["final_status"][i]), model=p["model"][i],
                          preemptible=p["preemptible"][i], gpu_fraction=p["gpu_fraction"][i],
                          cpu_milli=p["cpu_milli"][i], memory_mib=p["memory_mib"][i], priority=p["priority"][i])
                  for i in range(len(p["job_id"]))]
        m.boosters = [lgb.Booster(model_str=s) for s in d["boosters"]]
        return m

    @classmethod
    def load(cls, path: str | Path) -> JctPredictor:
        path = Path(path)
        if not path.is_file():
            raise LoomInputError("model file not found", source=str(path), field="model")
        try:
            d = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LoomInputError(f"model file is not valid JSON ({exc})", source=str(path), field="model") from None
        if not isinstance(d, dict):
            raise LoomInputError("not a loom JCT predictor file", source=str(path), field="model")
        try:
            return cls.from_dict(d)
        except LoomInputError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, lgb.basic.LightGBMError) as exc:
            raise LoomInputError(f"corrupt JCT predictor file ({type(exc).__name__}: {exc})", source=str(path),
                                 field="model") from None


def runtime_estimator(predictor: JctPredictor, quantile: float = 0.9, floor: float = 60.0,
                      history: Sequence[JobSpec] = (), specs: Sequence[JobSpec] = ()) -> Callable[[Any], float]:
    """A `SchedulingContext.runtime_estimate`: predicted quantile of the run time
    minus the work already done, at least `floor` seconds.

    One prediction per job id, cached. `specs` (e.g. the simulated trace) are
    predicted up front in one batch, their history features seeing the training
    jobs, `history` and those of `specs` that end before each one's submit
    (end = submit + trace duration); jobs not in `specs` are predicted alone
    when first asked, from the training jobs and `history`."""
    if quantile not in predictor.quantile_levels:  # the predictor then also reports this quantile
        predictor.quantile_levels = tuple(sorted({*predictor.quantile_levels, float(quantile)}))
    cache: dict[str, float] = {}
    if specs:
        batch = list(specs)
        pred = predictor.predict(batch, history=list(history) + batch)
        cache.update(zip((s.job_id for s in batch), pred.quantiles[float(quantile)].tolist()))

    def estimate(job: Any) -> float:
        jid = job.spec.job_id
        total = cache.get(jid)
        if total is None:
            pred = predictor.predict([job.spec], history=history)
            total = cache[jid] = float(pred.quantiles[float(quantile)][0])
        # work already done, as the backend last reported it (observable progress)
        done = max(0.0, getattr(job, "progress", 0.0) or 0.0) if job.spec.duration is not None else 0.0
        return max(total - done, floor)

    return estimate
