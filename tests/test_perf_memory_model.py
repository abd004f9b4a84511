"""Issue 22, second increment: the activation-memory model of Korthikanti et al. 2022 (sequence
parallelism, selective / full recomputation, ffn_hidden / SwiGLU / GQA terms, pipeline in-flight
micro-batches, allocator allowance) and the recomputation the plan search then picks.

Hand-computed for a small model: h = 1024, a = 16, s = 512, micro-batch b = 2, so
s·b·h = 2^20 bytes ("sbh") and the score term 5·a·s/h = 40 sbh."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from loom.cli.main import app
from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.paths import shared_traces_dir
from loom.perf import preset
from loom.perf.estimator import Estimator
from loom.perf.fit import load_megatron_table
from loom.perf.inputs import Hardware, TrainingJob
from loom.perf.memory import (
    ACTIVATION_FRAGMENTATION,
    GIB,
    layer_activation_bytes,
    stage_memory_bytes,
)
from loom.perf.model import ModelSpec
from loom.perf.search import Choices, search_plans

runner = CliRunner()
H100 = Hardware("H100")
SBH = 512 * 2 * 1024
assert SBH == 2**20


def small(**kw: object) -> ModelSpec:
    base: dict[str, object] = {"name": "s", "layers": 2, "hidden": 1024, "heads": 16, "seq_len": 512,
                               "vocab": 1000, "bias": False}
    return ModelSpec(**{**base, **kw})  # type: ignore[arg-type]


def job(model: ModelSpec | None = None, *, sp: bool = True, flash: bool = False, batch: int = 2) -> TrainingJob:
    return TrainingJob(model or small(), batch, sequence_parallel=sp, flash_attention=flash)


# -- per layer -----------------------------------------------------------------------
@pytest.mark.parametrize(("sp", "tp", "recompute", "sbh_units"), [
    (False, 1, "none", 34 + 40),            # s·b·h·(34 + 5·a·s/h), no parallelism
    (False, 2, "none", 10 + 24 / 2 + 40 / 2),  # TP without SP: the 10 stays replicated
    (True, 2, "none", (34 + 40) / 2),       # TP + SP: s·b·h/t·(34 + 5·a·s/h)
    (True, 2, "selective", 34 / 2),         # selective drops the attention-score term
    (False, 2, "selective", 10 + 24 / 2),
    (True, 2, "full", 2 / 2),               # full keeps the layer input, 2·s·b·h/t with SP
    (False, 2, "full", 2),
    (True, 1, "none", 34 + 40),             # SP needs TP: nothing to split at t = 1
])
def test_layer_activations_korthikanti_by_hand(sp, tp, recompute, sbh_units):
    assert layer_activation_bytes(job(sp=sp), 2, tp, recompute) == pytest.approx(sbh_units * SBH, rel=1e-12)


def test_flash_attention_has_no_score_term_so_none_equals_selective():
    j = job(flash=True)
    assert layer_activation_bytes(j, 2, 2, "none") == layer_activation_bytes(j, 2, 2, "selective") == 17 * SBH


@pytest.mark.parametrize(("model", "sp", "tp", "sbh_units"), [
    (small(ffn_hidden=2048), False, 1, 10 + 8 + 4 * 2),          # GeLU: 4·f/h (16 at f = 4h)
    (small(mlp="swiglu", ffn_hidden=2816), False, 1, 10 + 8 + 6 * 2.75),  # SwiGLU: 6·f/h = 16.5
    # GQA 4 of 16 heads: Q 2 + out 2 + K,V 4·4/16 = 5; SP with t = 2 halves everything
    (small(mlp="swiglu", ffn_hidden=2816, kv_heads=4), True, 2, (10 + 5 + 16.5) / 2),
])
def test_mlp_and_gqa_terms_by_hand(model, sp, tp, sbh_units):
    assert layer_activation_bytes(job(model, sp=sp, flash=True), 2, tp, "none") == pytest.approx(sbh_units * SBH)


# -- pipeline in flight, allocator allowance ------------------------------------------
@pytest.mark.parametrize(("batch", "vpp", "rank", "in_flight"), [
    (4, 1, 0, 2),        # m = 2 micro-batches < pp = 4: the first stage holds min(pp, m) = 2
    (16, 1, 0, 4),       # m = 8: the first stage holds pp = 4 (1F1B)
    (16, 1, 3, 1),       # the last holds 1
    (16, 2, 0, 4 * (1 + 3 / 8)),  # interleaved: × (1 + (pp − 1)/(pp·v))
])
def test_stage_activations_in_flight_with_the_allocator_allowance(batch, vpp, rank, in_flight):
    j = job(flash=True, batch=batch)
    plan = ParallelPlan(dp=1, tp=2, pp=4, micro_batch=2, virtual_stages=vpp)
    expected = 1e6 * 16 + in_flight * 2 * 17 * SBH * (1 + ACTIVATION_FRAGMENTATION)  # Ψ = 1e6: 16 B each
    assert stage_memory_bytes(j, plan, 1e6, 2, rank, last=False) == pytest.approx(expected, rel=1e-12)
    assert ACTIVATION_FRAGMENTATION == 0.10


def test_sequence_parallel_saves_the_replicated_tensors_and_keeps_tp_communication():
    plan = ParallelPlan(dp=1, tp=2, micro_batch=2, zero_stage=0, recompute="none")
    est = Estimator()
    on, off = (est.estimate(job(sp=sp, flash=True), H100, plan) for sp in (True, False))
    # 2 layers × 1 micro-batch × (10 − 10/2)·sbh, plus the allowance
    assert off.memory_gib_per_gpu - on.memory_gib_per_gpu == pytest.approx(2 * 5 * SBH * 1.1 / GIB)
    # reduce-scatter + all-gather move the all-reduce's bytes on a ring: priced the same
    assert dict(on.breakdown)["tp_comm"] == dict(off.breakdown)["tp_comm"] > 0
    assert on.iteration_s < off.iteration_s  # norms/dropout on s/t tokens per rank


def test_sequence_parallel_flag_is_validated_and_table1_runs_predate_it():
    with pytest.raises(LoomInputError) as info:
        TrainingJob(small(), 2, sequence_parallel="yes")  # type: ignore[arg-type]
    assert info.value.field == "sequence_parallel"
    assert TrainingJob(small(), 2).sequence_parallel
    runs = load_megatron_table(shared_traces_dir().parent / "calibration" / "megatron_lm_table1.csv")
    assert not any(r.job.sequence_parallel for r in runs)


# -- the recomputation the search picks ------------------------------------------------
LLAMA3_70B = ("llama3-70b", 128)  # seq 8192; 64 H100s, tp = 8, pp = 4, dp = 2


@pytest.mark.parametrize("flash", [True, False])
def test_llama3_70b_on_64_h100_needs_no_full_recomputation(flash):
    model, batch = LLAMA3_70B
    j = TrainingJob(preset(model), batch, flash_attention=flash)
    assert j.model.seq_len == 8192
    est = Estimator()
    result = search_plans(j, H100, 64, choices=Choices(tp=8, pp=4, cp=1), estimator=est)  # cp=1: as then
    assert result.best is not None and result.best.plan.recompute != "full"
    # with FlashAttention there are no scores to drop: none fits; unfused, selective is what fits
    assert result.best.plan.recompute == ("none" if flash else "selective")
    selective = est.estimate(j, H100, ParallelPlan(dp=2, tp=8, pp=4, micro_batch=1, zero_stage=1,
                                                   recompute="selective"))
    assert selective.feasible
    # the old memory model (no sequence parallelism) forced full recomputation here
    old = search_plans(TrainingJob(preset(model), batch, flash_attention=flash, sequence_parallel=False), H100, 64,
                       choices=Choices(tp=8, pp=4, cp=1), estimator=est)
    assert old.best is not None and old.best.plan.recompute == "full"


def test_a_small_model_fits_without_recomputation():
    j = TrainingJob(small(layers=4, mlp="swiglu", ffn_hidden=2816, kv_heads=4, tied_embeddings=False), 64)
    best = search_plans(j, H100, 8, estimator=Estimator()).best
    assert best is not None and best.plan.recompute == "none"


def test_cli_no_sequence_parallel_is_what_forces_recomputation():
    args = ["estimate", "--gpu-type", "H100", "--gpus", "64", "--model", "llama3-70b", "--global-batch", "128",
            "--tp", "8", "--pp", "4", "--micro-batch", "1", "--zero", "1", "--recompute", "none", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    on = json.loads(res.stdout)
    res = runner.invoke(app, [*args, "--no-sequence-parallel"])
    off = json.loads(res.stdout)
    assert res.exit_code == 1 and not off["feasible"] and "out of memory" in off["reason"]
    assert off["memory_gib_per_gpu"] > 80 > on["memory_gib_per_gpu"]
