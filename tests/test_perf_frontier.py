"""Issue 22, first increment: GQA/MQA, SwiGLU, tied/untied embeddings, uneven pipeline
stages and the Llama 3 / Qwen 2.5 presets, through the library and the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from loom.cli.main import app
from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.perf import flops_per_iteration, forward_flops, preset
from loom.perf.estimator import Estimator, StageSpec, uniform_stages
from loom.perf.inputs import Hardware, PlanError, TrainingJob, check_plan
from loom.perf.memory import layer_activation_bytes
from loom.perf.model import ModelSpec

runner = CliRunner()
EST = Estimator()
H100 = Hardware("H100")


def small(**kw: object) -> ModelSpec:
    base: dict[str, object] = {"name": "s", "layers": 2, "hidden": 1024, "heads": 16, "seq_len": 128,
                               "vocab": 1000, "bias": False}
    return ModelSpec(**{**base, **kw})  # type: ignore[arg-type]


# -- grouped-query attention ------------------------------------------------------
def test_gqa_scales_kv_projection_params_and_flops_by_hand():
    mha, gqa, mqa = small(), small(kv_heads=4), small(kv_heads=1)
    # K and V: 2·h·(kv·d) instead of 2·h·h; h = 1024, d = 64
    assert mha.attention_params() == 4 * 1024 * 1024
    assert gqa.attention_params() == 2 * 1024 * 1024 + 2 * 1024 * 256
    assert mqa.attention_params() == 2 * 1024 * 1024 + 2 * 1024 * 64
    saved = 2 * (2 * 1024 * 1024 - 2 * 1024 * 256)  # two layers, K and V
    assert mha.total_params() - gqa.total_params() == saved == 3_145_728
    tokens = 4 * 128
    assert forward_flops(mha, 4) - forward_flops(gqa, 4) == 2 * tokens * saved
    assert flops_per_iteration(mha, 4) - flops_per_iteration(gqa, 4) == 3 * 2 * tokens * saved


def test_default_kv_heads_is_multi_head_attention_bit_identical():
    job = TrainingJob(small(), 16)
    same = TrainingJob(small(kv_heads=16), 16)
    plan = ParallelPlan(dp=2, tp=2, pp=2, micro_batch=2)
    assert EST.estimate_uncached(job, H100, plan).iteration_s == EST.estimate_uncached(same, H100, plan).iteration_s


def test_gqa_shrinks_kv_activations_korthikanti():
    sbh = 128 * 2 * 1024
    mha = layer_activation_bytes(TrainingJob(small(), 8), 2, 2, "none", sequence_parallel=False)
    gqa = layer_activation_bytes(TrainingJob(small(kv_heads=4), 8), 2, 2, "none", sequence_parallel=False)
    assert mha == sbh * (10 + 24 / 2)
    assert mha - gqa == pytest.approx(sbh * 4 / 2 * (1 - 4 / 16))  # K and V: 4sbh/t → 4sbh/t · g/a
    # tp = 8 > kv_heads = 4: each rank keeps one K and one V head (replicated)
    replicated = layer_activation_bytes(TrainingJob(small(kv_heads=4), 8), 2, 8, "none", sequence_parallel=False)
    assert replicated == pytest.approx(sbh * (10 + 20 / 8) + 4 * 128 * 2 * 64)


def test_gqa_estimate_is_cheaper_than_mha():
    plan = ParallelPlan(dp=4, tp=2, micro_batch=2)
    mha = EST.estimate(TrainingJob(small(layers=8), 64), H100, plan)
    gqa = EST.estimate(TrainingJob(small(layers=8, kv_heads=2), 64), H100, plan)
    assert gqa.iteration_s < mha.iteration_s and gqa.memory_gib_per_gpu < mha.memory_gib_per_gpu


def test_tp_must_split_or_replicate_kv_heads():
    model = ModelSpec(name="kv6", layers=4, hidden=1536, heads=24, kv_heads=6, seq_len=128, vocab=1000)
    with pytest.raises(PlanError) as info:
        check_plan(TrainingJob(model, 8), ParallelPlan(dp=2, tp=4), 8)
    assert info.value.field == "tp"
    assert "kv_heads (6)" in info.value.message and "replicates" in info.value.message
    assert "nearest: tp=3 or tp=6" in info.value.message
    for tp in (2, 3, 6, 12):  # 6 % tp == 0 or tp % 6 == 0
        check_plan(TrainingJob(model, 24), ParallelPlan(dp=24 // tp, tp=tp), 24)


def test_replicated_kv_heads_cost_more_than_their_share():
    gqa = small(layers=4, kv_heads=2)
    assert gqa.kv_replicated_weights(2) == 0
    assert gqa.kv_replicated_weights(8) == 2 * 1024 * 64 * (8 - 2) // 8
    job = TrainingJob(gqa, 8)
    plain = EST.estimate(job, H100, ParallelPlan(dp=1, tp=8, micro_batch=8))
    mha = EST.estimate(TrainingJob(small(layers=4), 8), H100, ParallelPlan(dp=1, tp=8, micro_batch=8))
    assert plain.feasible and plain.iteration_s < mha.iteration_s


# -- gated FFN and embeddings --------------------------------------------------------
def test_swiglu_has_three_ffn_matrices():
    gelu, swiglu = small(ffn_hidden=2816), small(ffn_hidden=2816, mlp="swiglu")
    assert swiglu.ffn_type == "swiglu" and small().ffn_type == "gelu" and small().ffn_hidden == 4 * 1024
    assert gelu.mlp_params() == 2 * 1024 * 2816 and swiglu.mlp_params() == 3 * 1024 * 2816
    assert forward_flops(swiglu, 1) - forward_flops(gelu, 1) == 2 * 128 * 2 * 1024 * 2816


@pytest.mark.parametrize(("name", "published"), [
    ("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405e9),
    ("qwen2.5-7b", 7.61e9), ("qwen2.5-72b", 72.7e9),
])
def test_frontier_presets_match_published_parameter_counts(name, published):
    model = preset(name)
    assert model.kv_heads < model.heads and model.ffn_type == "swiglu" and not model.tied_embeddings
    assert model.total_params() == pytest.approx(published, rel=0.01)


def test_untied_embeddings_add_the_lm_head_params_not_flops():
    tied, untied = small(), small(tied_embeddings=False)
    assert untied.total_params() - tied.total_params() == 1000 * 1024
    assert forward_flops(untied, 2) == forward_flops(tied, 2)  # the logit GEMM is counted either way
    plan = ParallelPlan(dp=1)  # one stage (with pp > 1 a tied model keeps an embedding copy on the last stage too)
    a = EST.estimate(TrainingJob(tied, 8), H100, plan)
    b = EST.estimate(TrainingJob(untied, 8), H100, plan)
    assert b.memory_gib_per_gpu > a.memory_gib_per_gpu


# -- uneven pipeline stages ---------------------------------------------------------
def test_405b_on_16_stages_splits_7_8_7():
    job = TrainingJob(preset("llama3-405b"), 1024, pipeline_split="uneven")
    plan = ParallelPlan(dp=8, tp=8, pp=16, micro_batch=1, zero_stage=1, recompute="full")
    check_plan(job, plan, 1024)
    stages = uniform_stages(job, H100, plan)
    assert [(s.layers, s.first, s.last, s.count) for s in stages] == [(7, True, False, 1), (8, False, False, 14),
                                                                       (7, False, True, 1)]
    assert EST.estimate(job, H100, plan).iteration_s > 0


def test_even_split_refusal_suggests_the_nearest_plan():
    job = TrainingJob(preset("llama3-405b"), 1024, pipeline_split="even")
    with pytest.raises(PlanError) as info:
        check_plan(job, ParallelPlan(dp=8, tp=8, pp=16), 1024)
    assert info.value.field == "pp"
    assert "nearest: pp=14 or pp=18" in info.value.message and "uneven" in info.value.message


def test_interleaving_refusal_suggests_vpp_1_or_another_pp():
    job = TrainingJob(preset("llama3-405b"), 1024, pipeline_split="uneven")
    with pytest.raises(PlanError) as info:
        check_plan(job, ParallelPlan(dp=8, tp=8, pp=16, virtual_stages=3), 1024)
    assert info.value.field == "pp"
    assert "nearest: vpp=2 or vpp=4 or pp=14 or pp=21 with vpp=3" in info.value.message


def test_more_stages_than_layers_is_refused():
    with pytest.raises(PlanError, match="every stage needs a layer") as info:
        check_plan(TrainingJob(small(), 8, pipeline_split="uneven"), ParallelPlan(dp=1, pp=4), 4)
    assert info.value.field == "pp"


def test_uneven_split_prices_explicit_stages_and_the_slowest_governs():
    job = TrainingJob(small(layers=9, vocab=1000), 64, pipeline_split="uneven")
    plan = ParallelPlan(dp=1, pp=4, micro_batch=1)
    uniform = EST.estimate(job, H100, plan)
    make = lambda layers, first=False, last=False: StageSpec(H100, 1, 1, layers, first, last)
    explicit = EST.estimate_stages(job, (make(2, first=True), make(2), make(3), make(2, last=True)), plan)
    assert uniform.iteration_s == explicit.iteration_s
    assert uniform.memory_gib_per_gpu == explicit.memory_gib_per_gpu
    # the 3-layer stage is the slowest: the steady state runs m micro-batches at its pace
    alone = EST.estimate_stages(job, (make(3),), ParallelPlan(dp=1, pp=1, micro_batch=1))
    assert dict(uniform.breakdown)["compute"] == pytest.approx(dict(alone.breakdown)["compute"])
    even = EST.estimate(TrainingJob(small(layers=8), 64), H100, plan)  # 2 layers per stage
    assert uniform.iteration_s > even.iteration_s


def test_unknown_pipeline_split_names_the_field():
    with pytest.raises(LoomInputError) as info:
        TrainingJob(small(), 8, pipeline_split="ragged")
    assert info.value.field == "pipeline_split"


# -- CLI -------------------------------------------------------------------------------
CUSTOM = ["--gpu-type", "H100", "--gpus", "8", "--global-batch", "16", "--layers", "4", "--hidden", "1024",
          "--heads", "16", "--seq", "512", "--vocab", "1000"]


def _run(args: list[str]) -> tuple[int, str]:
    res = runner.invoke(app, args)
    return res.exit_code, res.output


def test_cli_custom_gqa_swiglu_model_matches_the_library():
    code, out = _run(["estimate", *CUSTOM, "--kv-heads", "4", "--ffn-type", "swiglu", "--ffn-hidden", "2816",
                      "--untied-embeddings", "--tp", "2", "--micro-batch", "2", "--zero", "1", "--recompute",
                      "none", "--json"])
    assert code == 0, out
    model = ModelSpec(name="custom", layers=4, hidden=1024, heads=16, seq_len=512, vocab=1000, kv_heads=4,
                      mlp="swiglu", ffn_hidden=2816, tied_embeddings=False)
    expected = EST.estimate(TrainingJob(model, 16), H100, ParallelPlan(dp=4, tp=2, micro_batch=2, zero_stage=1))
    assert json.loads(out)["iteration_s"] == expected.iteration_s


def test_cli_llama3_70b_preset_estimates():
    code, out = _run(["estimate", "--gpu-type", "H100", "--gpus", "64", "--model", "llama3-70b",
                      "--global-batch", "64", "--tp", "8", "--pp", "4", "--json"])
    assert code in (0, 1) and json.loads(out)["plan"]["pp"] == 4


def test_cli_405b_on_pp16_splits_unevenly_unless_even_is_asked():
    args = ["estimate", "--gpu-type", "H100", "--gpus", "256", "--model", "llama3-405b", "--global-batch", "64",
            "--tp", "8", "--pp", "16", "--micro-batch", "1", "--recompute", "full", "--zero", "1"]
    code, out = _run([*args, "--pipeline-split", "even"])
    assert code == 2 and "field 'pp'" in out and "pipeline_split='uneven'" in out
    code, out = _run([*args, "--json"])
    assert code == 0 and json.loads(out)["plan"]["pp"] == 16 and json.loads(out)["feasible"]
    assert json.loads(out)["stage_layers"] == [7] + [8] * 14 + [7]


def test_cli_plan_searches_uneven_pipelines():
    code, out = _run(["plan", "--gpu-type", "H100", "--gpus", "8", "--layers", "5", "--hidden", "1024", "--heads",
                      "16", "--seq", "512", "--vocab", "1000", "--global-batch", "16", "--pp", "4", "--tp", "1",
                      "--pipeline-split", "uneven", "--no-cells", "--json"])
    assert code == 0, out
    assert all(p["plan"]["pp"] == 4 for p in json.loads(out)["plans"])


@pytest.mark.parametrize(("extra", "needle"), [
    (["--model", "llama3-8b", "--kv-heads", "4"], "--model cannot be combined with --kv-heads"),
    ([*CUSTOM[6:], "--kv-heads", "5"], "field '--kv-heads'"),
    (["--layers", "4", "--hidden", "1536", "--heads", "24", "--seq", "512", "--vocab", "1000", "--kv-heads", "6",
      "--tp", "4"], "kv_heads must be divisible by tp, or tp by kv_heads"),
])
def test_cli_refusals_name_the_flag(extra, needle):
    code, out = _run(["estimate", "--gpu-type", "H100", "--gpus", "8", "--global-batch", "16", *extra])
    assert code == 2 and needle in out and "Traceback" not in out


@pytest.mark.parametrize(("layers", "gpus", "batch"), [(9, 8, 32), (30, 16, 64), (7, 12, 48)])
def test_fastest_plan_finds_the_full_search_best_with_uneven_stages(layers, gpus, batch):
    from loom.perf.search import fastest_plan, search_plans

    job = TrainingJob(small(layers=layers, hidden=2048, heads=16, kv_heads=4, seq_len=1024, vocab=32000,
                            mlp="swiglu", ffn_hidden=5632, tied_embeddings=False), batch, pipeline_split="uneven")
    full = search_plans(job, H100, gpus, estimator=Estimator())
    fast = fastest_plan(job, H100, gpus, estimator=Estimator())
    assert full.best is not None and fast is not None
    assert fast.plan == full.best.plan and fast.iteration_s == full.best.iteration_s
    even = search_plans(TrainingJob(job.model, batch, pipeline_split="even"), H100, gpus, estimator=Estimator())
    assert full.considered > even.considered  # pp that do not divide the layers are searched too
