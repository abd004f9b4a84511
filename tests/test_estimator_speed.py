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


# -- placement, plan, interference, model rule ------------------------------------
from types import SimpleNamespace  # noqa: E402

from loom.core.plan import ParallelPlan  # noqa: E402
from loom.hardware.clos import clos  # noqa: E402


@pytest.fixture(scope="module")
def two_pods():
    return clos("two", minipods=2, nodes=8, gpus_per_node=8, gpu_type="H800", nodes_per_leaf=2)


def llm(jid="l", gpus=32, model="llama2-13b", duration=1000.0):
    return JobSpec(job_id=jid, submit_time=0.0, gpus=gpus, duration=duration, gpu_type="H800", model=model,
                   batch_size=256)


def test_spread_over_minipods_runs_slower_than_packed(two_pods):
    speed = EstimatorSpeed()
    job = Job(llm(), 0)
    job.plan = ParallelPlan(dp=2, tp=8, pp=2, micro_batch=1, zero_stage=1)  # one node per (stage, replica)
    packed = speed.rate(job, Allocation((0, 1, 2, 3), (8, 8, 8, 8)), two_pods)
    pp_across = speed.rate(job, Allocation((0, 1, 4, 5), (8, 8, 8, 8)), two_pods)  # stage 0 in mp0, stage 1 in mp1
    assert pp_across < packed
    blind = EstimatorSpeed(placement_aware=False)
    assert blind.rate(job, Allocation((0, 1, 4, 5), (8, 8, 8, 8)), two_pods) == pytest.approx(
        blind.rate(job, Allocation((0, 1, 2, 3), (8, 8, 8, 8)), two_pods))


def test_the_jobs_own_plan_is_priced(two_pods):
    speed = EstimatorSpeed()
    job = Job(llm(), 0)
    alloc = Allocation((0, 1, 2, 3), (8, 8, 8, 8))
    best = speed.rate(job, alloc, two_pods)
    job.plan = ParallelPlan(dp=32, tp=1, pp=1, micro_batch=1, zero_stage=3, recompute="full")
    assert speed.rate(job, alloc, two_pods) < best


def test_interference_from_other_cross_minipod_jobs(two_pods):
    job = Job(llm("a", gpus=16), 0)
    other = Job(llm("b", gpus=16), 1)
    other.allocation = Allocation((2, 6), (8, 8))
    ctx = SimpleNamespace(running={"b": other})
    alloc = Allocation((0, 4), (8, 8))
    quiet, busy = EstimatorSpeed(), EstimatorSpeed()
    busy.bind(ctx)
    assert busy.rate(job, alloc, two_pods) < quiet.rate(job, alloc, two_pods)
    assert quiet.rate(job, alloc, two_pods) / busy.rate(job, alloc, two_pods) <= 1.0 / (1 - 0.05) + 1e-9
    off = EstimatorSpeed(interference=0.0)
    off.bind(ctx)
    assert off.rate(job, alloc, two_pods) == pytest.approx(quiet.rate(job, alloc, two_pods))


def test_trace_jobs_keep_trace_semantics_or_get_a_model_by_size(two_pods):
    spec = JobSpec(job_id="t", submit_time=0.0, gpus=16, duration=500.0)
    job = Job(spec, 0)
    twice = Allocation((0, 1, 2, 3), (8, 8, 8, 8))
    assert EstimatorSpeed().rate(job, twice, two_pods) == pytest.approx(2.0)  # trace: rate ∝ GPUs
    by_size = EstimatorSpeed(trace_models="by-size")
    assert by_size.model_of(spec) == "llama2-13b"
    assert by_size.rate(job, Allocation((0, 1), (8, 8)), two_pods) == pytest.approx(1.0)
    assert 1.0 < by_size.rate(job, twice, two_pods) <= 2.0 + 1e-9  # the estimator's scaling: never superlinear
    job.plan = ParallelPlan(dp=1, tp=8, pp=2, micro_batch=1, zero_stage=1)
    assert by_size.rate(job, Allocation((0, 4), (8, 8)), two_pods) < by_size.rate(job, Allocation((0, 1), (8, 8)),
                                                                                   two_pods)


def test_bad_speed_model_parameters_name_the_field():
    with pytest.raises(LoomInputError, match="trace_models"):
        EstimatorSpeed(trace_models="guess")
    with pytest.raises(LoomInputError, match="interference"):
        EstimatorSpeed(interference=1.5)


def test_iteration_scale_shortens_derived_durations(arena):
    full = EstimatorSpeed().prepare([arena_job()], arena)[0].duration
    fifth = EstimatorSpeed(iteration_scale=0.2).prepare([arena_job()], arena)[0].duration
    assert fifth == pytest.approx(full * 0.2)
    with pytest.raises(LoomInputError, match="iteration_scale"):
        EstimatorSpeed(iteration_scale=0)
