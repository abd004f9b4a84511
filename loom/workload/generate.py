"""Synthetic LLM-cluster workloads calibrated to Acme (Kalos / Seren): `loom workload generate`.

`generate(profile, days, seed)` returns `JobSpec`s; `write_csv` writes them in the
generic CSV format (`csv:FILE`, docs/TRACES.md) so `loom simulate --trace csv:FILE`
replays them; `validate(specs, profile)` lists generated vs published statistics.

The model (parameters and targets with provenance: `loom/workload/data/profiles.yaml`):

* **Arrivals** — a non-homogeneous Poisson process, piecewise constant per hour:
  rate = jobs/day × scale / 24 × hour-of-day factor × weekday factor (factors from
  the Helios Venus submission series, mean 1; day 0 is a Monday).
* **Classes** — pretrain / sft / eval / debug drawn with the profile's job shares.
* **GPUs** — a discrete distribution per class (eval ≤ 4 GPUs, pretraining 128–1024).
* **Durations** — the *would-be* run time is log-normal per class (capped at the
  published maximum). A job fails or is cancelled with the class's probabilities;
  then it runs only a Beta-distributed fraction of its would-be time (failures
  mostly early); `final_status` is set accordingly. With `outcomes="would-be"` every
  job keeps its would-be run time and is COMPLETED, so that failures can come from
  `loom.workload.job_failures` instead (the draws are the same; only those two columns
  change, and evaluation batches still follow the recorded pretraining run times so
  that submit times, GPUs and every other column are identical to "recorded").
* **Evaluation batches** — every `interval_s` of each pretraining job's run (the
  job is assumed to start on submission) a batch of 10–50 evaluation jobs may be
  submitted for that checkpoint (same user, VC and model); each batch job replaces
  one Poisson evaluation job so the class shares keep their targets.
* **Users / VCs** — a VC per job from per-class VC weights; users within a VC are
  Zipf-distributed. Pretraining jobs get a `loom.perf` model preset by size, are not
  preemptible, have the highest priority and are announced 4 h ahead.

Everything is drawn from one `numpy.random.default_rng(seed)` in a fixed order, so a
seed gives the same trace; sampling is vectorised (30 days of Seren ≈ 110k jobs in
about a second).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from loom.errors import LoomInputError
from loom.workload.job import FinalStatus, JobClass, JobSpec
from loom.workload.profiles import ClassModel, Profile, get_profile

DAY = 86400.0
_STATUS = (FinalStatus.COMPLETED, FinalStatus.FAILED, FinalStatus.CANCELLED)
SIZE_BUCKETS = [(1, 1, "1"), (2, 4, "2-4"), (5, 8, "5-8"), (9, 32, "9-32"), (33, 128, "33-128"),
                (129, 512, "129-512"), (513, 10**9, ">512")]


def _check_args(days: float, scale: float) -> None:
    if not (isinstance(days, (int, float)) and math.isfinite(days) and days > 0):
        raise LoomInputError(f"days must be > 0, got {days}", field="days")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise LoomInputError(f"scale must be > 0, got {scale}", field="scale")


def _arrivals(rng: np.random.Generator, prof: Profile, days: float, scale: float) -> np.ndarray:
    horizon = days * DAY
    n_hours = math.ceil(days * 24)
    start = np.arange(n_hours) * 3600.0
    width = np.minimum(3600.0, horizon - start)
    hour = np.arange(n_hours)
    rate = prof.jobs_per_day * scale / DAY * prof.hour_of_day[hour % 24] * prof.weekday[(hour // 24) % 7]
    counts = rng.poisson(rate * width)
    t = np.repeat(start, counts) + rng.random(int(counts.sum())) * np.repeat(width, counts)
    return np.sort(t)


def _sample(rng: np.random.Generator, cm: ClassModel, n: int, max_run: float) -> dict[str, np.ndarray]:
    """GPUs, would-be and actual durations, status codes (0 ok, 1 failed, 2 cancelled), preemptible.

    `would` is kept next to `duration` so `generate(outcomes="would-be")` can use it without
    changing a single draw (the Beta fractions are still drawn, then ignored).
    """
    gpus = rng.choice(cm.gpu_sizes, size=n, p=cm.gpu_probs)
    would = np.minimum(np.exp(np.log(cm.median_s) + cm.sigma * rng.standard_normal(n)), max_run)
    u = rng.random(n)
    status = np.where(u < cm.p_failed, 1, np.where(u < cm.p_failed + cm.p_cancelled, 2, 0))
    frac = np.ones(n)
    for code, (a, b) in ((1, cm.failed_frac), (2, cm.cancelled_frac)):
        mask = status == code
        frac[mask] = rng.beta(a, b, int(mask.sum()))
    duration = np.maximum(1.0, np.round(would * frac, 3))
    return {"gpus": gpus, "duration": duration, "status": status, "would": np.maximum(1.0, np.round(would, 3)),
            "preemptible": rng.random(n) < cm.preemptible}


def _users(rng: np.random.Generator, prof: Profile, cls_name: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    vc = rng.choice(len(prof.vc_names), size=n, p=prof.vc_weights[cls_name])
    zipf = 1.0 / np.arange(1, prof.users_per_vc + 1) ** prof.zipf_s
    user = rng.choice(prof.users_per_vc, size=n, p=zipf / zipf.sum())
    return vc, user


def _model_for(prof: Profile, rng: np.random.Generator, gpus: np.ndarray) -> list[str | None]:
    keys = sorted(prof.models_by_gpus)
    if not keys:
        return [None] * len(gpus)
    pick = rng.random(len(gpus))
    out: list[str | None] = []
    for g, p in zip(gpus.tolist(), pick.tolist()):
        below = [k for k in keys if k <= g]
        names = prof.models_by_gpus[below[-1] if below else keys[0]]
        out.append(names[int(p * len(names))])
    return out


OUTCOMES = ("recorded", "would-be")


def generate(profile: str | Profile, days: float, seed: int = 0, scale: float = 1.0,
             outcomes: str = "recorded") -> list[JobSpec]:
    """A synthetic trace of `days` days for `profile` (e.g. "acme-kalos"), sorted by submit time.

    `scale` multiplies the arrival rate (job count per day); per-job distributions are unchanged.
    `outcomes`: "recorded" (default) gives failed / cancelled jobs their shortened run time and
    status, as a scheduler log would; "would-be" gives every job its would-be run time and
    status COMPLETED — the input for injected failures (`loom.workload.job_failures`), which
    would otherwise be counted twice. Both use the same random draws in the same order.
    """
    prof = get_profile(profile) if isinstance(profile, str) else profile
    _check_args(days, scale)
    if outcomes not in OUTCOMES:
        raise LoomInputError(f"outcomes must be one of {', '.join(OUTCOMES)}, got {outcomes!r}",
                             field="outcomes")
    rng = np.random.default_rng(seed)
    horizon = days * DAY
    max_run = prof.max_run_s

    times = _arrivals(rng, prof, days, scale)
    shares = np.array([c.job_share for c in prof.classes])
    cls_idx = rng.choice(len(prof.classes), size=len(times), p=shares / shares.sum())

    # column accumulators (one block per class, then the evaluation batches)
    cols: dict[str, list[Any]] = {k: [] for k in ("submit", "gpus", "duration", "would", "status", "preemptible",
                                                   "cls",
                                                   "vc", "user", "model", "announce", "priority")}

    def add(submit: np.ndarray, cm: ClassModel, s: dict[str, np.ndarray], vc: np.ndarray, user: np.ndarray,
            model: list[str | None], announce: np.ndarray | None) -> None:
        n = len(submit)
        cols["submit"].append(submit)
        for k in ("gpus", "duration", "would", "status", "preemptible"):
            cols[k].append(s[k])
        cols["cls"].append(np.full(n, prof.classes.index(cm)))
        cols["vc"].append(vc)
        cols["user"].append(user)
        cols["model"].extend(model)
        cols["announce"].append(np.full(n, np.nan) if announce is None else announce)
        cols["priority"].append(np.full(n, cm.priority))

    eval_cm = prof.cls(JobClass.EVAL)
    eval_keep: np.ndarray | None = None
    pre_block: tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray, list[str | None]] | None = None
    for k, cm in enumerate(prof.classes):
        submit = times[cls_idx == k]
        s = _sample(rng, cm, len(submit), max_run)
        vc, user = _users(rng, prof, cm.job_class.value, len(submit))
        announce = None
        model: list[str | None] = [None] * len(submit)
        if cm.job_class == JobClass.PRETRAIN:
            model = _model_for(prof, rng, s["gpus"])
            if prof.pretrain_announce_s is not None:
                announce = np.maximum(0.0, submit - float(prof.pretrain_announce_s))
            pre_block = (submit, s, vc, user, model)
        if cm is eval_cm:
            eval_keep = np.ones(len(submit), dtype=bool)
            cols_eval_pos = len(cols["submit"])
        add(submit, cm, s, vc, user, model, announce)

    # evaluation batches at pretraining checkpoints
    eb = prof.eval_batches
    if eval_cm is not None and eval_keep is not None and pre_block is not None and eb and len(pre_block[0]):
        submit, s, vc, user, model = pre_block
        interval = float(eb.get("interval_s", 7200))
        n_ckpt = np.floor(s["duration"] / interval).astype(np.int64)
        owner = np.repeat(np.arange(len(submit)), n_ckpt)
        k = np.arange(len(owner)) - np.repeat(np.cumsum(n_ckpt) - n_ckpt, n_ckpt) + 1
        at = submit[owner] + k * interval
        keep = (rng.random(len(owner)) < float(eb.get("probability", 1.0))) & (at < horizon)
        owner, at = owner[keep], at[keep]
        lo, hi = eb.get("size", (10, 50))
        sizes = rng.integers(int(lo), int(hi) + 1, size=len(owner))
        cap = int(float(eb.get("max_fraction", 0.5)) * len(eval_keep))
        order = rng.permutation(len(owner))
        chosen = order[np.cumsum(sizes[order]) <= cap]
        chosen.sort()
        owner, at, sizes = owner[chosen], at[chosen], sizes[chosen]
        n_batch = int(sizes.sum())
        if n_batch:
            b_owner = np.repeat(owner, sizes)
            b_submit = np.repeat(at, sizes) + rng.random(n_batch) * float(eb.get("jitter_s", 0.0))
            inside = b_submit < horizon
            b_owner, b_submit = b_owner[inside], b_submit[inside]
            n_batch = len(b_submit)
            drop = rng.choice(len(eval_keep), size=min(n_batch, len(eval_keep)), replace=False)
            eval_keep[drop] = False
            bs = _sample(rng, eval_cm, n_batch, max_run)
            add(b_submit, eval_cm, bs, vc[b_owner], user[b_owner], [model[i] for i in b_owner.tolist()], None)

    submit = np.concatenate(cols["submit"])
    keep = np.ones(len(submit), dtype=bool)
    if eval_keep is not None:
        start = sum(len(a) for a in cols["submit"][:cols_eval_pos])
        keep[start:start + len(eval_keep)] = eval_keep
    arr = {k: np.concatenate(v)[keep] for k, v in cols.items() if k != "model"}
    models = [m for m, ok in zip(cols["model"], keep.tolist()) if ok]
    submit = np.round(arr["submit"], 3)
    order = np.argsort(submit, kind="stable")
    announce = np.round(arr["announce"], 3)
    if outcomes == "would-be":  # after every draw: evaluation batches above used the recorded run times
        arr["duration"] = arr["would"]
        arr["status"] = np.zeros_like(arr["status"])

    classes = [c.job_class for c in prof.classes]
    vc_names = prof.vc_names
    user_names = [[f"{v}-u{i:02d}" for i in range(prof.users_per_vc)] for v in vc_names]
    specs: list[JobSpec] = []
    cols_sorted = [a[order].tolist() for a in (submit, arr["gpus"], arr["duration"], arr["status"],
                                               arr["preemptible"], arr["cls"], arr["vc"], arr["user"],
                                               announce, arr["priority"])]
    model_sorted = [models[i] for i in order.tolist()]
    width = max(6, len(str(len(order))))
    for i, (t, g, d, st, pre, c, v, u, ann, pri) in enumerate(zip(*cols_sorted)):
        specs.append(JobSpec(
            job_id=f"{prof.job_prefix}-{i:0{width}d}", submit_time=t, gpus=int(g), duration=d,
            gpu_type=prof.gpu_type, job_class=classes[c], user=user_names[v][u], vc=vc_names[v],
            final_status=_STATUS[st], model=model_sorted[i], preemptible=bool(pre), priority=int(pri),
            announce_time=None if math.isnan(ann) else ann))
    return specs


def write_csv(specs: list[JobSpec], path: str | Path) -> Path:
    """Write jobs in the generic CSV format (read back by `load_trace("csv:PATH")`)."""
    import polars as pl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pl.DataFrame({
        "job_id": [j.job_id for j in specs],
        "submit_time": pl.Series([j.submit_time for j in specs], dtype=pl.Float64),
        "gpus": pl.Series([j.gpus for j in specs], dtype=pl.Int64),
        "duration": pl.Series([j.duration for j in specs], dtype=pl.Float64),
        "gpu_type": pl.Series([j.gpu_type for j in specs], dtype=pl.Utf8),
        "job_class": [j.job_class.value for j in specs],
        "user": pl.Series([j.user for j in specs], dtype=pl.Utf8),
        "vc": pl.Series([j.vc for j in specs], dtype=pl.Utf8),
        "final_status": [j.final_status.value for j in specs],
        "model": pl.Series([j.model for j in specs], dtype=pl.Utf8),
        "preemptible": pl.Series(["true" if j.preemptible else "false" for j in specs], dtype=pl.Utf8),
        "priority": pl.Series([j.priority for j in specs], dtype=pl.Int64),
        "announce_time": pl.Series([j.announce_time for j in specs], dtype=pl.Float64),
    })
    frame.write_csv(path)
    return path


# ----------------------------------------------------------------------------------------------- validation

def _row(metric: str, generated: float, published: float | None = None, relation: str = "≈",
         source: str = "", kind: str = "num") -> dict[str, Any]:
    return {"metric": metric, "generated": float(generated), "published": published,
            "relation": relation if published is not None else None, "source": source, "kind": kind}


def validate(specs: list[JobSpec], profile: str | Profile, days: float | None = None) -> list[dict[str, Any]]:
    """Generated vs published statistics, one dict per metric.

    Each row: `metric`, `generated`, `published` (None when nothing is published),
    `relation` ("≈" a target, "<" / ">" a published bound), `source` ([CS] cluster_summary.csv,
    [NSDI] the Acme paper, [VEN] Venus arrivals) and `kind` ("share", "seconds", "num").
    """
    prof = get_profile(profile) if isinstance(profile, str) else profile
    pub = prof.published
    if not specs:
        raise LoomInputError("no jobs to validate", field="trace")
    submit = np.array([j.submit_time for j in specs])
    gpus = np.array([j.gpus for j in specs], dtype=float)
    dur = np.array([j.duration if j.duration is not None else np.nan for j in specs])
    cls = np.array([j.job_class.value for j in specs])
    status = np.array([j.final_status.value for j in specs])
    gt = np.nan_to_num(gpus * dur)
    total_gt = gt.sum() or 1.0
    n = len(specs)
    if days is None:
        days = max(1.0, math.ceil((submit.max() - min(0.0, submit.min())) / DAY))
    rows = [_row("GPU jobs per day", n / days, prof.jobs_per_day, source="[CS] gpu_job_num / 183 d")]
    class_names = [c.job_class.value for c in prof.classes]
    for c in class_names:
        rows.append(_row(f"job share: {c}", (cls == c).mean(), pub.get("class_job_share", {}).get(c),
                         source="[NSDI]" if c in pub.get("class_job_share", {}) else "", kind="share"))
    for c in class_names:
        rows.append(_row(f"GPU-time share: {c}", gt[cls == c].sum() / total_gt,
                         pub.get("class_gpu_time_share", {}).get(c),
                         source="[NSDI]" if c in pub.get("class_gpu_time_share", {}) else "", kind="share"))
    rows += [
        _row("median run time (s)", np.nanmedian(dur), pub.get("median_run_s"), source="[CS]", kind="seconds"),
        _row("mean run time (s)", np.nanmean(dur), pub.get("mean_run_s"), source="[CS]", kind="seconds"),
        _row("max run time (s)", np.nanmax(dur), pub.get("max_run_s"), "<", source="[CS]", kind="seconds"),
        _row("median GPUs", np.median(gpus), pub.get("median_gpus"), source="[CS]"),
        _row("mean GPUs", gpus.mean(), pub.get("mean_gpus"), source="[CS]"),
        _row("max GPUs", gpus.max(), pub.get("max_gpus"), "<", source="[CS]"),
    ]
    for st in ("completed", "cancelled", "failed"):
        rows.append(_row(f"fraction {st}", (status == st).mean(), pub.get("status_share", {}).get(st),
                         source="[CS]", kind="share"))
    for st in ("completed", "cancelled", "failed"):
        rows.append(_row(f"GPU-time share: {st}", gt[status == st].sum() / total_gt,
                         pub.get("status_gpu_time_share", {}).get(st), source="[CS]", kind="share"))
    rows.append(_row("jobs with > 8 GPUs", (gpus > 8).mean(), pub.get("jobs_over_8_gpus_max"), "<",
                     source="[NSDI]", kind="share"))
    rows.append(_row("GPU-time share of jobs ≥ 256 GPUs", gt[gpus >= 256].sum() / total_gt,
                     pub.get("gpu_time_share_256plus_min"), ">", source="[NSDI]", kind="share"))
    evals = cls == JobClass.EVAL.value
    if evals.any():
        rows.append(_row("eval jobs with ≤ 4 GPUs", (gpus[evals] <= 4).mean(), 1.0, source="[NSDI]",
                         kind="share"))
    pre = cls == JobClass.PRETRAIN.value
    if pre.any():
        rows.append(_row("pretraining jobs > 1 day", (dur[pre] > DAY).mean(), 0.05, "<", source="[NSDI]",
                         kind="share"))
    hourly = np.bincount(((submit % DAY) // 3600).astype(int), minlength=24)[:24]
    corr = float(np.corrcoef(hourly, prof.hour_of_day)[0, 1]) if hourly.std() > 0 else 0.0
    rows.append(_row("hour-of-day correlation with Venus", corr, 1.0, source="[VEN]"))
    for lo, hi, label in SIZE_BUCKETS:
        rows.append(_row(f"GPU-size histogram: {label}", ((gpus >= lo) & (gpus <= hi)).mean(), kind="share"))
    return rows


def format_value(value: float | None, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "share":
        return f"{value:.1%}"
    if kind == "seconds":
        return f"{value:,.0f}"
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
