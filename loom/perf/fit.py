"""Fit the estimator's efficiency parameters to published measurements.

Two numbers are fitted on Megatron-LM Table 1 (Narayanan et al. SC'21) — the
achievable fraction of tensor peak for large GEMMs and the fraction of nominal
link bandwidth collectives reach — and one GEMM fraction per (GPU generation,
precision) on the `core` rows of h100_era.csv (`fit_era`, below: Hopper BF16
and FP8; A100 keeps Table 1's, so its rows there are out of sample).

On Table 1, each row's micro-batch and interleaving are not published, so each
is searched (as Megatron's authors tuned them); recomputation is full, attention
unfused and sequence parallelism off, as in that paper. The table's TFLOP/s
count recomputation with the paper's formula, so predictions are converted with
the same formula. On h100_era.csv every row states its plan and the error is in
tokens/s/GPU (its README's caveat 1: TFLOP/s conventions differ by source).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import minimize, minimize_scalar

from loom.errors import LoomInputError
from loom.hardware.gpus import gpu_spec
from loom.perf.calibration import Calibration
from loom.perf.estimator import Estimator
from loom.perf.flops import megatron_flops
from loom.perf.h100_era import EraRun
from loom.perf.inputs import Hardware, TrainingJob
from loom.perf.model import ModelSpec
from loom.perf.search import Choices, search_plans

TABLE_COLUMNS = (
    "params_b", "heads", "hidden", "layers", "tp", "pp", "gpus", "dp",
    "global_batch", "seq_len", "vocab", "gpu_type", "tflops_per_gpu",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """One published training run: model, plan and achieved TFLOP/s per GPU."""

    label: str
    job: TrainingJob
    gpu_type: str
    gpus: int
    tp: int
    pp: int
    dp: int
    tflops_per_gpu: float


def load_megatron_table(path: str | Path) -> list[MeasuredRun]:
    """Rows of megatron_lm_table1.csv (errors name the file, line and column)."""
    source = str(path)
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in TABLE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise LoomInputError("missing column", source=source, line=1, field=missing[0])
            return [_run(row, source, line) for line, row in enumerate(reader, start=2)]
    except OSError as exc:
        raise LoomInputError(f"cannot read: {exc.strerror}", source=source) from exc


def _run(row: dict[str, str], source: str, line: int) -> MeasuredRun:
    values: dict[str, float] = {}
    for column in TABLE_COLUMNS:
        if column == "gpu_type":
            continue
        try:
            values[column] = float(row[column])
        except (TypeError, ValueError):
            raise LoomInputError(f"not a number: {row[column]!r}", source=source, line=line, field=column) from None
    ints = {k: int(v) for k, v in values.items() if k not in ("params_b", "tflops_per_gpu")}
    try:
        model = ModelSpec(
            name=f"megatron-{row['params_b']}b", layers=ints["layers"], hidden=ints["hidden"],
            heads=ints["heads"], seq_len=ints["seq_len"], vocab=ints["vocab"],
        )  # fmt: skip
        # 2021 runs: before sequence parallelism (Korthikanti et al. 2022) and FlashAttention
        job = TrainingJob(model, ints["global_batch"], precision="fp16", flash_attention=False, overlap_dp=False,
                          sequence_parallel=False)
        Hardware(row["gpu_type"])
    except LoomInputError as exc:
        raise LoomInputError(exc.message, source=source, line=line, field=exc.field) from None
    return MeasuredRun(
        label=f"{row['params_b']}B", job=job, gpu_type=row["gpu_type"], gpus=ints["gpus"],
        tp=ints["tp"], pp=ints["pp"], dp=ints["dp"], tflops_per_gpu=values["tflops_per_gpu"],
    )  # fmt: skip


def predict(run: MeasuredRun, calibration: Calibration) -> float:
    """Predicted TFLOP/s per GPU in the table's convention (recomputation counted)."""
    choices = Choices(tp=run.tp, pp=run.pp, dp=run.dp, zero=0, recompute="full")
    result = search_plans(
        run.job, Hardware(run.gpu_type), run.gpus, choices=choices, top=1, estimator=Estimator(calibration)
    )
    if result.best is None:
        raise LoomInputError(f"no feasible plan for the {run.label} row: {result.reason}")
    m = run.job.model
    flops = megatron_flops(run.job.global_batch, m.seq_len, m.layers, m.hidden, m.vocab)
    return flops / result.best.iteration_s / run.gpus / 1e12


def mape(runs: list[MeasuredRun], calibration: Calibration) -> float:
    errors = [abs(predict(r, calibration) - r.tflops_per_gpu) / r.tflops_per_gpu for r in runs]
    return float(np.mean(errors))


def fit(runs: list[MeasuredRun], base: Calibration) -> Calibration:
    """Minimise MAPE over (gemm_efficiency, link_efficiency): coarse grid, then Nelder-Mead."""
    grid = [(g, link) for g in np.linspace(0.5, 0.9, 9) for link in np.linspace(0.5, 1.0, 6)]
    start = min(grid, key=lambda p: mape(runs, base.with_fit(*p)))

    def loss(x: np.ndarray) -> float:
        g, link = float(x[0]), float(x[1])
        if not (0.05 < g <= 1.0 and 0.05 < link <= 1.0):
            return 1e9
        return mape(runs, base.with_fit(g, link))

    result = minimize(loss, np.array(start), method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-5, "maxiter": 80})
    return base.with_fit(round(float(result.x[0]), 4), round(float(result.x[1]), 4))


def leave_one_out(runs: list[MeasuredRun], base: Calibration) -> list[tuple[MeasuredRun, float, Calibration]]:
    """Refit without each row and predict it: (run, predicted TFLOP/s, calibration used)."""
    out = []
    for i, run in enumerate(runs):
        calibration = fit(runs[:i] + runs[i + 1 :], base)
        out.append((run, predict(run, calibration), calibration))
    return out


# -- H100-era measurements (../shared/calibration/h100_era.csv) -------------------------------
# One GEMM fraction per (GPU generation, precision) is fitted on the generation's `core` rows;
# every other constant stays as calibrated above (Ampere keeps the Table 1 fit, so A100 rows
# are predicted out of sample).
FITTED_GENERATIONS = ("hopper",)
_FRACTIONS = np.round(np.arange(0.30, 0.951, 0.01), 2)


def era_group(run: EraRun) -> tuple[str, str] | None:
    """The (generation, precision) whose GEMM fraction the run fits, or None (not fitted)."""
    architecture = gpu_spec(run.gpu_type).architecture
    if architecture not in FITTED_GENERATIONS:
        return None
    return architecture, "bf16" if run.job.precision == "fp16" else run.job.precision


def predict_era(run: EraRun, calibration: Calibration) -> float:
    """Predicted tokens/s per GPU for the run's own plan (no search: the row states it)."""
    estimate = Estimator(calibration).estimate_uncached(run.job, run.hardware, run.plan)
    return estimate.tokens_per_s / run.gpus


def era_error(run: EraRun, calibration: Calibration) -> float:
    """Signed relative error of the prediction in tokens/s/GPU."""
    return predict_era(run, calibration) / run.tokens_per_s_per_gpu - 1.0


def fit_era(runs: list[EraRun], base: Calibration) -> Calibration:
    """Each fitted group's GEMM fraction minimising its rows' MAPE: a 0.01 grid over
    0.30–0.95, refined by a bounded scalar search around the best point."""
    calibration = base
    groups: dict[tuple[str, str], list[EraRun]] = {}
    for run in runs:
        if (group := era_group(run)) is not None:
            groups.setdefault(group, []).append(run)
    for (architecture, precision), members in sorted(groups.items()):
        def loss(fraction: float, a: str = architecture, p: str = precision, rows: list[EraRun] = members) -> float:
            cal = base.with_generation(a, p, float(fraction))
            return float(np.mean([abs(era_error(r, cal)) for r in rows]))

        best = min(_FRACTIONS, key=loss)
        refined = minimize_scalar(loss, bounds=(best - 0.01, best + 0.01), method="bounded", options={"xatol": 1e-4})
        fraction = float(refined.x) if refined.fun < loss(best) else float(best)
        calibration = calibration.with_generation(architecture, precision, round(fraction, 4))
    return calibration


def era_leave_one_out(runs: list[EraRun], base: Calibration) -> list[tuple[EraRun, float]]:
    """Refit without each run and predict it: (run, predicted tokens/s/GPU). Runs of a
    generation that is not fitted are predicted with `base` (they are out of sample)."""
    out = []
    for i, run in enumerate(runs):
        if era_group(run) is None:
            out.append((run, predict_era(run, base)))
            continue
        others = [r for j, r in enumerate(runs) if j != i and era_group(r) == era_group(run)]
        out.append((run, predict_era(run, fit_era(others, base))))
    return out
