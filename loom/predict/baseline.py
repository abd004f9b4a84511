"""QSSF-like baseline (Helios): predict a job from its user's recent finished durations.

For a job submitted at t, take the last `k` jobs of the same user that ended
strictly before t; if the user has none (or the trace has no users), the same
VC's; then the last `k` finished jobs of the whole cluster; then the training
median. Point bin = bin of the median; expected bin = mean of the history's
(capped) bins; p-quantiles = empirical quantiles of the history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from loom.predict import features as F
from loom.predict.model import Prediction
from loom.workload.job import JobSpec

KEYS = ("user", "vc", "global")


class RecentHistoryBaseline:
    def __init__(self, k: int = F.HISTORY_K, quantiles: Sequence[float] = (0.5, 0.9), keys: Sequence[str] = KEYS):
        self.k = k
        self.quantile_levels = tuple(sorted(float(q) for q in quantiles))
        self.keys = tuple(keys)
        self.pool: list[JobSpec] = []
        self.median = 0.0

    def fit(self, specs: Sequence[JobSpec]) -> RecentHistoryBaseline:
        self.pool = F.training_jobs(specs)
        d = [s.duration for s in self.pool]
        self.median = float(np.median(d)) if d else 0.0
        return self

    def _key(self, s: JobSpec, key: str) -> str | None:
        return "*" if key == "global" else getattr(s, key)

    def predict(self, specs: Sequence[JobSpec], history: Sequence[JobSpec] = ()) -> Prediction:
        known = {s.job_id: s for s in list(self.pool) + list(history) if s.duration is not None}
        jobs = list(known.values())
        ends = sorted((s.submit_time + s.duration, i) for i, s in enumerate(jobs))  # type: ignore[operator]
        recent: dict[tuple[str, str], deque[float]] = {}
        n = len(specs)
        qs = {q: np.zeros(n) for q in self.quantile_levels}
        point, exp_bin, sec, std = np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n), np.zeros(n)
        p = 0
        for qi in sorted(range(n), key=lambda i: specs[i].submit_time):
            t = specs[qi].submit_time
            while p < len(ends) and ends[p][0] < t:
                s = jobs[ends[p][1]]
                for key in self.keys:
                    v = self._key(s, key)
                    if v is not None:
                        recent.setdefault((key, v), deque(maxlen=self.k)).append(float(s.duration))  # type: ignore[arg-type]
                p += 1
            hist = None
            for key in self.keys:
                v = self._key(specs[qi], key)
                if v is not None and (key, v) in recent:
                    hist = np.fromiter(recent[(key, v)], float)
                    break
            if hist is None:
                hist = np.array([self.median])
            med = float(np.median(hist))
            bins = F.duration_bin(hist).astype(float)
            point[qi] = F.duration_bin(med)
            exp_bin[qi] = bins.mean()
            std[qi] = bins.std()
            sec[qi] = med
            for q in self.quantile_levels:
                qs[q][qi] = float(np.quantile(hist, q))
        return Prediction(point, exp_bin, sec, qs, std)
