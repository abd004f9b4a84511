"""Speed from the performance estimator: time from work, rate from what a job got.

Crius/Arena traces give a model, a batch size and an iteration count. A job's
work in reference seconds is `iterations × t(requested)`, where t(requested)
is the iteration time of the best plan for the model on the GPU count and type
it asked for, packed in one minipod; on the GPUs it actually gets it
progresses at `t(requested) / t(actual)`, where t(actual) prices the job's
plan (the one its policy or placer chose, else the best for the allocation)
on the allocated GPU type and count and — with `placement_aware` — on where
its ranks landed (minipods spanned by its DP and PP groups, uplink
oversubscription; `loom.perf.placement`). A job placed as requested and
packed runs for exactly its derived duration.

Documented rules:
- ``iteration_scale`` multiplies trace iterations (0.2 reproduces the Arena
  simulator's convention of dividing them by 5);
- the model name must be a `loom.perf` preset (e.g. ``bert__2.6B``); the
  global batch is the trace's batch size (sequences, or images for a cnn);
- trace jobs that carry a duration but no preset keep trace semantics (rate ∝
  GPUs) with ``trace_models="keep"``; with ``trace_models="by-size"`` they get
  a model by size — ≤ 8 GPUs llama2-7b, ≤ 64 llama2-13b, else llama2-70b — and
  their recorded duration becomes the reference time on the requested GPUs;
- when no plan fits in GPU memory (e.g. a 10B MoE on one 16 GB V100: the
  estimator does not model expert parallelism or offload), the job is priced
  by the fastest plan ignoring memory, and counted in `memory_overrides`;
- ``plans`` is the fairness switch of a policy comparison (one rule for every
  policy): ``"decided"`` (default) prices the plan each job's decision carried
  (`Start.plan`, `Resize.plan`, `Migrate.plan`: Crius its tuned Cell plan, the
  DP-scaling baselines their data-parallel plan, as their papers run jobs); a
  job whose policy decided no plan runs the best plan for its GPUs.
  ``"best"`` ignores decided plans and gives every job the best plan the
  estimator finds for the GPUs it holds (an oracle tuner for everyone);
- interference (Arnold Appendix D: up to ~5% when other jobs load the same
  minipod uplinks): a job whose groups span several minipods runs
  `1 − interference × load` slower, where load = share of the GPUs in the
  minipods it touches held by other running jobs that also span minipods;
  sampled when the job starts or moves (rates are piecewise constant), and off
  with ``interference=0``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np

from loom.core.jobs import Job
from loom.core.plan import ParallelPlan
from loom.core.protocols import SPEED_MODELS
from loom.errors import LoomInputError
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology
from loom.perf.estimator import Estimator
from loom.perf.inputs import (
    DEFAULT_BATCH,
    PACKED,
    Hardware,
    Placement,
    PlanError,
    estimator_job,
    trace_batch,
)
from loom.perf.placement import placement_of
from loom.perf.presets import preset_for_gpus, preset_names
from loom.perf.search import Choices, fastest_plan
from loom.workload.job import JobSpec

TRACE_MODEL_RULES = ("keep", "by-size")
PLAN_RULES = ("decided", "best")


@SPEED_MODELS.register("estimator")
class EstimatorSpeed:
    """Rate = t(requested, packed) / t(actual plan, GPUs and placement)."""

    name = "estimator"

    def __init__(self, default_batch: int = DEFAULT_BATCH, placement_aware: bool = True,
                 interference: float = 0.05, trace_models: str = "keep", iteration_scale: float = 1.0,
                 plans: str = "decided") -> None:
        if not iteration_scale > 0:
            raise LoomInputError(f"must be > 0, got {iteration_scale!r}", field="speed_model.params.iteration_scale")
        self.iteration_scale = iteration_scale  # Arena's simulator runs trace iterations / 5 (0.2)
        if trace_models not in TRACE_MODEL_RULES:
            raise LoomInputError(f"must be one of {', '.join(TRACE_MODEL_RULES)}, got {trace_models!r}",
                                 field="speed_model.params.trace_models")
        if not 0.0 <= interference < 1.0:
            raise LoomInputError(f"must be in [0, 1), got {interference!r}", field="speed_model.params.interference")
        if plans not in PLAN_RULES:
            raise LoomInputError(f"must be one of {', '.join(PLAN_RULES)}, got {plans!r}",
                                 field="speed_model.params.plans")
        self.plans = plans
        self.default_batch = default_batch
        self.placement_aware = placement_aware
        self.interference = interference
        self.trace_models = trace_models
        self.estimator = Estimator()
        self.memory_overrides: set[tuple[str, int, str, int]] = set()
        self._best = lru_cache(maxsize=1 << 14)(self._best_estimate)
        self._planned = lru_cache(maxsize=1 << 14)(self._planned_estimate)  # jobs restart on the same shapes
        self._ctx: Any = None

    # -- hooks the engine calls ------------------------------------------------
    def bind(self, ctx: Any) -> None:
        """The scheduling context, read for interference (other running jobs)."""
        self._ctx = ctx

    def prepare(self, specs: Sequence[JobSpec], topology: Topology) -> list[JobSpec]:
        """Give every job without a duration one: iterations × scale × t(requested)."""
        return derive_durations(specs, topology, self.iteration_scale,
                                lambda spec, gpu_type: self.iteration_seconds(spec, gpu_type, spec.gpus, topology))

    def rate(self, job: Job, allocation: Allocation, topology: Topology) -> float:
        spec = job.spec
        model = self.model_of(spec)
        if model is None:
            return allocation.total / spec.gpus
        gpu_type = topology.gpu_types[int(topology.node_type[allocation.nodes[0]])]
        per_node = topology.gpus_per_node(gpu_type)
        batch = trace_batch(spec.batch_size, self.default_batch)
        reference = self._best(model, batch, spec.gpu_type or gpu_type, spec.gpus,
                               topology.gpus_per_node(spec.gpu_type or gpu_type))
        plan = self.plan_of(job, allocation)
        actual = self._actual(model, batch, gpu_type, per_node, allocation, plan, topology)
        return reference[0] * reference[1] / (actual * self._interference(allocation, topology, job))

    def plan_quality(self, job: Job, allocation: Allocation, topology: Topology) -> float:
        """Speed of the plan `job` runs on `allocation` over the best plan's on the same GPUs and
        placement (1.0: as good as the speed model's own tuner; jobs without a model: 1.0)."""
        spec = job.spec
        model = self.model_of(spec)
        plan = self.plan_of(job, allocation)
        if model is None or plan is None:
            return 1.0
        gpu_type = topology.gpu_types[int(topology.node_type[allocation.nodes[0]])]
        per_node = topology.gpus_per_node(gpu_type)
        batch = trace_batch(spec.batch_size, self.default_batch)
        best = self._actual(model, batch, gpu_type, per_node, allocation, None, topology)
        return best / self._actual(model, batch, gpu_type, per_node, allocation, plan, topology)

    def plan_of(self, job: Job, allocation: Allocation) -> ParallelPlan | None:
        """The plan priced for `job` on `allocation` under the `plans` rule (None: the best plan)."""
        plan = job.plan
        if self.plans == "best" or plan is None or plan.world_size != allocation.total:
            return None
        return plan

    def model_of(self, spec: JobSpec) -> str | None:
        """The preset that prices this job, by the documented rule (None: trace semantics)."""
        if spec.model and (spec.iterations or spec.model in preset_names()):
            return spec.model
        if self.trace_models == "by-size" and spec.duration is not None:
            return preset_for_gpus(spec.gpus)
        return None

    # -- estimates ---------------------------------------------------------------
    def iteration_seconds(self, spec: JobSpec, gpu_type: str, gpus: int, topology: Topology) -> float:
        batch = trace_batch(spec.batch_size, self.default_batch)
        seconds, scale, _ = self._best(spec.model, batch, gpu_type, gpus, topology.gpus_per_node(gpu_type))
        return seconds * scale

    def _actual(self, model: str, batch: int, gpu_type: str, per_node: int, allocation: Allocation,
                plan: ParallelPlan | None, topology: Topology) -> float:
        seconds, scale, best_plan = self._best(model, batch, gpu_type, allocation.total, per_node)
        use = plan or best_plan
        if use is None or not (self.placement_aware or plan is not None):
            return seconds * scale
        placement = PACKED
        if self.placement_aware:
            placement = _placement(allocation, use, topology)
        planned = self._planned(model, batch, gpu_type, per_node, allocation.total, use, placement)
        return (seconds if planned is None else planned) * scale

    def _planned_estimate(self, model: str, batch: int, gpu_type: str, per_node: int, gpus: int,
                          plan: ParallelPlan, placement: Placement) -> float | None:
        """Iteration seconds of `plan` on `gpus` GPUs placed as `placement` (None: it cannot run)."""
        job, _ = estimator_job(model, batch, gpus)
        try:
            return self.estimator.estimate(job, Hardware(gpu_type, gpus_per_node=per_node), plan, placement).iteration_s
        except PlanError:
            return None

    def _best_estimate(self, model_name: str, batch: int, gpu_type: str, gpus: int, per_node: int
                       ) -> tuple[float, float, ParallelPlan | None]:
        """(iteration s of the best plan, batch scale, that plan) on `gpus` packed GPUs."""
        if model_name not in preset_names():
            raise LoomInputError(
                f"model '{model_name}' has no loom.perf preset (known: {', '.join(preset_names())})", field="model"
            )
        job, scale = estimator_job(model_name, batch, gpus)
        hardware = Hardware(gpu_type, gpus_per_node=per_node)
        best = fastest_plan(job, hardware, gpus, choices=Choices(vpp=1), estimator=self.estimator, or_unfit=True)
        if best is None:
            raise LoomInputError(f"no valid plan for {model_name} on {gpus} {gpu_type} GPUs", field="model")
        if best.feasible:
            return best.iteration_s, scale, best.plan
        self.memory_overrides.add((model_name, batch, gpu_type, gpus))
        return best.iteration_s, scale, None

    def _interference(self, allocation: Allocation, topology: Topology, job: Job) -> float:
        """1 + slowdown from other cross-minipod jobs on the same minipods (≥ 1)."""
        if not self.interference or self._ctx is None:
            return 1.0
        pods = topology.switch_of[topology.minipod_tier]
        mine = set(pods[list(allocation.nodes)].tolist())
        if len(mine) < 2:
            return 1.0
        busy = 0
        for other in self._ctx.running.values():
            if other is job or other.allocation is None:
                continue
            theirs = pods[list(other.allocation.nodes)]
            if len(set(theirs.tolist())) > 1:
                busy += int(np.asarray(other.allocation.gpus)[np.isin(theirs, list(mine))].sum())
        total = int(topology.node_gpus[np.isin(pods, list(mine))].sum())
        load = min(1.0, busy / total) if total else 0.0
        return 1.0 / (1.0 - self.interference * load)


def _placement(allocation: Allocation, plan: ParallelPlan, topology: Topology) -> Placement:
    try:
        return placement_of(allocation.nodes, plan, topology, allocation.gpus)
    except LoomInputError:
        return PACKED


def derive_durations(specs: Sequence[JobSpec], topology: Topology, iteration_scale: float,
                     seconds: Callable[[JobSpec, str], float]) -> list[JobSpec]:
    """Jobs that state work (model, iterations) get `iterations × scale ×
    seconds(spec, gpu type asked for)`; jobs with a duration are kept."""
    out = []
    for spec in specs:
        if spec.duration is not None:
            out.append(spec)
            continue
        if not spec.iterations or not spec.model:
            raise LoomInputError(
                "job has no duration and no model/iterations to derive one from", field=f"job {spec.job_id}"
            )
        per_iteration = seconds(spec, spec.gpu_type or topology.largest_gpu_type())
        out.append(replace(spec, duration=spec.iterations * iteration_scale * per_iteration))
    return out
