"""Estimator: calibration, validity, memory, communication, placement, properties."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loom.perf
from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError, UnknownNameError
from loom.paths import shared_traces_dir
from loom.perf import preset
from loom.perf.calibration import load_calibration
from loom.perf.estimator import Estimator, StageSpec, uniform_stages
from loom.perf.fit import load_megatron_table, mape
from loom.perf.inputs import Hardware, Placement, PlanError, TrainingJob, check_plan
from loom.perf.model import ModelSpec
from loom.perf.placement import placement_of
from loom.perf.search import Choices, search_plans

A100 = Hardware("A100-80GB")
EST = Estimator()


def gpt(layers: int = 24, hidden: int = 2048, heads: int = 16, seq: int = 2048) -> ModelSpec:
    return ModelSpec(name="t", layers=layers, hidden=hidden, heads=heads, seq_len=seq, vocab=51200)


def calibration_table():
    return load_megatron_table(shared_traces_dir().parent / "calibration" / "megatron_lm_table1.csv")


# -- calibration --------------------------------------------------------------
def test_bundled_calibration_reproduces_megatron_table_within_three_percent():
    assert mape(calibration_table(), load_calibration()) <= 0.03


def test_llama2_7b_step_time_matches_zhejianglab_log_within_fifteen_percent():
    """The log: 4 nodes × 8 A100, 4 × 200 GbE per node, DeepSpeed ZeRO-1 with
    CPU optimizer offload, HF Transformers (unfused), micro-batch 1, global
    batch 1024 of 4096 tokens, overlap_comm off; ≈45.8 s per step."""
    job = TrainingJob(
        preset("llama2-7b"), 1024, fused_kernels=False, optimizer_offload=True, overlap_dp=False
    )
    hardware = Hardware("A100-80GB", nic_gbps=100.0)
    plan = ParallelPlan(dp=32, micro_batch=1, zero_stage=1, recompute="full")
    estimate = EST.estimate(job, hardware, plan)
    assert estimate.feasible
    assert abs(estimate.iteration_s - 45.8) / 45.8 <= 0.15


def test_calibration_file_errors_name_the_field(tmp_path):
    path = tmp_path / "cal.yaml"
    text = (Path(loom.perf.__file__).parent / "data" / "calibration.yaml").read_text()
    path.write_text(text.replace("gemm_efficiency: ", "gemm_efficiency: 1.5 #"))
    with pytest.raises(LoomInputError, match="gemm_efficiency.*in \\(0, 1\\]"):
        load_calibration(path)
    path.write_text(text + "\nsurprise: 1\n")
    with pytest.raises(LoomInputError, match="surprise"):
        load_calibration(path)
    path.write_text(text.replace("  p2p: 0.5", ""))
    with pytest.raises(LoomInputError, match="half_bandwidth_mb.p2p.*missing"):
        load_calibration(path)


# -- validity -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("plan", "gpus", "field"),
    [
        (ParallelPlan(dp=2, tp=2, pp=2), 16, "dp"),
        (ParallelPlan(dp=1, tp=3), 3, "tp"),
        (ParallelPlan(dp=1, pp=25), 25, "pp"),  # more stages than layers
        (ParallelPlan(dp=1, pp=2, virtual_stages=5), 2, "pp"),
        (ParallelPlan(dp=3), 3, "global_batch"),
        (ParallelPlan(zero_stage=4), 1, "zero"),
        (ParallelPlan(recompute="some"), 1, "recompute"),
    ],
)
def test_invalid_plans_name_the_field(plan, gpus, field):
    with pytest.raises(PlanError) as info:
        check_plan(TrainingJob(gpt(), 64), plan, gpus)
    assert info.value.field == field


def test_24_layers_on_5_stages_split_unevenly_by_default():
    """Issue 22: refusing layers not divisible by pp was a defect. 24 = 5+5+5+5+4 (q=4, r=4 extras:
    the three middle stages and, r = pp − 1, the first; the last stage, with the LM head, keeps 4)."""
    job, plan = TrainingJob(gpt(), 64), ParallelPlan(dp=1, pp=5)
    check_plan(job, plan, 5)
    assert [(s.layers, s.count) for s in uniform_stages(job, A100, plan)] == [(5, 1), (5, 3), (4, 1)]
    assert EST.estimate(job, A100, plan).iteration_s > 0


def test_even_split_and_interleaving_still_refuse_naming_the_field_and_nearest_plan():
    with pytest.raises(PlanError) as info:
        check_plan(TrainingJob(gpt(), 64, pipeline_split="even"), ParallelPlan(dp=1, pp=5), 5)
    assert info.value.field == "pp" and "nearest: pp=4 or pp=6" in info.value.message
    with pytest.raises(PlanError) as info:
        check_plan(TrainingJob(gpt(), 64), ParallelPlan(dp=1, pp=5, virtual_stages=2), 5)
    assert info.value.field == "pp" and "nearest: vpp=1 or pp=4 or pp=6 with vpp=2" in info.value.message
    with pytest.raises(PlanError) as info:
        check_plan(TrainingJob(gpt(), 64), ParallelPlan(dp=1, pp=25), 25)
    assert info.value.field == "pp" and "nearest: pp=24" in info.value.message


def test_unknown_gpu_type_is_a_clear_error():
    with pytest.raises(UnknownNameError, match="Z100"):
        Hardware("Z100")


def test_estimate_rejects_invalid_plan():
    with pytest.raises(PlanError, match="heads"):
        EST.estimate(TrainingJob(gpt(heads=16), 64), A100, ParallelPlan(tp=3))


def test_cnn_models_are_data_parallel_only():
    job = TrainingJob(preset("wide_resnet__1B"), 256)
    assert EST.estimate(job, A100, ParallelPlan(dp=8)).feasible
    with pytest.raises(PlanError, match="data-parallel"):
        EST.estimate(job, A100, ParallelPlan(dp=4, tp=2))


# -- memory -------------------------------------------------------------------
def test_zero_and_recomputation_lower_memory():
    job = TrainingJob(preset("llama2-13b"), 512)
    mem = {}
    for zero in range(4):
        for recompute in ("none", "selective", "full"):
            plan = ParallelPlan(dp=16, micro_batch=1, zero_stage=zero, recompute=recompute)
            mem[zero, recompute] = EST.estimate(job, A100, plan).memory_gib_per_gpu
    for recompute in ("none", "selective", "full"):
        assert [mem[z, recompute] for z in range(4)] == sorted((mem[z, recompute] for z in range(4)), reverse=True)
    assert mem[0, "none"] >= mem[0, "selective"] > mem[0, "full"]


def test_out_of_memory_plan_is_infeasible_with_reason():
    estimate = EST.estimate(TrainingJob(preset("llama2-70b"), 64), Hardware("V100"), ParallelPlan(dp=1, tp=8))
    assert not estimate.feasible
    assert "out of memory" in estimate.reason and "V100" in estimate.reason


def test_search_reports_why_nothing_fits():
    result = search_plans(TrainingJob(preset("llama2-70b"), 64), Hardware("T4"), 4)
    assert result.best is None and "memory" in result.reason


# -- communication and placement ----------------------------------------------
def test_pp_aligned_beats_dp_aligned_when_pipeline_sends_dominate():
    job = TrainingJob(preset("megatron-39.1b"), 512)
    plan = ParallelPlan(dp=4, tp=8, pp=16, micro_batch=1, zero_stage=1, recompute="selective")
    hw = Hardware("H800")
    pp_aligned = EST.estimate(job, hw, plan, Placement(dp_minipods=2, pp_minipods=1))
    dp_aligned = EST.estimate(job, hw, plan, Placement(dp_minipods=1, pp_minipods=2))
    packed = EST.estimate(job, hw, plan)
    assert packed.iteration_s < pp_aligned.iteration_s < dp_aligned.iteration_s


def test_oversubscription_slows_cross_minipod_groups():
    job = TrainingJob(preset("megatron-7.5b"), 512)
    plan = ParallelPlan(dp=16, tp=4, micro_batch=2, zero_stage=1)
    quiet = EST.estimate(job, A100, plan, Placement(dp_minipods=2))
    busy = EST.estimate(job, A100, plan, Placement(dp_minipods=2, dp_oversubscription=4.0))
    assert busy.iteration_s > quiet.iteration_s


def test_placement_of_counts_minipods_per_group(small_clos):
    plan = ParallelPlan(dp=2, tp=8, pp=4)  # 8 nodes, one rank group per node
    # Nodes 0-3 are minipod 0, 4-7 minipod 1. In rank order the pipeline is the
    # slow axis: nodes in order keep each DP pair together and split pipelines.
    in_order = placement_of(list(range(8)), plan, small_clos)
    assert (in_order.dp_minipods, in_order.pp_minipods) == (1, 2)
    interleaved = placement_of([0, 4, 1, 5, 2, 6, 3, 7], plan, small_clos)
    assert (interleaved.dp_minipods, interleaved.pp_minipods) == (2, 1)


def test_placement_of_rejects_too_few_gpus(small_clos):
    with pytest.raises(LoomInputError, match="do not fit"):
        placement_of([0], ParallelPlan(dp=2, tp=8), small_clos)


# -- stages -------------------------------------------------------------------
def test_a_slow_stage_sets_the_pace():
    job = TrainingJob(gpt(), 64)
    plan = ParallelPlan(dp=4, pp=2, micro_batch=1)
    fast = EST.estimate(job, A100, plan)
    slow_first = (
        StageSpec(Hardware("V100"), 1, 4, 12, first=True),
        StageSpec(A100, 1, 4, 12, last=True),
    )
    mixed = EST.estimate_stages(job, slow_first, plan)
    assert mixed.iteration_s > fast.iteration_s
    assert mixed.gpu_type == "A100-80GB+V100"
    assert len(uniform_stages(job, A100, ParallelPlan(dp=1, pp=4))) == 3


def test_estimates_are_memoised():
    est = Estimator()
    job, plan = TrainingJob(gpt(), 64), ParallelPlan(dp=8)
    first = est.estimate(job, A100, plan)
    assert est.estimate(job, A100, plan) is first
    assert est.estimate.cache_info().hits == 1


def test_auto_plan_for_175b_on_1024_a100_is_feasible_and_sensible():
    result = search_plans(TrainingJob(preset("gpt3-175b"), 1536), A100, 1024, top=3)
    best = result.best
    assert best is not None and best.plan.world_size == 1024
    assert 0.3 < best.mfu < 0.7
    assert [e.iteration_s for e in result.top] == sorted(e.iteration_s for e in result.top)


# -- properties ---------------------------------------------------------------
sizes = st.sampled_from([(12, 1024, 16), (24, 2048, 16), (32, 4096, 32), (48, 6144, 48)])


@settings(max_examples=25, deadline=None)
@given(small=sizes, large=sizes, tp=st.sampled_from([1, 2, 4, 8]), mb=st.sampled_from([1, 2, 4]))
def test_iteration_time_is_monotone_in_model_size(small, large, tp, mb):
    if small > large:
        small, large = large, small
    plan = ParallelPlan(dp=8 // tp, tp=tp, micro_batch=mb, recompute="selective")
    t_small = EST.estimate(TrainingJob(gpt(*small), 64), A100, plan).iteration_s
    t_large = EST.estimate(TrainingJob(gpt(*large), 64), A100, plan).iteration_s
    assert t_small <= t_large


@settings(max_examples=25, deadline=None)
@given(
    zero=st.integers(0, 3),
    recompute=st.sampled_from(["none", "selective", "full"]),
    pp=st.sampled_from([1, 2, 4]),
)
def test_memory_is_monotone_in_micro_batch(zero, recompute, pp):
    job = TrainingJob(gpt(), 128)
    mems = [
        EST.estimate(job, A100, ParallelPlan(dp=8 // pp, pp=pp, micro_batch=mb, zero_stage=zero, recompute=recompute))
        .memory_gib_per_gpu
        for mb in (1, 2, 4, 8)
    ]
    assert mems == sorted(mems)


@settings(max_examples=12, deadline=None)
@given(
    size=sizes,
    gpus=st.sampled_from([8, 16, 32]),
    gpu_type=st.sampled_from(["A100-80GB", "H100", "V100"]),
)
def test_more_gpus_never_slower_than_communication_explains(size, gpus, gpu_type):
    job = TrainingJob(gpt(*size), 256)
    hw = Hardware(gpu_type)
    few = search_plans(job, hw, gpus, choices=Choices(vpp=1), estimator=EST).best
    more = search_plans(job, hw, 2 * gpus, choices=Choices(vpp=1), estimator=EST).best
    if few is None:
        return
    assert more is not None
    parts = dict(more.breakdown)
    communication = parts["tp_comm"] + parts["pp_comm"] + parts["dp_exposed"]
    assert more.iteration_s <= few.iteration_s + communication + 1e-9


def test_hierarchical_zero_shards_within_groups():
    """InternEvo-style: ZeRO state sharded within groups of k ranks costs more
    memory than sharding over all of DP but keeps parameter gathers local."""
    job = TrainingJob(preset("llama2-7b"), 128)
    slow_net = Hardware("A100-80GB", nic_gbps=25.0)  # gathers over the NIC cannot hide behind compute
    whole = EST.estimate(job, slow_net, ParallelPlan(dp=64, micro_batch=1, zero_stage=3, recompute="full"))
    local = EST.estimate(
        job, slow_net, ParallelPlan(dp=64, micro_batch=1, zero_stage=3, recompute="full", zero_shard=8)
    )
    none = EST.estimate(job, slow_net, ParallelPlan(dp=64, micro_batch=1, zero_stage=0, recompute="full"))
    assert whole.memory_gib_per_gpu < local.memory_gib_per_gpu < none.memory_gib_per_gpu
    assert local.iteration_s < whole.iteration_s
    with pytest.raises(PlanError, match="shard"):
        check_plan(job, ParallelPlan(dp=64, zero_stage=1, zero_shard=6), 64)


# -- search fast path -----------------------------------------------------------
@pytest.mark.parametrize("gpus, gpu_type, per_node", [(4, "V100", 4), (8, "V100", 8), (32, "A40", 4)])
def test_search_ranks_exactly_as_full_estimates(gpus, gpu_type, per_node):
    """search_plans prices plans without building Estimates; the ranking, the
    returned estimates and the no-fit reason match pricing every plan in full."""
    from loom.perf.search import _memory_of, candidate_plans, cp_fallback

    job = TrainingJob(preset("llama2-13b"), 256)
    hw = Hardware(gpu_type, gpus_per_node=per_node)
    fresh = Estimator()
    estimates = [fresh.estimate_uncached(job, hw, plan) for plan in candidate_plans(job, hw, gpus)]
    if not any(e.feasible for e in estimates) and cp_fallback(fresh, job, hw, gpus, Choices()):  # cp > 1 tried too
        estimates += [fresh.estimate_uncached(job, hw, plan) for plan in candidate_plans(job, hw, gpus, fallback=True)]
    for estimate in estimates:
        assert Estimator().price(job, hw, estimate.plan) == (
            estimate.iteration_s, estimate.memory_gib_per_gpu, estimate.reason
        )
    feasible = [e for e in estimates if e.feasible]
    feasible.sort(key=lambda e: (round(e.iteration_s, 9), e.plan.zero_stage,
                                 ("none", "selective", "full").index(e.plan.recompute), e.plan.virtual_stages,
                                 e.memory_gib_per_gpu))  # fmt: skip
    result = search_plans(job, hw, gpus, top=3, estimator=Estimator())
    assert result.considered == len(estimates) and result.feasible == len(feasible)
    assert result.top == tuple(feasible[:3]) and result.best == (feasible[0] if feasible else None)
    if not feasible:
        smallest = ""
        for e in estimates:
            if not smallest or e.memory_gib_per_gpu < _memory_of(smallest):
                smallest = e.reason
        assert result.reason.endswith(smallest)
