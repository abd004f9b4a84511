"""The estimator speed model: durations from work, rates from allocations."""

from __future__ import annotations

import pytest

from loom.errors import LoomInputError
from loom.hardware.clusters import load_cluster
from loom.hardware.state import Allocation
from loom.core.jobs import Job
from loom.placement.best_fit import BestFit
from loom.policies.fcfs import FCFS
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.workload.job import JobSpec


def arena_job(jid: str = "j", gpus: int = 4, gpu_type: str = "A100-40GB", model: str = "bert__760M",
              iterations: int = 1000, batch: int = 128, t: float = 0.0) -> JobSpec:
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, duration=None, gpu_type=gpu_type, model=model,
                   iterations=iterations, batch_size=batch)


@pytest.fixture(scope="module")
def arena():
    return load_cluster("arena-1280")


def nodes_of(topology, gpu_type: str, count: int) -> list[int]:
    tid = topology.type_id(gpu_type)
    return [i for i in range(topology.num_nodes) if topology.node_type[i] == tid][:count]


def test_prepare_derives_duration_from_iterations(arena):
    speed = EstimatorSpeed()
    spec = arena_job()
    (prepared,) = speed.prepare([spec], arena)
    per_iteration = speed.iteration_seconds(spec, "A100-40GB", 4, arena)
    assert prepared.duration == pytest.approx(1000 * per_iteration)
    assert 0.05 < per_iteration < 60


def test_rate_is_one_as_requested_and_higher_on_more_or_faster_gpus(arena):
    speed = EstimatorSpeed()
    spec = speed.prepare([arena_job(gpu_type="V100", gpus=4)], arena)[0]
    job = Job(spec, 0)
    v100 = nodes_of(arena, "V100", 1)
    assert speed.rate(job, Allocation(v100, [4]), arena) == pytest.approx(1.0)
    assert speed.rate(job, Allocation(v100, [8]), arena) > 1.0
    a100 = nodes_of(arena, "A100-40GB", 1)
    assert speed.rate(job, Allocation(a100, [4]), arena) > 1.0


def test_unknown_model_is_a_clear_error(arena):
    with pytest.raises(LoomInputError, match="gpt-17"):
        EstimatorSpeed().prepare([arena_job(model="gpt-17")], arena)


def test_models_too_big_for_memory_are_priced_and_counted(arena):
    speed = EstimatorSpeed()
    (spec,) = speed.prepare([arena_job(model="moe__10B", gpus=1, gpu_type="A10")], arena)
    assert spec.duration and spec.duration > 0
    assert ("moe__10B", 128, "A10", 1) in speed.memory_overrides


def test_jobs_without_duration_are_rejected_under_trace_speed(arena):
    sim = Simulation(arena, [arena_job()], FCFS(), BestFit())
    result = sim.run()
    assert "estimator" in result.rejected["j"]


def test_simulation_runs_jobs_for_their_derived_duration(arena):
    speed = EstimatorSpeed()
    specs = [arena_job("a", t=0.0), arena_job("b", gpu_type="A10", gpus=2, t=5.0)]
    result = Simulation(arena, specs, FCFS(), BestFit(), speed).run()
    derived = {s.job_id: s.duration for s in speed.prepare(specs, arena)}
    for job in result.jobs:
        assert job.end_time - job.first_start == pytest.approx(derived[job.job_id])
