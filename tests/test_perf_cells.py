"""Crius Cells: candidates, stage formation, grid-sampled estimates, pruned tuning."""

from __future__ import annotations

import math

import pytest

from loom.core.plan import ParallelPlan
from loom.perf.cells import (
    Cell,
    build_cells,
    candidate_cells,
    cell_stage_specs,
    compare_with_exhaustive,
    estimate_cell,
    form_stages,
    tune_cell,
)
from loom.perf.estimator import Estimator
from loom.perf.inputs import Hardware, TrainingJob
from loom.perf.model import ModelSpec
from loom.perf.presets import preset

A100 = Hardware("A100-80GB")
V100 = Hardware("V100", gpus_per_node=16)
SMALL = ModelSpec(name="t", layers=8, hidden=1024, heads=16, seq_len=1024, vocab=32000)


@pytest.fixture(scope="module")
def est() -> Estimator:
    return Estimator()


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def test_candidate_cells_counts_and_stages() -> None:
    cells = candidate_cells(8, ["A100-80GB", "V100"], layers=32)
    per_type = {(c.gpus, c.stages) for c in cells if c.gpu_type == "V100"}
    assert per_type == {(4, 1), (4, 2), (4, 4), (8, 1), (8, 2), (8, 4), (8, 8)} | {(16, s) for s in (1, 2, 4, 8, 16)}
    assert len(cells) == 2 * len(per_type)
    odd = candidate_cells(3, ["A100-80GB"], layers=32)  # N/2 = 1.5 is skipped
    assert sorted((c.gpus, c.stages) for c in odd) == [(3, 1), (3, 2), (6, 1), (6, 2), (6, 4)]
    assert max(c.stages for c in candidate_cells(64, ["V100"], layers=6)) == 4  # capped by layers
    assert {c.gpus for c in candidate_cells(1, ["V100"], layers=4)} == {1, 2}


@pytest.mark.parametrize(
    ("model", "gpus", "stages"),
    [(SMALL, 8, 2), (SMALL, 8, 4), (SMALL, 32, 8), (SMALL, 7, 2), (SMALL, 24, 4), (preset("megatron-1.7b"), 16, 4)],
)
def test_form_stages_covers_gpus_and_layers(model: ModelSpec, gpus: int, stages: int) -> None:
    parts = form_stages(TrainingJob(model, 64), gpus, stages)
    assert len(parts) == stages
    assert sum(p.gpus for p in parts) == gpus
    assert sum(p.layers for p in parts) == model.layers
    assert all(p.gpus >= 1 and p.layers >= 1 for p in parts)
    assert parts[0].first and parts[-1].last and not any(p.first for p in parts[1:])
    if _pow2(gpus):
        assert all(_pow2(p.gpus) for p in parts)
    # the logit layer makes the last stage the lightest in layers
    assert parts[-1].layers <= min(p.layers for p in parts[:-1])


def test_form_stages_equal_split_and_logits() -> None:
    llama = TrainingJob(preset("llama2-7b"), 64)
    assert {(p.gpus, p.layers) for p in form_stages(llama, 16, 4)} == {(4, 8)}
    assert {p.gpus for p in form_stages(llama, 24, 4)} == {6}  # not 4/8: balanced → equal split
    small = form_stages(TrainingJob(SMALL, 64), 8, 2)  # logits ≈ 2.2 layers of FLOPs
    assert [p.layers for p in small] == [5, 3]
    with pytest.raises(ValueError):
        form_stages(llama, 2, 4)


def test_estimate_cell_small_model(est: Estimator) -> None:
    job = TrainingJob(SMALL, 64)
    for stages in (1, 2, 4):
        ce = estimate_cell(job, Cell("A100-80GB", 8, stages), A100, est)
        assert ce.estimate is not None and ce.estimate.feasible, ce.reason
        assert len(ce.sides) == stages and set(ce.sides) <= {"dp", "tp"}
        assert 1 <= ce.estimates_used <= 2**stages * 2  # assemblies × (no recompute, full)
        assert ce.estimate.plan.pp == stages and ce.estimate.gpus == 8
        assert ce.tokens_per_s == pytest.approx(job.tokens / ce.estimate.iteration_s)
    with pytest.raises(ValueError):
        estimate_cell(job, Cell("V100", 8, 1), A100, est)


def test_tp_side_needs_one_node_and_dividing_heads(est: Estimator) -> None:
    job = TrainingJob(SMALL, 64)
    wide = estimate_cell(job, Cell("A100-80GB", 16, 1), A100, est)  # 16 > 8 GPUs per node
    assert wide.sides == ("dp",) and wide.estimates_used <= 2
    odd = estimate_cell(TrainingJob(SMALL, 96), Cell("A100-80GB", 6, 1), A100, est)  # 16 heads % 6
    assert odd.sides == ("dp",) and odd.estimates_used <= 2
    indivisible = estimate_cell(job, Cell("A100-80GB", 6, 1), A100, est)  # batch 64 over dp 6
    assert indivisible.estimate is None and "not divisible" in indivisible.reason


@pytest.mark.parametrize(
    ("model", "hw", "gpus", "stages"),
    [
        (SMALL, A100, 8, 2),  # unequal stages: per-stage enumeration
        (SMALL, A100, 16, 4),
        (preset("llama2-7b"), A100, 16, 4),  # equal stages: candidate_plans
        (preset("llama2-7b"), V100, 8, 2),
        (preset("megatron-1.7b"), V100, 8, 4),
    ],
)
def test_pruned_tuning_never_beats_exhaustive(est: Estimator, model: ModelSpec, hw: Hardware, gpus: int, stages: int) -> None:
    job = TrainingJob(model, 64)
    cmp = compare_with_exhaustive(job, Cell(hw.gpu_type, gpus, stages), hw, est)
    assert 0 < cmp.tuned_ratio <= 1 + 1e-9
    assert 0 < cmp.cell_throughput_ratio
    assert cmp.estimates_cell < cmp.estimates_pruned < cmp.estimates_exhaustive


def test_tuned_plan_is_at_least_the_cells_for_uniform_sides(est: Estimator) -> None:
    job = TrainingJob(preset("llama2-7b"), 64)
    ce = estimate_cell(job, Cell("A100-80GB", 16, 4), A100, est)
    assert len(set(ce.sides)) == 1
    tuned = tune_cell(job, ce, A100, est)
    assert tuned.estimate is not None and tuned.tokens_per_s >= ce.tokens_per_s * (1 - 1e-9)


def test_build_cells_sorted_and_covering(est: Estimator) -> None:
    job = TrainingJob(SMALL, 64)
    cells = build_cells(job, 8, {"A100-80GB": A100, "V100": V100}, est)
    assert {c.cell.gpus for c in cells} == {4, 8, 16}
    assert {c.cell.gpu_type for c in cells} == {"A100-80GB", "V100"}
    assert len(cells) == len(candidate_cells(8, ["A100-80GB", "V100"], SMALL.layers))
    feasible = [c.tokens_per_s for c in cells if c.estimate is not None]
    assert feasible == sorted(feasible, reverse=True)
    seen_infeasible = False
    for c in cells:
        seen_infeasible |= c.estimate is None
        assert not (seen_infeasible and c.estimate is not None)


def test_too_few_gpus_is_infeasible_with_reason(est: Estimator) -> None:
    job = TrainingJob(preset("llama2-70b"), 64)
    for stages in (1, 2, 4):
        ce = estimate_cell(job, Cell("V100", 4, stages), V100, est)
        assert ce.estimate is None and ce.sides == ()
        assert "out of memory" in ce.reason
        assert tune_cell(job, ce, V100, est).estimate is None
    assert math.isnan(compare_with_exhaustive(job, Cell("V100", 4, 2), V100, est).tuned_ratio)


def test_mixed_gpu_type_stages(est: Estimator) -> None:
    job = TrainingJob(SMALL, 64)
    parts = form_stages(job, 8, 2)
    layouts = [(p.gpus, 1) for p in parts]
    plan = ParallelPlan(dp=4, tp=1, pp=2, micro_batch=1, zero_stage=1)
    mixed = est.estimate_stages(job, cell_stage_specs(parts, layouts, [A100, V100]), plan)
    fast = est.estimate_stages(job, cell_stage_specs(parts, layouts, A100), plan)
    slow = est.estimate_stages(job, cell_stage_specs(parts, layouts, V100), plan)
    assert mixed.gpu_type == "A100-80GB+V100" and mixed.gpus == 8
    assert fast.iteration_s < mixed.iteration_s <= slow.iteration_s * (1 + 1e-9)
