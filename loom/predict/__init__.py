"""JCT predictor (paper, App. G): bagged LightGBM over submit-time job metadata.

`JctPredictor` (classify into 10-minute bins, or regress log duration),
`runtime_estimator` (plugs into `SchedulingContext.runtime_estimate`),
`RecentHistoryBaseline` (QSSF-like), `evaluate_trace` (time-ordered split).
"""

from loom.predict.baseline import RecentHistoryBaseline
from loom.predict.features import BIN_SECONDS, MAX_BIN, duration_bin, killed_early
from loom.predict.model import JctPredictor, Prediction, runtime_estimator

__all__ = ["BIN_SECONDS", "MAX_BIN", "JctPredictor", "Prediction", "RecentHistoryBaseline", "duration_bin",
           "killed_early", "runtime_estimator"]
