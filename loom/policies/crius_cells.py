"""Crius's per-job Cells for one cluster: which (GPU type, count) options a job
has, what each is worth, and how long profiling them takes.

Counts are N/2, N, 2N (Crius §4; N = requested GPUs), extended to 4N, 8N, …
up to `max_scale`·N when asked. An option is worth its best Cell's throughput
divided by the job's throughput *as requested* (best Cell on its requested type
and N GPUs; the best N-GPU Cell of any type when it asked for no type or that
does not fit in memory): 1.0 = as requested. A job without a `loom.perf` preset
has one option per allowed type, N GPUs, worth 1.0.

Plans (cell-guided tuning, Crius §5.2): the value of an option ranks with the
Cell estimate (one cheap grid sample per Cell); the plan a job *runs* on the
(type, count) it gets is tuned for exactly those GPUs when the decision is
made: the Cells of that count (stage counts 1, 2, 4, …) are estimated for the
job as the speed model runs it there (its batch rule at that count), the
`tune_cells` (8: every stage count up to 128 GPUs) best-ranked — Cells with no
fitting sample last — are tuned inside (`loom.perf.cells.tune_cell`: each
stage's preferred half, the whole Cell when its sample did not fit; the sample
at micro-batch 1 misranks Cells whose best plan needs larger micro-batches, so
one Cell is not enough), and the fastest tuned plan expressible as one uniform
`ParallelPlan` (re-priced as the estimator prices that plan) wins; the Cell's
sampled plan is the fallback. Tuned plans are kept per (model, batch, type,
count), so each shape is tuned once per run.

Profiling delay: Crius profiles every Cell's stages on single devices, GPU
types in parallel, so a job is ready ``max over types (that type's Cells ×
profiling_s_per_cell)`` after it arrives. With `reuse_profiles` Crius
accumulates profiling data (Crius §5.1: computation is profiled at run time
and kept, communication offline): a Cell — (model, batch, type, count,
stages) — profiled for an earlier job is not profiled again, and one being
profiled is waited for; a type's device profiles only the job's new Cells, in
turn. A job without a preset is profiled once per allowed type, never reused.
Each device profiles the Cells of N GPUs first, then the largest counts down
to 2N, then N/2 (`_profile_order`): a job may be admitted after
`admit_delay_s` (its N-GPU Cells known); any (type, count) option becomes
usable as soon as its Cells are profiled (`ready_at`), all after `delay_s`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from loom.core.jobs import Job
from loom.core.plan import ParallelPlan
from loom.hardware.topology import Topology
from loom.perf.cells import CellEstimate, build_cells, tune_cell
from loom.perf.estimator import Estimate, Estimator
from loom.perf.inputs import (
    Hardware,
    PlanError,
    TrainingJob,
    estimator_job,
    trace_batch,
)
from loom.perf.presets import preset_names
from loom.policies.throughput import Throughputs


@dataclass(frozen=True, slots=True)
class Option:
    """A job on `gpus` GPUs of `gpu_type` with the best Cell's plan there."""

    gpu_type: str
    gpus: int
    value: float  # throughput relative to the job as requested
    stages: int
    plan: ParallelPlan | None


@dataclass(frozen=True, slots=True)
class TunedPlan:
    """The plan a job runs on one (type, count), and how it was found (for decision reasons)."""

    plan: ParallelPlan | None
    iteration_s: float  # as the estimator prices `plan` packed (inf: nothing fits)
    sampled_s: float  # the best Cell's grid-sampled plan, same pricing (inf: none)
    cells_tuned: int

    def describe(self) -> str:
        if self.plan is None:
            return "no tuned plan fits (the speed model's choice)"
        gain = f", {self.sampled_s / self.iteration_s:.2f}× its Cell's sampled plan" if self.sampled_s < float("inf") else ""
        return f"runs {self.plan.describe()} (tuned in {self.cells_tuned} Cell(s){gain})"


@dataclass(slots=True)
class JobCells:
    options: dict[tuple[str, int], Option]
    delay_s: float  # every Cell profiled: growth may use them all
    requested: int
    admit_delay_s: float = 0.0  # the Cells of N GPUs profiled: admission may start the job
    ready_at: dict[tuple[str, int], float] = field(default_factory=dict)  # option → its Cells profiled (s)


def cell_counts(n: int, max_scale: int) -> list[int]:
    """N/2 (when N is even), N, 2N, 4N, … ≤ max_scale·N."""
    counts = [n // 2] if n % 2 == 0 else []
    scale = 1
    while scale <= max_scale:
        counts.append(n * scale)
        scale *= 2
    return counts


class CellBook:
    """Cells of every job seen, built once per job for one topology."""

    def __init__(self, topology: Topology, max_scale: int, profiling_s_per_cell: float, tune_cells: int = 8,
                 reuse_profiles: bool = True) -> None:
        self.max_scale = max_scale
        self.reuse_profiles = reuse_profiles
        self._profiled: dict[tuple, float] = {}  # Cell key → when its profile is (or was) ready
        self.tune_cells = tune_cells
        self.estimator = Estimator()
        self._tuned: dict[tuple, TunedPlan] = {}
        self.profiling_s_per_cell = profiling_s_per_cell
        self.hardware: dict[str, Hardware] = {}
        self.type_masks: dict[str, np.ndarray] = {}
        for tid, t in enumerate(topology.gpu_types):
            mask = topology.node_type == tid
            self.type_masks[t] = mask
            self.hardware[t] = Hardware(t, gpus_per_node=int(topology.node_gpus[mask].max()))
        self.capacity = {t: int(topology.node_gpus[m].sum()) for t, m in self.type_masks.items()}
        self.throughputs = Throughputs(topology)
        self._cells: dict[str, JobCells] = {}

    def of(self, job: Job) -> JobCells:
        cached = self._cells.get(job.job_id)
        if cached is None:
            cached = self._cells[job.job_id] = self._build(job)
        return cached

    def value(self, job: Job, gpu_type: str, gpus: int) -> float:
        opt = self.of(job).options.get((gpu_type, gpus))
        return opt.value if opt else 0.0

    def tuned(self, job: Job, gpu_type: str, gpus: int) -> TunedPlan:
        """The plan `job` runs on `gpus` GPUs of `gpu_type` (see the module docstring)."""
        spec = job.spec
        if not spec.model or spec.model not in preset_names() or gpu_type not in self.hardware:
            return TunedPlan(None, float("inf"), float("inf"), 0)
        batch = trace_batch(spec.batch_size)
        key = (spec.model, batch, gpu_type, gpus)
        found = self._tuned.get(key)
        if found is None:
            tj, _ = estimator_job(spec.model, batch, gpus)  # the speed model's batch rule at this count
            found = self._tuned[key] = self._tune(tj, self.hardware[gpu_type], gpus)
        return found

    def _tune(self, tj: TrainingJob, hardware: Hardware, gpus: int) -> TunedPlan:
        """Rank the Cells by their sampled estimate (those it finds no fitting sample for last:
        ZeRO-1 without recomputation may not fit where ZeRO-2/3 does), tune the best `tune_cells`."""
        ranked = [ce for ce in build_cells(tj, gpus, {hardware.gpu_type: hardware}, self.estimator, counts=[gpus])
                  if ce.parts]
        sampled = min((self._priced(tj, hardware, gpus, ce.estimate) for ce in ranked),
                      key=lambda e: e.iteration_s if e else float("inf"), default=None)
        best = sampled
        for ce in ranked[: self.tune_cells]:
            priced = self._priced(tj, hardware, gpus, tune_cell(tj, ce, hardware, self.estimator).estimate)
            if priced is not None and (best is None or priced.iteration_s < best.iteration_s * (1 - 1e-12)):
                best = priced
        inf = float("inf")
        return TunedPlan(best.plan if best else None, best.iteration_s if best else inf,
                         sampled.iteration_s if sampled else inf, min(len(ranked), self.tune_cells))

    def _priced(self, tj: TrainingJob, hardware: Hardware, gpus: int, found: Estimate | None) -> Estimate | None:
        """`found`'s plan re-priced as one uniform plan (as the speed model prices it); None if
        it is not one (uneven stages) or does not fit."""
        if found is None or found.plan.world_size != gpus:
            return None
        try:
            priced = self.estimator.estimate(tj, hardware, found.plan)
        except PlanError:
            return None
        return priced if priced.feasible else None

    def _build(self, job: Job) -> JobCells:
        spec, n = job.spec, job.gpus
        allowed = [t for t in self.hardware if spec.gpu_types is None or t in spec.gpu_types]
        per_type: dict[str, list[tuple]] = {}  # type → keys of the job's Cells there
        options: dict[tuple[str, int], Option] = {}
        if spec.model and spec.model in preset_names():
            options = self._from_cells(job, allowed, per_type) or self._from_speed_model(job, allowed)
        if not options:  # no preset: the request as given
            for t in ([spec.gpu_type] if spec.gpu_type in self.hardware else allowed):
                if n <= self.capacity[t]:
                    options[(t, n)] = Option(t, n, 1.0, 1, None)
                per_type[t] = [("job", job.job_id, t)]
        ready_at = self._profile(spec.submit_time, per_type, n)
        admit = max((s for (_, c), s in ready_at.items() if c == n), default=0.0)
        return JobCells(options, max(ready_at.values(), default=0.0), n, admit, ready_at)

    def _profile(self, arrival: float, per_type: dict[str, list[tuple]], n: int) -> dict[tuple[str, int], float]:
        """Seconds from `arrival` until each (type, count)'s Cells are profiled (module docstring)."""
        ready_at: dict[tuple[str, int], float] = {}
        for gpu_type, keys in per_type.items():
            clock = arrival  # one device of the type profiles the new Cells in turn: ≤ n GPUs, then larger
            for key in sorted(keys, key=lambda k: _profile_order(k, n)):
                known = self._profiled.get(key) if self.reuse_profiles and key[0] != "job" else None
                if known is None:
                    clock += self.profiling_s_per_cell
                    known = clock
                    if self.reuse_profiles:
                        self._profiled[key] = known
                option = (gpu_type, n) if key[0] == "job" else (gpu_type, key[3])
                ready_at[option] = max(ready_at.get(option, arrival), known)
        return {option: at - arrival for option, at in ready_at.items()}

    def _from_cells(self, job: Job, allowed: list[str], per_type: dict[str, list[tuple]]
                    ) -> dict[tuple[str, int], Option]:
        spec, n = job.spec, job.gpus
        # One job for every count, so their throughputs compare: the batch rule at N·max_scale, the
        # largest Cell when max_scale is a power of two (then every count divides it).
        tj, _ = estimator_job(spec.model, trace_batch(spec.batch_size), n * self.max_scale)
        estimates = build_cells(tj, n, {t: self.hardware[t] for t in allowed}, counts=cell_counts(n, self.max_scale))
        best: dict[tuple[str, int], CellEstimate] = {}
        for ce in estimates:
            cell = ce.cell
            per_type.setdefault(cell.gpu_type, []).append((spec.model, spec.batch_size, cell.gpu_type, cell.gpus,
                                                           cell.stages))
            key = (ce.cell.gpu_type, ce.cell.gpus)
            if ce.estimate is not None and (key not in best or ce.tokens_per_s > best[key].tokens_per_s):
                best[key] = ce
        ref = best[(spec.gpu_type, n)].tokens_per_s if (spec.gpu_type, n) in best else 0.0
        for fallback in ([ce for (_, c), ce in best.items() if c == n], list(best.values())):
            if ref <= 0:
                ref = max((ce.tokens_per_s for ce in fallback), default=0.0)
        options = {}
        for key, ce in best.items():
            if ref > 0 and key[1] <= self.capacity[key[0]]:
                assert ce.estimate is not None
                plan = ce.estimate.plan
                options[key] = Option(key[0], key[1], ce.tokens_per_s / ref, ce.cell.stages,
                                      plan if plan.world_size == key[1] else None)
        return options

    def _from_speed_model(self, job: Job, allowed: list[str]) -> dict[tuple[str, int], Option]:
        """No Cell fits in memory (e.g. a large Wide-ResNet: the estimator has no
        offload or expert parallelism): value options by the throughput the speed
        model charges anyway (fastest plan ignoring memory), so such jobs can still
        move to faster GPUs or scale."""
        spec, n = job.spec, job.gpus
        of = self.throughputs.of
        ref = of(spec, spec.gpu_type or allowed[0], n, dp_only=True)
        options = {}
        for t in allowed:
            for count in cell_counts(n, self.max_scale):
                thr = of(spec, t, count, dp_only=True)
                if ref > 0 and thr > 0 and count <= self.capacity[t]:
                    options[(t, count)] = Option(t, count, thr / ref, 1, None)
        return options


def _profile_order(key: tuple, n: int) -> tuple[int, int]:
    """Cells of N GPUs first (admission starts a job on N), then the largest counts down to 2N
    (on an idle cluster growth goes straight to the largest Cell), then N/2 (shrinking only)."""
    if key[0] == "job":
        return (0, 0)
    count = key[3]
    return (0, 0) if count == n else (1, -count) if count > n else (2, -count)


__all__ = ["CellBook", "JobCells", "Option", "TunedPlan", "cell_counts"]
