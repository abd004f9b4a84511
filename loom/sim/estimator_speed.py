"""Speed from the performance estimator, for traces that give work, not time.

Crius/Arena traces give a model, a batch size and an iteration count. A job's
work in reference seconds is `iterations × t(requested)`, where
t(requested) is the iteration time of the best plan for the model on the GPU
count and type it asked for; on the GPUs it actually gets it progresses at
`t(requested) / t(allocated)`. So a job placed as requested runs for exactly
its derived duration, and a job moved to faster or more GPUs runs faster.

Documented rules:
- the model name must be a `loom.perf` preset (e.g. ``bert__2.6B``); the
  global batch is the trace's batch size (sequences, or images for a cnn);
- the best plan is searched with `loom.perf.search` (memoised per model,
  batch, GPU type, count and GPUs per node);
- when no plan fits in GPU memory (e.g. a 10B MoE on one 16 GB V100: the
  estimator does not model expert parallelism or offload), the job is priced
  by the fastest plan ignoring memory, and counted in `memory_overrides`;
- jobs that already have a duration keep trace semantics (rate ∝ GPUs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache

from loom.core.jobs import Job
from loom.core.protocols import SPEED_MODELS
from loom.errors import LoomInputError
from loom.hardware.state import Allocation
from loom.hardware.topology import Topology
from loom.perf.estimator import Estimator
from loom.perf.inputs import Hardware, TrainingJob
from loom.perf.presets import preset, preset_names
from loom.perf.search import Choices, candidate_plans, search_plans
from loom.workload.job import JobSpec

DEFAULT_BATCH = 256


@SPEED_MODELS.register("estimator")
class EstimatorSpeed:
    """Rate = t(requested GPUs) / t(allocated GPUs), both from the estimator."""

    name = "estimator"

    def __init__(self, default_batch: int = DEFAULT_BATCH) -> None:
        self.default_batch = default_batch
        self.estimator = Estimator()
        self.memory_overrides: set[tuple[str, int, str, int]] = set()
        self._iteration = lru_cache(maxsize=1 << 14)(self._best_iteration)

    # -- hooks the engine calls ------------------------------------------------
    def prepare(self, specs: Sequence[JobSpec], topology: Topology) -> list[JobSpec]:
        """Give every job without a duration one: iterations × t(requested)."""
        out = []
        for spec in specs:
            if spec.duration is not None:
                out.append(spec)
                continue
            if not spec.iterations or not spec.model:
                raise LoomInputError(
                    "job has no duration and no model/iterations to derive one from", field=f"job {spec.job_id}"
                )
            gpu_type = spec.gpu_type or _largest_type(topology)
            seconds = self.iteration_seconds(spec, gpu_type, spec.gpus, topology)
            out.append(replace(spec, duration=spec.iterations * seconds))
        return out

    def rate(self, job: Job, allocation: Allocation, topology: Topology) -> float:
        spec = job.spec
        if not spec.model or not spec.iterations:
            return allocation.total / spec.gpus
        gpu_type = topology.gpu_types[int(topology.node_type[allocation.nodes[0]])]
        requested = self.iteration_seconds(spec, spec.gpu_type or gpu_type, spec.gpus, topology)
        actual = self.iteration_seconds(spec, gpu_type, allocation.total, topology)
        return requested / actual

    # -- estimates ---------------------------------------------------------------
    def iteration_seconds(self, spec: JobSpec, gpu_type: str, gpus: int, topology: Topology) -> float:
        batch = spec.batch_size or self.default_batch
        return self._iteration(spec.model, batch, gpu_type, gpus, _gpus_per_node(topology, gpu_type))

    def _best_iteration(self, model_name: str, batch: int, gpu_type: str, gpus: int, per_node: int) -> float:
        if model_name not in preset_names():
            raise LoomInputError(
                f"model '{model_name}' has no loom.perf preset (known: {', '.join(preset_names())})", field="model"
            )
        job = TrainingJob(preset(model_name), _batch_for(batch, gpus))
        hardware = Hardware(gpu_type, gpus_per_node=per_node)
        result = search_plans(job, hardware, gpus, choices=Choices(vpp=1), top=1, estimator=self.estimator)
        scale = batch / job.global_batch
        if result.best is not None:
            return result.best.iteration_s * scale
        self.memory_overrides.add((model_name, batch, gpu_type, gpus))
        fastest = min(
            (self.estimator.estimate(job, hardware, plan) for plan in candidate_plans(job, hardware, gpus, Choices(vpp=1))),
            key=lambda e: e.iteration_s,
            default=None,
        )
        if fastest is None:
            raise LoomInputError(f"no valid plan for {model_name} on {gpus} {gpu_type} GPUs", field="model")
        return fastest.iteration_s * scale


def _batch_for(batch: int, gpus: int) -> int:
    """The global batch, rounded up to a multiple of the GPU count so every
    data-parallel plan divides it (the extra samples are priced out again)."""
    return -(-batch // gpus) * gpus


def _gpus_per_node(topology: Topology, gpu_type: str) -> int:
    type_id = topology.type_id(gpu_type)
    if type_id is None:
        return int(topology.node_gpus.max())
    return int(topology.node_gpus[topology.node_type == type_id].max())


def _largest_type(topology: Topology) -> str:
    return max(topology.gpus_by_type().items(), key=lambda kv: kv[1][1])[0]
