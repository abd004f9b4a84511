"""Submit-time features for the JCT predictor (no leakage), duration bins, the kill rule.

Bins: `bin = min(duration // 600, MAX_BIN)`; bins 0 … MAX_BIN-1 are 10-minute
intervals, bin MAX_BIN (= 30, i.e. ≥ 5 h) is open-ended (paper, App. G).

Every feature of a job is computable when the job is submitted:

* request fields: GPUs, GPU fraction, CPU, memory, QoS (`preemptible`),
  priority; categoricals VC, user, GPU type(s), job class, model and a
  resource "signature" (GPUs, fraction, CPU, memory, GPU types, QoS);
* hour of day / day of week on the trace clock (traces give seconds since
  their start, so the phase is relative, the periodicity is real);
* history per key (user, VC, user×GPUs, VC×GPUs, signature, global): count,
  mean / median / last of log durations over the key's last `k` jobs that
  **finished strictly before** the job's submit time (end = submit +
  duration, the earliest a job can end); plus submission-side facts that a
  scheduler sees at submit: seconds since the key's previous submission,
  submissions in the last hour, jobs of the key still unfinished.

A job never sees its own duration (its end is after its submit, and its id is
excluded) nor any job that ends after its submit.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from loom.workload.job import FinalStatus, JobSpec

BIN_SECONDS = 600.0
MAX_BIN = 30
N_BINS = MAX_BIN + 1
KILL_EARLY_SECONDS = 600.0  # a cancelled job that ran less than one bin was killed early by its user
HISTORY_K = 10
MIN_CATEGORY_COUNT = 3

CATEGORICALS = ("vc", "user", "gpu_type", "job_class", "model", "signature")
HISTORY_KEYS = ("user", "vc", "user_gpus", "vc_gpus", "signature", "global")
STATIC = ("gpus", "log2_gpus", "gpu_fraction", "cpu_milli", "memory_mib", "cpu_per_gpu", "mem_per_gpu",
          "preemptible", "priority", "hour", "dow")
HIST_STATS = ("n", "mean", "med", "last", "std", "gap", "sub1h", "unfinished")


def duration_bin(seconds: float | np.ndarray) -> Any:
    """10-minute bin of a duration, capped at MAX_BIN (open-ended last bin)."""
    if isinstance(seconds, np.ndarray):
        return np.minimum(np.floor(np.maximum(seconds, 0.0) / BIN_SECONDS), MAX_BIN).astype(np.int64)
    return int(min(math.floor(max(seconds, 0.0) / BIN_SECONDS), MAX_BIN))


def killed_early(spec: JobSpec) -> bool:
    """The training filter: cancelled by the user before running one bin (600 s).

    Traces without a status (Philly-VC, most Alibaba pods) have none removed;
    `failed` jobs are kept (they end by themselves, a scheduler must expect them).
    """
    return (spec.final_status == FinalStatus.CANCELLED and spec.duration is not None
            and spec.duration < KILL_EARLY_SECONDS)


def training_jobs(specs: Iterable[JobSpec]) -> list[JobSpec]:
    """Jobs with a duration, minus the ones killed early (see `killed_early`)."""
    return [s for s in specs if s.duration is not None and not killed_early(s)]


def _gpu_type(s: JobSpec) -> str | None:
    if s.gpu_types:
        return "|".join(sorted(s.gpu_types))
    return s.gpu_type


def _signature(s: JobSpec) -> str:
    return f"{s.gpus}/{s.gpu_fraction}/{s.cpu_milli}/{s.memory_mib}/{_gpu_type(s)}/{int(s.preemptible)}"


def _cat_value(s: JobSpec, name: str) -> str | None:
    if name == "vc":
        return s.vc
    if name == "user":
        return s.user
    if name == "gpu_type":
        return _gpu_type(s)
    if name == "job_class":
        return s.job_class.value
    if name == "model":
        return s.model
    return _signature(s)


def _key_value(s: JobSpec, key: str) -> str | None:
    if key == "global":
        return "*"
    if key == "user":
        return s.user
    if key == "vc":
        return s.vc
    if key == "user_gpus":
        return None if s.user is None else f"{s.user}/{s.gpus}"
    if key == "vc_gpus":
        return None if s.vc is None else f"{s.vc}/{s.gpus}"
    return _signature(s)


def feature_names() -> list[str]:
    names = list(STATIC) + [f"cat_{c}" for c in CATEGORICALS]
    names += [f"h_{k}_{st}" for k in HISTORY_KEYS for st in HIST_STATS]
    return names


def categorical_indices() -> list[int]:
    return [len(STATIC) + i for i in range(len(CATEGORICALS))]


def build_vocab(specs: Sequence[JobSpec]) -> dict[str, list[str]]:
    """Category levels seen at least MIN_CATEGORY_COUNT times in training (sorted: deterministic)."""
    vocab: dict[str, list[str]] = {}
    for name in CATEGORICALS:
        counts: dict[str, int] = defaultdict(int)
        for s in specs:
            v = _cat_value(s, name)
            if v is not None:
                counts[v] += 1
        vocab[name] = sorted(v for v, n in counts.items() if n >= MIN_CATEGORY_COUNT)
    return vocab


def _static_row(s: JobSpec) -> list[float]:
    nan = math.nan
    cpu = float(s.cpu_milli) if s.cpu_milli is not None else nan
    mem = float(s.memory_mib) if s.memory_mib is not None else nan
    share = s.gpus * (s.gpu_fraction if s.gpu_fraction is not None else 1.0)
    t = s.submit_time
    return [float(s.gpus), math.log2(s.gpus), s.gpu_fraction if s.gpu_fraction is not None else nan,
            cpu, mem, cpu / share, mem / share, float(s.preemptible), float(s.priority),
            (t % 86400.0) / 3600.0, float(int(t // 86400.0) % 7)]


class _KeyHistory:
    __slots__ = ("count", "recent")

    def __init__(self, k: int) -> None:
        self.recent: deque[float] = deque(maxlen=k)
        self.count = 0


def history_stats(queries: Sequence[JobSpec], pool: Sequence[JobSpec], k: int = HISTORY_K) -> np.ndarray:
    """(len(queries), len(HISTORY_KEYS) * len(HIST_STATS)) history features.

    `pool` holds the jobs whose outcomes may be known (those with a duration);
    for a query submitted at t only pool jobs ending strictly before t count as
    finished, and only pool jobs submitted strictly before t as submitted.
    """
    known = {}
    for s in pool:
        if s.duration is not None:
            known[s.job_id] = s
    jobs = list(known.values())
    ends = sorted(((s.submit_time + s.duration, i) for i, s in enumerate(jobs)))  # type: ignore[operator]
    keyvals = [[_key_value(s, key) for key in HISTORY_KEYS] for s in jobs]
    subs: dict[tuple[int, str], list[float]] = defaultdict(list)
    for s, kv in zip(jobs, keyvals):
        for ki, v in enumerate(kv):
            if v is not None:
                subs[(ki, v)].append(s.submit_time)
    for lst in subs.values():
        lst.sort()
    state: dict[tuple[int, str], _KeyHistory] = {}
    n_stats = len(HIST_STATS)
    out = np.full((len(queries), len(HISTORY_KEYS) * n_stats), np.nan)
    order = sorted(range(len(queries)), key=lambda i: queries[i].submit_time)
    p = 0
    for qi in order:
        q = queries[qi]
        t = q.submit_time
        while p < len(ends) and ends[p][0] < t:
            i = ends[p][1]
            logd = math.log1p(jobs[i].duration)  # type: ignore[arg-type]
            for ki, v in enumerate(keyvals[i]):
                if v is not None:
                    h = state.get((ki, v))
                    if h is None:
                        h = state[(ki, v)] = _KeyHistory(k)
                    h.recent.append(logd)
                    h.count += 1
            p += 1
        for ki, key in enumerate(HISTORY_KEYS):
            v = _key_value(q, key)
            if v is None:
                continue
            base = ki * n_stats
            h = state.get((ki, v))
            finished = 0
            if h is not None and h.count:
                arr = sorted(h.recent)
                m = len(arr)
                mean = sum(arr) / m
                med = arr[m // 2] if m % 2 else 0.5 * (arr[m // 2 - 1] + arr[m // 2])
                std = math.sqrt(max(sum(a * a for a in arr) / m - mean * mean, 0.0))
                out[qi, base:base + 5] = (math.log1p(h.count), mean, med, h.recent[-1], std)
                finished = h.count
            else:
                out[qi, base] = 0.0
            times = subs.get((ki, v))
            if times:
                j = bisect.bisect_left(times, t)  # submitted strictly before t
                # the query itself may be in the pool: it is never before itself
                if j:
                    out[qi, base + 5] = math.log1p(t - times[j - 1])
                out[qi, base + 6] = j - bisect.bisect_left(times, t - 3600.0)
                out[qi, base + 7] = max(0, j - finished)
            else:
                out[qi, base + 6] = 0.0
                out[qi, base + 7] = 0.0
    return out


def feature_matrix(queries: Sequence[JobSpec], pool: Sequence[JobSpec], vocab: dict[str, list[str]],
                   k: int = HISTORY_K) -> np.ndarray:
    """Float matrix (NaN = missing) in `feature_names()` order; categoricals as vocab codes."""
    index = {name: {v: i for i, v in enumerate(levels)} for name, levels in vocab.items()}
    static = np.array([_static_row(s) for s in queries], dtype=float).reshape(len(queries), len(STATIC))
    cats = np.full((len(queries), len(CATEGORICALS)), np.nan)
    for ci, name in enumerate(CATEGORICALS):
        idx = index.get(name, {})
        for qi, s in enumerate(queries):
            v = _cat_value(s, name)
            if v is not None and v in idx:
                cats[qi, ci] = idx[v]
    hist = history_stats(queries, pool, k)
    return np.hstack([static, cats, hist])
