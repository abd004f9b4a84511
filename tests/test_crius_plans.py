"""Crius runs what it plans (issue 23): tuned Cell plans on every decision, moves that carry
them, growth onto larger counts of other GPU types, damped regrowth, running while profiling."""

from __future__ import annotations

import pytest

from loom.core.decisions import Migrate, Resize, Start
from loom.perf.inputs import Hardware, estimator_job
from loom.perf.search import Choices, fastest_plan
from loom.placement.best_fit import BestFit
from loom.policies.crius import Crius
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.workload.job import JobSpec

BOTH = ("V100", "A100-80GB")


def model_job(jid: str, t: float, gpus: int, gpu_type: str = "A100-80GB", types: tuple[str, ...] | None = None,
              iterations: int = 20000) -> JobSpec:
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, gpu_type=gpu_type, gpu_types=types or (gpu_type,),
                   model="bert__760M", batch_size=128, iterations=iterations)


def blocker(t: float = 0.0, duration: float = 3000.0) -> JobSpec:
    """Every A100 of `hetero` for `duration` s (no model: trace semantics)."""
    return JobSpec(job_id="blocker", submit_time=t, gpus=16, duration=duration, gpu_type="A100-80GB",
                   gpu_types=("A100-80GB",))


def run(hetero, specs, **params):
    crius = Crius(profiling_s_per_cell=0.0, **params)
    return crius, Simulation(hetero, specs, crius, BestFit(), EstimatorSpeed()).run()


def test_start_runs_the_tuned_plan_not_the_cells_sample(hetero):
    crius, result = run(hetero, [model_job("a", 0.0, 8)], max_scale=1)
    start = next(d for _, d in result.decisions if isinstance(d, Start))
    tuned = crius.book_for(hetero).tuned(result.jobs[0], "A100-80GB", 8)
    assert start.plan == tuned.plan and "tuned in" in start.reason
    assert tuned.iteration_s <= tuned.sampled_s  # tuning inside the Cell never loses to its sample
    tj, _ = estimator_job("bert__760M", 128, 8)
    best = fastest_plan(tj, Hardware("A100-80GB", 8), 8, choices=Choices(vpp=1))
    assert best is not None and tuned.iteration_s <= best.iteration_s * 1.02  # within 2% of the best plan
    speed = EstimatorSpeed()
    job = result.jobs[0]
    job.plan, job.allocation = start.plan, start.allocation
    assert speed.plan_quality(job, start.allocation, hetero) >= 0.98


def test_a_type_move_carries_a_plan_tuned_for_the_new_gpus(hetero):
    crius, result = run(hetero, [blocker(), model_job("v", 10.0, 4, "V100", BOTH)], grow_other_types=False)
    moves = [d for _, d in result.decisions if isinstance(d, (Migrate, Resize)) and d.job_id == "v"]
    assert moves, "v should move to the A100s once the blocker ends"
    move = moves[-1]
    v = next(j for j in result.jobs if j.job_id == "v")
    gpu_type = hetero.gpu_types[int(hetero.node_type[move.allocation.nodes[0]])]
    assert gpu_type == "A100-80GB" and move.allocation.total <= 8  # no larger than max(current, N)
    assert move.plan is not None and move.plan == crius.book_for(hetero).tuned(v, gpu_type, move.allocation.total).plan
    assert "tuned in" in move.reason


def test_growth_onto_a_larger_count_of_another_type(hetero):
    _, narrow = run(hetero, [blocker(), model_job("v", 10.0, 4, "V100", BOTH)], grow_other_types=False)
    _, wide = run(hetero, [blocker(), model_job("v", 10.0, 4, "V100", BOTH)])
    move = [d for _, d in wide.decisions if isinstance(d, Resize) and d.job_id == "v"][-1]
    assert move.allocation.total == 16 and "better GPU type" in move.reason  # 4N on the A100s
    end = {r: next(j.end_time for j in res.jobs if j.job_id == "v") for r, res in (("n", narrow), ("w", wide))}
    assert end["w"] < end["n"]


def test_regrowth_after_making_room_is_held_and_counted(hetero):
    specs = [model_job("a", 0.0, 8, iterations=400000), model_job("b", 1000.0, 8, iterations=2000)]
    free, result_free = run(hetero, specs, regrow_hold_s=0.0)
    held, result_held = run(hetero, specs, regrow_hold_s=1e7)

    def a_sizes(result):
        return [d.allocation.total for _, d in result.decisions if isinstance(d, Resize) and d.job_id == "a"]
    assert a_sizes(result_free)[:2] == [8, 16] and free.summary_stats()["oscillations"] == 1
    assert a_sizes(result_held) == [8] and held.summary_stats()["oscillations"] == 0
    assert held.summary_stats()["regrowths_held"] > 0


def test_running_while_profiling_starts_as_submitted_then_grows(hetero):
    crius = Crius(profiling_s_per_cell=100.0, run_while_profiling=True)
    result = Simulation(hetero, [model_job("a", 0.0, 4, iterations=200000)], crius, BestFit(), EstimatorSpeed()).run()
    start_t, start = next((t, d) for t, d in result.decisions if isinstance(d, Start))
    delay = crius.profiling_delay_s["a"]
    assert start_t == 0.0 and start.allocation.total == 4 and "while profiling" in start.reason
    assert start.plan is not None and start.plan.tp == start.plan.pp == 1  # as submitted: data-parallel
    cells = crius.book_for(hetero).of(result.jobs[0])
    grows = [(t, d) for t, d in result.decisions if isinstance(d, Resize)]
    assert grows and min(t for t, _ in grows) >= cells.admit_delay_s  # nothing moves before its Cells are known
    for t, d in grows:  # each growth to an option whose Cells are profiled by then
        assert t >= cells.ready_at[("A100-80GB", d.allocation.total)] - 1e-6
    assert delay == cells.delay_s
    assert crius.summary_stats()["profiling_starts"] == 1


@pytest.mark.parametrize("params", [{"tune_cells": -1}, {"regrow_hold_s": -1.0}, {"grow_other_types": "no"},
                                    {"run_while_profiling": 2}])
def test_bad_new_params(params):
    from loom.errors import LoomInputError
    with pytest.raises(LoomInputError):
        Crius(**params)


def test_profiles_are_reused_across_jobs_of_the_same_shape(hetero):
    specs = [model_job("a", 0.0, 4), model_job("b", 50.0, 4), model_job("c", 5000.0, 4), model_job("d", 100.0, 8)]
    crius = Crius(profiling_s_per_cell=20.0)
    Simulation(hetero, specs, crius, BestFit(), EstimatorSpeed()).run()
    delay = crius.profiling_delay_s
    assert delay["a"] > 50.0
    assert delay["b"] == pytest.approx(delay["a"] - 50.0)  # waits for a's profile, profiles nothing new
    assert delay["c"] == 0.0  # profiled long ago
    assert 0.0 < delay["d"] < delay["a"]  # shares a's Cells at 4, 8 and 16 GPUs, profiles its 32-GPU ones
    alone = Crius(profiling_s_per_cell=20.0, reuse_profiles=False)
    Simulation(hetero, specs, alone, BestFit(), EstimatorSpeed()).run()
    assert alone.profiling_delay_s["c"] == alone.profiling_delay_s["a"] == delay["a"]


def test_admission_waits_only_for_the_cells_it_considers(hetero):
    crius = Crius(profiling_s_per_cell=20.0, run_while_profiling=False, max_scale=4)
    result = Simulation(hetero, [model_job("a", 0.0, 4, iterations=200000)], crius, BestFit(), EstimatorSpeed()).run()
    cells = crius.book_for(hetero).of(result.jobs[0])
    assert 0.0 < cells.admit_delay_s < cells.delay_s  # the 8- and 16-GPU Cells are profiled last
    start_t, start = next((t, d) for t, d in result.decisions if isinstance(d, Start))
    assert start_t == pytest.approx(cells.admit_delay_s) and start.allocation.total <= 4  # no growth yet
    grow_t, grow = next((t, d) for t, d in result.decisions if isinstance(d, Resize))
    # a Timer wakes Crius when a larger option's Cells are known (fewest GPUs first)
    assert grow_t == pytest.approx(cells.ready_at[("A100-80GB", grow.allocation.total)])
    assert grow_t < cells.delay_s


def test_growth_must_save_more_than_its_restart(hetero):
    specs = [blocker(), model_job("v", 10.0, 4, "V100", BOTH)]
    _, cheap = run(hetero, specs, min_remaining_factor=0.0, restart_delay_s=30.0)
    _, dear = run(hetero, specs, min_remaining_factor=0.0, restart_delay_s=1e6)
    assert any(isinstance(d, (Resize, Migrate)) for _, d in cheap.decisions)
    assert not any(isinstance(d, (Resize, Migrate)) for _, d in dear.decisions)  # a move would cost more
