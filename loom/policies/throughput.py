"""Job throughput estimates shared by heterogeneity-aware and elastic policies.

`Throughputs.of(spec, gpu_type, gpus)` is a job's iterations per second on
`gpus` GPUs of a type, with the best plan the estimator finds (what a job
actually achieves once started); `dp_only=True` gives the data-parallel
scaling estimate the baselines decide with (Crius §7: Gavel, Sia and
ElasticFlow allocate from DP scaling, but run jobs with the best plan).
`dp_plan` is the plan behind that DP estimate, which `with_dp_plans` attaches to a
baseline's decisions: under the speed model's default ``plans: decided`` rule the
baselines run the data-parallel plan they decided with (as their papers run jobs),
under ``plans: best`` the speed model's best plan like every other policy.
Jobs without a `loom.perf` model preset fall back to linear scaling of their
requested size (rate ∝ GPUs, the trace semantics). Memoised per
(model, batch, type, count, GPUs per node, dp_only); `of` and `normalised`
also memoise their answers per (the spec fields they read, type, count,
dp_only), and the preset names and GPUs per node of each type are looked up
once per instance, so repeated calls are dictionary look-ups (values
unchanged).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from loom.core.context import SchedulingContext
from loom.core.decisions import Decision, Migrate, Resize, Resume, Start
from loom.core.plan import ParallelPlan
from loom.hardware.topology import Topology
from loom.perf.estimator import Estimator
from loom.perf.inputs import (
    DEFAULT_BATCH,
    Hardware,
    TrainingJob,
    estimator_job,
    trace_batch,
)
from loom.perf.presets import preset_names
from loom.perf.search import Choices, any_plan_fits, fastest_plan
from loom.workload.job import JobSpec

_MEMO_LIMIT = 1 << 18  # entries per answer memo (cleared when full)


class Throughputs:
    """Iterations per second of a job on `gpus` GPUs of a type (0 when it cannot run)."""

    def __init__(self, topology: Topology, default_batch: int = DEFAULT_BATCH) -> None:
        self.topology = topology
        self.default_batch = default_batch
        self.estimator = Estimator()
        self._cached = lru_cache(maxsize=1 << 16)(self._compute)
        self._presets = frozenset(preset_names())
        self._per_node: dict[str, int] = {}  # GPU type → GPUs per node
        self._of: dict[tuple, float] = {}  # (model, batch, request, type, GPUs, dp_only) → `of`
        self._normalised: dict[tuple, float] = {}  # (+ requested type) → `normalised`

    def of(self, spec: JobSpec, gpu_type: str, gpus: int, dp_only: bool = False) -> float:
        key = (spec.model, spec.batch_size, spec.gpus, gpu_type, gpus, dp_only)
        value = self._of.get(key)
        if value is None:
            if len(self._of) >= _MEMO_LIMIT:
                self._of.clear()
            value = self._of[key] = self._of_uncached(spec, gpu_type, gpus, dp_only)
        return value

    def _of_uncached(self, spec: JobSpec, gpu_type: str, gpus: int, dp_only: bool) -> float:
        if gpus <= 0:
            return 0.0
        if not spec.model or spec.model not in self._presets:
            return gpus / spec.gpus  # trace semantics: the requested size runs at rate 1
        return self._cached(spec.model, trace_batch(spec.batch_size, self.default_batch), gpu_type, gpus,
                            self._gpus_per_node(gpu_type), dp_only)[0]

    def dp_plan(self, spec: JobSpec, gpu_type: str, gpus: int) -> ParallelPlan | None:
        """The data-parallel plan behind `of(..., dp_only=True)` (tp = pp = 1, best micro-batch,
        ZeRO stage and recomputation), None when it does not fit in memory or the job has no preset."""
        if gpus <= 0 or not spec.model or spec.model not in self._presets:
            return None
        return self._cached(spec.model, trace_batch(spec.batch_size, self.default_batch), gpu_type, gpus,
                            self._gpus_per_node(gpu_type), True)[1]

    def runs(self, spec: JobSpec, gpu_type: str, gpus: int) -> bool:
        """Whether `of(spec, gpu_type, gpus) > 0` (some plan fits), without finding the best plan."""
        key = (spec.model, spec.batch_size, spec.gpus, gpu_type, gpus, "runs")
        value = self._of.get(key)
        if value is None:
            if gpus <= 0 or not spec.model or spec.model not in self._presets:
                value = gpus > 0
            elif (known := self._of.get(key[:5] + (False,))) is not None:
                value = known > 0
            else:
                job, _, hardware = self._inputs(spec.model, trace_batch(spec.batch_size, self.default_batch),
                                                gpu_type, gpus, self._gpus_per_node(gpu_type))
                value = any_plan_fits(job, hardware, gpus, choices=Choices(vpp=1), estimator=self.estimator)
            if len(self._of) >= _MEMO_LIMIT:
                self._of.clear()
            self._of[key] = value
        return bool(value)

    def normalised(self, spec: JobSpec, gpu_type: str, gpus: int, dp_only: bool = False) -> float:
        """Throughput relative to the job's request (its GPU count on its GPU type, or the
        best type when it asked for none): 1.0 = as requested."""
        key = (spec.model, spec.batch_size, spec.gpus, spec.gpu_type, gpu_type, gpus, dp_only)
        value = self._normalised.get(key)
        if value is None:
            if len(self._normalised) >= _MEMO_LIMIT:
                self._normalised.clear()
            reference_type = spec.gpu_type or self.best_type(spec, spec.gpus, dp_only)
            reference = self.of(spec, reference_type, spec.gpus, dp_only)
            value = self.of(spec, gpu_type, gpus, dp_only) / reference if reference > 0 else 0.0
            self._normalised[key] = value
        return value

    def best_type(self, spec: JobSpec, gpus: int, dp_only: bool = False) -> str:
        return max(self.topology.gpu_types, key=lambda t: self.of(spec, t, gpus, dp_only))


    def _gpus_per_node(self, gpu_type: str) -> int:
        per_node = self._per_node.get(gpu_type)
        if per_node is None:
            per_node = self._per_node[gpu_type] = self.topology.gpus_per_node(gpu_type)
        return per_node

    @staticmethod
    def _inputs(model: str, batch: int, gpu_type: str, gpus: int, per_node: int
                ) -> tuple[TrainingJob, float, Hardware]:
        """The estimator's job and batch scale (`estimator_job`: the speed model's batch rule) and hardware."""
        job, scale = estimator_job(model, batch, gpus)
        return job, scale, Hardware(gpu_type, gpus_per_node=per_node)

    def _compute(self, model: str, batch: int, gpu_type: str, gpus: int, per_node: int, dp_only: bool
                 ) -> tuple[float, ParallelPlan | None]:
        """(iterations per second, the plan when it fits in memory)."""
        job, scale, hardware = self._inputs(model, batch, gpu_type, gpus, per_node)
        choices = Choices(tp=1, pp=1, vpp=1) if dp_only else Choices(vpp=1)
        # DP-only plans that do not fit in memory: the baseline still believes DP scaling
        best = fastest_plan(job, hardware, gpus, choices=choices, estimator=self.estimator, or_unfit=dp_only)
        if best is None or not (best.feasible or dp_only):
            return 0.0, None
        return scale / best.iteration_s, best.plan if best.feasible else None


def with_dp_plans(decisions: list[Decision], ctx: SchedulingContext, throughputs: Throughputs) -> list[Decision]:
    """`decisions` with every Start/Resume/Migrate/Resize that carries no plan given the job's
    data-parallel plan for the GPUs it gets (`Throughputs.dp_plan`), named in its reason; a job
    that fits no data-parallel plan keeps none (the speed model's best plan: the only way it runs)."""
    topo = ctx.topology
    out: list[Decision] = []
    for d in decisions:
        if isinstance(d, (Start, Resume, Migrate, Resize)) and d.plan is None:
            job = ctx.running.get(d.job_id) or ctx.pending.get(d.job_id) or ctx.starting.get(d.job_id)
            if job is not None:
                gpu_type = topo.gpu_types[int(topo.node_type[d.allocation.nodes[0]])]
                plan = throughputs.dp_plan(job.spec, gpu_type, d.allocation.total)
                if plan is not None:
                    d = replace(d, plan=plan, reason=f"{d.reason}; runs data-parallel {plan.describe()}")
        out.append(d)
    return out
