"""Issue 22 parallelism: context parallelism, expert parallelism / MoE, ZeRO-3 prefetch,
and the pinned prices of dense plans (cp = ep = 1) that these must leave alone."""

from __future__ import annotations

import pytest

from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.perf import preset
from loom.perf.calibration import Calibration
from loom.perf.comm import GroupShape
from loom.perf.context import kv_chunk_bytes, ring_group, ring_passes
from loom.perf.estimator import Estimator, uniform_stages
from loom.perf.inputs import Hardware, PlanError, TrainingJob, check_plan
from loom.perf.memory import layer_activation_bytes
from loom.perf.model import ModelSpec
from loom.perf.moe import ep_group, expert_params_per_layer
from loom.perf.search import (
    Choices,
    any_plan_fits,
    candidate_plans,
    fastest_plan,
    search_plans,
)
from loom.perf.sync import zero3_exposed
from loom.perf.work import stage_work

# An explicit calibration, so the pinned prices below do not move when the bundled one is refitted.
CAL = Calibration(gemm_efficiency=0.7, link_efficiency=0.7, memory_efficiency=0.8, half_bw_intra_mb=8.0,
                  half_bw_inter_mb=64.0, half_bw_p2p_mb=2.0, latency_intra_us=10.0, latency_inter_us=20.0,
                  minipod_loss_collective=0.17, minipod_loss_p2p=0.7, saturate_minipods=8, memory_reserve_gib=2.5)
EST = Estimator(CAL)
H100 = Hardware("H100")


def breakdown(estimate) -> dict[str, float]:
    return dict(estimate.breakdown)


# -- dense plans price exactly as before context and expert parallelism -------------------
@pytest.mark.parametrize(("name", "batch", "gpu", "plan", "iteration_s", "memory_gib"), [
    ("llama3-8b", 64, "H100", ParallelPlan(dp=8, tp=2, micro_batch=1, zero_stage=1),
     3.4022903323471634, 44.67206859588623),
    ("gpt3-175b", 128, "A100-80GB", ParallelPlan(dp=2, tp=8, pp=8, micro_batch=1, virtual_stages=3, recompute="full"),
     17.508832043894696, 42.631109619140624),
    ("llama2-70b", 64, "H100", ParallelPlan(dp=4, tp=4, pp=4, micro_batch=2, zero_stage=2, recompute="selective"),
     4.665586517125793, 71.06267547607422),
    ("llama3-405b", 64, "H100", ParallelPlan(dp=1, tp=8, pp=16, micro_batch=1), 24.226940706394565, 117.10986328125),
])
def test_dense_plans_price_bit_identically_to_before_cp_and_ep(name, batch, gpu, plan, iteration_s, memory_gib):
    """Values from the estimator before issue 22's CP/EP increment (commit 6da9e46), same calibration."""
    estimate = EST.estimate(TrainingJob(preset(name), batch), Hardware(gpu), plan)
    assert (estimate.iteration_s, estimate.memory_gib_per_gpu) == (iteration_s, memory_gib)
    assert set(breakdown(estimate)) == {"compute", "tp_comm", "pp_comm", "bubble", "dp_exposed", "optimizer"}
    assert estimate.as_dict()["plan"]["cp"] == 1 and estimate.as_dict()["plan"]["ep"] == 1


# -- context parallelism -----------------------------------------------------------------
LLAMA8 = TrainingJob(preset("llama3-8b"), 64)


def test_cp_counts_gpus_and_splits_activations_and_compute_per_rank():
    plan = ParallelPlan(dp=2, tp=2, cp=4, micro_batch=1)
    assert plan.world_size == 16 and str(plan) == "dp2·tp2·pp1·cp4"
    base = EST.estimate(LLAMA8, H100, ParallelPlan(dp=8, tp=2, micro_batch=1))
    cp = EST.estimate(LLAMA8, H100, plan)
    assert cp.gpus == 16
    # activations per layer and rank: s/cp tokens
    assert layer_activation_bytes(LLAMA8, 1, 2, "none", cp=4) == pytest.approx(
        layer_activation_bytes(LLAMA8, 1, 2, "none") / 4)
    # per micro-batch compute / cp, 4× the micro-batches (dp 8 → 2): the same total compute
    assert breakdown(cp)["compute"] == pytest.approx(breakdown(base)["compute"], rel=1e-12)
    assert cp.memory_gib_per_gpu < base.memory_gib_per_gpu
    assert cp.as_dict()["plan"]["cp"] == 4


def test_ring_attention_inside_a_node_hides_behind_attention_but_crossing_nodes_shows():
    """tp·cp ≤ 8: NVLink hops hide under the block attention; tp·cp = 32: each hop is a NIC send."""
    inside = EST.estimate(LLAMA8, H100, ParallelPlan(dp=4, tp=2, cp=4))
    across = EST.estimate(LLAMA8, H100, ParallelPlan(dp=1, tp=8, cp=4, micro_batch=1))
    assert breakdown(inside)["cp_comm"] < breakdown(across)["cp_comm"]
    assert breakdown(across)["cp_comm"] > 0.0
    # the exposed part never exceeds the whole ring: layers × passes × (cp − 1) sends
    stage = uniform_stages(LLAMA8, H100, ParallelPlan(dp=1, tp=8, cp=4))[0]
    step = EST.comm.send(kv_chunk_bytes(LLAMA8, stage, 1), ring_group(stage), H100.links())
    micro_batches = 64
    assert breakdown(across)["cp_comm"] <= micro_batches * 32 * ring_passes("none") * 3 * step * (1 + 1e-12)


def test_kv_chunk_is_the_ranks_kv_heads_for_s_over_cp_tokens():
    stage = uniform_stages(LLAMA8, H100, ParallelPlan(dp=1, tp=2, cp=4))[0]
    # K and V, s/cp = 2048 tokens, 8 KV heads / tp 2 = 4 heads of 128, bf16
    assert kv_chunk_bytes(LLAMA8, stage, 1) == 2 * 2048 * 4 * 128 * 2
    replicated = uniform_stages(LLAMA8, H100, ParallelPlan(dp=1, tp=16, cp=2))[0]
    assert kv_chunk_bytes(LLAMA8, replicated, 1) == 2 * 4096 * 1 * 128 * 2  # tp > kv_heads: one head each


def test_cp_ranks_shard_zero_state_with_dp():
    """ZeRO-1 shards the optimizer over dp·cp ranks: cp=4, dp=2 holds what dp=8 holds."""
    z1_dp = EST.estimate(LLAMA8, H100, ParallelPlan(dp=8, tp=2, zero_stage=1, recompute="full"))
    z1_cp = EST.estimate(LLAMA8, H100, ParallelPlan(dp=2, tp=2, cp=4, zero_stage=1, recompute="full"))
    z0_cp = EST.estimate(LLAMA8, H100, ParallelPlan(dp=2, tp=2, cp=4, zero_stage=0, recompute="full"))
    assert z1_cp.memory_gib_per_gpu < z1_dp.memory_gib_per_gpu  # same states, activations / 4
    states_saved = 12 * 8.03e9 / 2 * (1 - 1 / 8) / 2**30
    assert z0_cp.memory_gib_per_gpu - z1_cp.memory_gib_per_gpu == pytest.approx(states_saved, rel=0.01)


@pytest.mark.parametrize(("plan", "field", "needle"), [
    (ParallelPlan(dp=1, cp=3), "cp", r"seq_len \(8192\) not divisible by 2·cp = 6"),
    (ParallelPlan(dp=1, cp=0), "cp", "positive integer"),
    (ParallelPlan(dp=2, ep=2), "ep", "needs an MoE model"),
])
def test_cp_and_ep_refusals_name_the_field_and_the_nearest_plan(plan, field, needle):
    with pytest.raises(PlanError, match=needle) as info:
        check_plan(LLAMA8, plan)
    assert info.value.field == field
    assert "nearest" in str(info.value) or "positive" in str(info.value)


def test_cp_refusal_suggests_cp_that_divide_the_sequence():
    with pytest.raises(PlanError, match=r"nearest: cp=2 or cp=4"):
        check_plan(LLAMA8, ParallelPlan(dp=1, cp=3))


def small_gpt() -> ModelSpec:
    return ModelSpec(name="t", layers=8, hidden=1024, heads=16, seq_len=2048, vocab=32000)


def test_gpu_count_must_match_dp_tp_pp_cp():
    with pytest.raises(PlanError, match="dp·tp·pp·cp = 8"):
        check_plan(TrainingJob(small_gpt(), 8), ParallelPlan(dp=2, tp=2, cp=2), gpus=16)


def test_plan_cache_keeps_cp_and_ep(tmp_path):
    from loom.perf.plan_cache import PlanCache

    cache = PlanCache(tmp_path / "plans.sqlite")
    plan = ParallelPlan(dp=4, tp=2, pp=2, micro_batch=1, zero_stage=1, cp=2, ep=4)
    cache.put("k", plan)
    assert PlanCache(tmp_path / "plans.sqlite").get("k") == (True, plan)


# -- MoE presets ---------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "total", "active"), [
    ("mixtral-8x7b", 46.7e9, 12.9e9), ("mixtral-8x22b", 141e9, 39e9), ("deepseek-v3", 671e9, 37e9),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9), ("gpt-oss-120b", 116.8e9, 5.13e9),
])
def test_moe_presets_count_published_total_and_active_params(name, total, active):
    model = preset(name)
    counted_active = model.activated_params()
    if name == "gpt-oss-120b":  # OpenAI's active count leaves out the input embedding (a lookup)
        counted_active -= model.vocab * model.hidden
    assert model.total_params() == pytest.approx(total, rel=0.01)
    assert counted_active == pytest.approx(active, rel=0.02)


def test_head_dim_shared_experts_and_first_dense_layers_are_counted_by_hand():
    m = ModelSpec(name="m", layers=4, hidden=64, heads=4, head_dim=32, kv_heads=2, ffn_hidden=256,
                  expert_ffn_hidden=32, experts=8, top_k=2, shared_experts=1, first_dense_layers=1, seq_len=64,
                  vocab=100, mlp="swiglu", bias=False, norm="rmsnorm", position="rope", tied_embeddings=False)
    assert (m.attention_width, m.moe_layers, m.dense_layers) == (128, 3, 1)
    attention = 2 * 64 * 128 + 2 * 64 * 64
    dense_layer = attention + 3 * 64 * 256 + 2 * 64
    moe_layer = attention + (8 + 1) * 3 * 64 * 32 + 64 * 8 + 2 * 64
    assert m.total_params() == 2 * 100 * 64 + 64 + dense_layer + 3 * moe_layer
    assert m.activated_params() == m.total_params() - 3 * (8 - 2) * 3 * 64 * 32
    with pytest.raises(LoomInputError) as info:
        ModelSpec(name="d", layers=2, hidden=64, heads=4, seq_len=64, vocab=100, shared_experts=1)
    assert info.value.field == "shared_experts"


# -- expert parallelism --------------------------------------------------------------------
MIXTRAL = TrainingJob(preset("mixtral-8x7b"), 64)


def test_ep_shards_expert_states_and_keeps_compute():
    """ZeRO 0, tp = pp = 1: ep=8 drops 16 bytes × 7/8 of every routed expert parameter; the
    expert GEMMs per rank stay those of top_k experts (balanced routing)."""
    one = EST.estimate(MIXTRAL, H100, ParallelPlan(dp=8, micro_batch=1, recompute="full"))
    sharded = EST.estimate(MIXTRAL, H100, ParallelPlan(dp=8, micro_batch=1, recompute="full", ep=8))
    experts = expert_params_per_layer(MIXTRAL.model) * MIXTRAL.model.layers
    saved = 16.0 * experts * (1 - 1 / 8) / 2**30
    assert one.memory_gib_per_gpu - sharded.memory_gib_per_gpu == pytest.approx(saved, rel=1e-9)
    assert breakdown(one)["compute"] == breakdown(sharded)["compute"]
    assert breakdown(sharded)["ep_comm"] > 0.0 and sharded.as_dict()["plan"]["ep"] == 8


def test_all_to_all_is_four_per_moe_layer_of_tokens_h_topk_bytes():
    plan = ParallelPlan(dp=8, tp=2, micro_batch=1, ep=4, recompute="selective")
    estimate = EST.estimate(MIXTRAL, H100, plan)
    stage = uniform_stages(MIXTRAL, H100, plan)[0]
    m = MIXTRAL.model
    nbytes = 1 * m.seq_len / 2 * m.hidden * m.top_k * 2.0  # s/tp tokens, top_k copies, bf16
    one = EST.comm.all_to_all(nbytes, ep_group(stage), H100.links())
    micro_batches = 64 // 8
    assert breakdown(estimate)["ep_comm"] == pytest.approx(micro_batches * m.layers * 4 * one, rel=1e-12)
    assert ep_group(stage).per_node == 4  # tp·ep = 8: inside a node


def test_all_to_all_by_hand_and_across_nodes():
    comm, links = EST.comm, H100.links()
    inside = comm.all_to_all(64e6, GroupShape(size=8, per_node=8), links)
    peer = 8e6
    bw = links.intra_node_gbps * 1e9 * CAL.link_efficiency * peer / (peer + CAL.half_bw_intra_mb * 1e6)
    assert inside == pytest.approx(CAL.latency_intra_us * 1e-6 + 7 * peer / bw, rel=1e-12)
    across = comm.all_to_all(64e6, GroupShape(size=16, per_node=8), links)
    assert across > inside  # half of each rank's data leaves the node over its NIC share


def test_capacity_factor_pads_expert_compute_and_all_to_all_not_model_flops():
    plan = ParallelPlan(dp=8, micro_batch=1, ep=8, recompute="full")
    balanced = EST.estimate(MIXTRAL, H100, plan)
    padded = EST.estimate(TrainingJob(preset("mixtral-8x7b"), 64, capacity_factor=1.5), H100, plan)
    assert breakdown(padded)["compute"] > breakdown(balanced)["compute"]
    assert 1.15 * breakdown(balanced)["ep_comm"] < breakdown(padded)["ep_comm"] < 1.5 * breakdown(balanced)["ep_comm"]
    model_flops = padded.tflops_per_gpu * padded.iteration_s
    assert model_flops == pytest.approx(balanced.tflops_per_gpu * balanced.iteration_s, rel=1e-12)
    with pytest.raises(LoomInputError) as info:
        TrainingJob(preset("mixtral-8x7b"), 64, capacity_factor=0.5)
    assert info.value.field == "capacity_factor"


@pytest.mark.parametrize(("plan", "needle"), [
    (ParallelPlan(dp=8, ep=3), r"ep=3 must divide experts \(8\) and dp·cp \(8\).*nearest: ep=2 or ep=4"),
    (ParallelPlan(dp=2, ep=4), r"ep=4 must divide experts \(8\) and dp·cp \(2\).*nearest: ep=2"),
])
def test_ep_refusals_name_the_rule_and_the_nearest_ep(plan, needle):
    with pytest.raises(PlanError, match=needle) as info:
        check_plan(MIXTRAL, plan)
    assert info.value.field == "ep"


def test_ep_folds_into_dp_cp_ranks():
    check_plan(MIXTRAL, ParallelPlan(dp=2, cp=2, ep=4), gpus=4)  # ep spans dp·cp = 4: no extra GPUs


# -- ZeRO-3 prefetch -----------------------------------------------------------------------
def test_zero3_prefetch_exposes_each_pass_excess_only():
    assert zero3_exposed(compute=3.0, backward=2.0, forward_gathers=0.5, backward_gathers=1.5) == 0.0
    # the forward pass has a third of the compute to hide its gathers behind: 2 − 1 shows
    assert zero3_exposed(compute=3.0, backward=2.0, forward_gathers=2.0, backward_gathers=1.0) == 1.0
    assert zero3_exposed(compute=3.0, backward=2.0, forward_gathers=2.0, backward_gathers=3.0) == 2.0


def test_zero3_memory_holds_two_gathered_layers():
    job = TrainingJob(small_gpt(), 64)
    z2 = EST.estimate(job, H100, ParallelPlan(dp=8, zero_stage=2))
    z3 = EST.estimate(job, H100, ParallelPlan(dp=8, zero_stage=3))
    psi = job.model.total_params()  # one stage: every parameter
    weights_saved = 2.0 * psi * (1 - 1 / 8)
    buffer = 2.0 * 2.0 * psi / job.model.layers * (1 - 1 / 8)
    assert z2.memory_gib_per_gpu - z3.memory_gib_per_gpu == pytest.approx((weights_saved - buffer) / 2**30, rel=1e-9)


# -- plan search over cp and ep ------------------------------------------------------------
def test_search_tries_cp_for_long_sequences_only():
    long = {(p.cp, p.ep) for p in candidate_plans(LLAMA8, H100, 16, Choices(zero=1, recompute="none"))}
    assert {cp for cp, _ in long} == {1, 2, 4, 8} and {ep for _, ep in long} == {1}
    short = TrainingJob(preset("llama2-7b"), 64)  # seq 4096, dense: exactly the plans searched before cp and ep
    assert {(p.cp, p.ep) for p in candidate_plans(short, H100, 16)} == {(1, 1)}


def test_search_falls_back_to_cp_when_memory_forces_it():
    """Unfused attention, no recomputation, tp = 1 on 8 A10s: no cp = 1 plan fits (the scores
    alone), cp = 2 halves the activations and fits. fastest_plan agrees with the full search."""
    job = TrainingJob(small_gpt_4k(), 8, flash_attention=False)
    a10, choices = Hardware("A10"), Choices(recompute="none", tp=1)
    assert not any(EST.fits(job, a10, p) for p in candidate_plans(job, a10, 8, choices))
    full = search_plans(job, a10, 8, choices=choices, top=1, estimator=Estimator(CAL))
    assert full.best is not None and full.best.plan.cp == 2
    assert fastest_plan(job, a10, 8, choices=choices, estimator=Estimator(CAL)) == full.best
    assert any_plan_fits(job, a10, 8, choices=choices, estimator=Estimator(CAL))


def test_search_tries_ep_for_moe_and_agrees_with_branch_and_bound():
    choices = Choices(tp=2, vpp=1, zero=1)
    eps = {p.ep for p in candidate_plans(MIXTRAL, H100, 16, choices)}
    assert eps == {1, 2, 4, 8}
    full = search_plans(MIXTRAL, H100, 16, choices=choices, top=1, estimator=Estimator(CAL))
    assert full.best is not None and full.best.plan.ep > 1  # all experts on every rank do not fit 80 GB
    assert fastest_plan(MIXTRAL, H100, 16, choices=choices, estimator=Estimator(CAL)) == full.best
    pinned = search_plans(MIXTRAL, H100, 16, choices=Choices(tp=2, vpp=1, zero=1, ep=2), top=1,
                          estimator=Estimator(CAL))
    assert pinned.best is None or pinned.best.plan.ep == 2


def small_gpt_4k() -> ModelSpec:
    return ModelSpec(name="t4k", layers=16, hidden=2048, heads=16, seq_len=4096, vocab=32000)


def test_pinning_tp_and_pp_to_1_means_data_parallel_only():
    """The policies' plain-DP checks (written before cp and ep) keep their meaning."""
    dp_only = Choices(tp=1, pp=1, vpp=1)
    assert {(p.cp, p.ep) for p in candidate_plans(MIXTRAL, H100, 8, dp_only)} == {(1, 1)}
    assert {(p.cp, p.ep) for p in candidate_plans(LLAMA8, H100, 8, dp_only)} == {(1, 1)}
    assert {p.ep for p in candidate_plans(MIXTRAL, H100, 8, Choices(tp=1, pp=1, ep=8))} == {8}


# -- FP8 recipes and TP overlap (requested by the H100-era calibration) ------------------
def test_fp8_prices_attention_core_and_lm_head_at_the_bf16_rate():
    hw, plan = H100, ParallelPlan(dp=8, tp=2, micro_batch=1, zero_stage=1)
    bf16 = EST.estimate(LLAMA8, hw, plan)
    fp8 = EST.estimate(TrainingJob(preset("llama3-8b"), 64, precision="fp8"), hw, plan)
    stage = uniform_stages(LLAMA8, hw, plan)[0]
    gemm, traffic, _, kept = stage_work(LLAMA8, stage, 1, "none", LLAMA8.model.matmul_weights_per_token() / 32)
    spec = hw.spec
    rate = {p: spec.peak_tflops(p) * 1e12 * CAL.gemm_fraction(spec.name, p) for p in ("bf16", "fp8")}
    per_mb = (gemm - kept) / rate["fp8"] + kept / rate["bf16"] + traffic / (spec.memory_bw_gbps * 1e9 * CAL.memory_efficiency)
    assert breakdown(fp8)["compute"] == pytest.approx(8 * per_mb, rel=1e-12)
    assert breakdown(fp8)["compute"] < breakdown(bf16)["compute"]
    # attention core (4·b·s²·h per layer, 3 passes) and LM head (2·b·s·h·V, 3 passes), per TP rank
    s, h, v = 8192, 4096, 128256
    assert kept == pytest.approx(3 * (32 * 4 * s * s * h + 2 * s * h * v) / 2, rel=1e-12)


def test_overlap_tp_exposes_only_what_exceeds_the_compute():
    plan = ParallelPlan(dp=2, tp=8, micro_batch=1, zero_stage=1)
    plain = EST.estimate(LLAMA8, H100, plan)
    overlapped = EST.estimate(TrainingJob(preset("llama3-8b"), 64, overlap_tp=True), H100, plan)
    assert breakdown(overlapped)["compute"] == breakdown(plain)["compute"]
    expected = max(0.0, breakdown(plain)["tp_comm"] - breakdown(plain)["compute"])
    assert breakdown(overlapped)["tp_comm"] == pytest.approx(expected, abs=1e-12)
    assert overlapped.iteration_s < plain.iteration_s
    with pytest.raises(LoomInputError) as info:
        TrainingJob(preset("llama3-8b"), 64, overlap_tp="yes")
    assert info.value.field == "overlap_tp"


def test_interleaving_may_count_the_embedding_and_loss_as_layers():
    """Megatron-Core's split for Llama 3.1 405B on pp 8 × vpp 8: (126 + 2) / 64 = 2 layers per
    virtual stage, the first and last one short; priced as the uneven physical split."""
    job = TrainingJob(preset("llama3-405b"), 512)
    plan = ParallelPlan(dp=1, tp=8, pp=8, virtual_stages=8, micro_batch=1, zero_stage=1, recompute="full")
    check_plan(job, plan, 64)
    assert [s.layers for s in uniform_stages(job, H100, plan) for _ in range(s.count)] == [15] + [16] * 6 + [15]
    assert EST.estimate(job, H100, plan).iteration_s > 0
    with pytest.raises(PlanError, match="not divisible by pp·vpp"):  # only with the uneven split
        check_plan(TrainingJob(preset("llama3-405b"), 512, pipeline_split="even"), plan, 64)
