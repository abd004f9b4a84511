"""The interruption cost model (Singularity phases, Acme checkpointing)."""

from __future__ import annotations

import pytest

from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.perf.interruptions import (
    InterruptionCosts,
    InterruptionModel,
    default_plan,
    model_params,
)
from loom.workload.job import JobSpec


def shape(model: str, gpus: int, plan: ParallelPlan | None = None, devices: int | None = None,
          costs: InterruptionCosts | None = None):
    m = InterruptionModel(costs)
    on = devices or gpus
    return m, m.shape(JobSpec("j", 0.0, gpus, model=model), on, max(1, on // 8), plan)


def test_migration_is_tens_of_seconds_and_explained_phase_by_phase():
    m, s = shape("llama2-7b", 64, ParallelPlan(dp=8, tp=8))
    phases = m.migrate(s, s)
    assert 10.0 <= phases.total_s <= 120.0  # Singularity §7.4: tens of seconds
    assert phases.total_s == pytest.approx(m.save(s).total_s + m.load(s).total_s)
    text = phases.describe()
    for name in ("barrier", "dump", "upload", "download", "restore", "rendezvous"):
        assert name in text
    assert m.save(s).barrier_s == pytest.approx(2 * 2.0)  # two mini-batches of the default iteration


def test_checkpoint_is_deduplicated_across_data_parallel_replicas():
    m, narrow = shape("llama2-13b", 16, ParallelPlan(dp=2, tp=8))
    _, wide = shape("llama2-13b", 256, ParallelPlan(dp=32, tp=8))
    assert m.checkpoint_bytes(narrow) == m.checkpoint_bytes(wide) == pytest.approx(14 * narrow.params)
    # but the transparent dump also carries one host image per rank
    assert m.checkpoint_bytes(wide, with_host=True) > m.checkpoint_bytes(narrow, with_host=True)


@pytest.mark.parametrize("model,gpus,tp", [("llama2-7b", 32, 1), ("llama2-7b", 256, 1),
                                            ("llama2-70b", 512, 8), ("megatron-145.6b", 1024, 8)])
def test_async_checkpointing_gain_matches_acme(model, gpus, tp):
    """Acme §6.1: async checkpoints cut the overhead 3.6–58.7× for 7B–123B models."""
    m, s = shape(model, gpus, ParallelPlan(dp=gpus // tp, tp=tp, zero_stage=1))
    ratio = m.checkpoint_stall_s(s, "sync") / m.checkpoint_stall_s(s, "async")
    assert 3.6 <= ratio <= 58.7
    assert m.checkpoint_slowdown(s, "sync") > m.checkpoint_slowdown(s, "async") > 1.0


def test_more_storage_bandwidth_makes_sync_checkpoints_cheaper():
    _, s = shape("llama2-7b", 64)
    slow = InterruptionModel(InterruptionCosts(storage_gbps_per_node=1.0)).checkpoint_stall_s(s, "sync")
    fast = InterruptionModel(InterruptionCosts(storage_gbps_per_node=10.0)).checkpoint_stall_s(s, "sync")
    assert fast < slow


def test_time_slicing_costs_n_times_plus_overhead_and_respects_zero_shards():
    m = InterruptionModel()
    plan = ParallelPlan(dp=8)
    assert m.time_slice_factor(plan, 8) == 1.0
    assert m.time_slice_factor(plan, 2) == pytest.approx(4 * 1.03)
    sharded = ParallelPlan(dp=8, zero_stage=1, zero_shard=4)
    assert m.min_devices(sharded) == 4
    with pytest.raises(LoomInputError, match="cannot time-slice"):
        m.time_slice_factor(sharded, 2)
    assert m.min_devices(ParallelPlan(dp=4, tp=2, pp=2)) == 4


def test_squeezed_ranks_dump_one_after_another():
    m, full = shape("llama2-7b", 16, ParallelPlan(dp=16), devices=16)
    _, squeezed = shape("llama2-7b", 16, ParallelPlan(dp=16), devices=4)
    assert m.save(squeezed).dump_s == pytest.approx(4 * m.save(full).dump_s)


def test_jobs_without_a_model_or_plan_get_documented_defaults():
    assert model_params(JobSpec("a", 0, 4)) == model_params(JobSpec("b", 0, 8, model="llama2-7b"))
    assert model_params(JobSpec("c", 0, 512)) == model_params(JobSpec("d", 0, 1, model="llama2-70b"))
    assert default_plan(32) == ParallelPlan(dp=32, zero_stage=1, zero_shard=8)
    m = InterruptionModel()
    s = m.shape(JobSpec("e", 0, 8, duration=1000.0, iterations=100), 8, 1)
    assert s.iteration_s == pytest.approx(10.0)


@pytest.mark.parametrize("field,value", [("storage_gbps_per_node", 0), ("host_copy_gbps", -1.0),
                                         ("checkpoint_interval_s", float("nan")), ("restart_s", "x"),
                                         ("checkpoint_mode", "eventually")])
def test_bad_parameters_name_the_field(field, value):
    with pytest.raises(LoomInputError) as err:
        InterruptionCosts(**{field: value})
    assert field in str(err.value)
