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
    grows = [t for t, d in result.decisions if isinstance(d, Resize)]
    assert grows and min(grows) >= delay  # nothing moves before its Cells are known
    assert crius.summary_stats()["profiling_starts"] == 1


@pytest.mark.parametrize("params", [{"tune_cells": -1}, {"regrow_hold_s": -1.0}, {"grow_other_types": "no"},
                                    {"run_while_profiling": 2}])
def test_bad_new_params(params):
    from loom.errors import LoomInputError
    with pytest.raises(LoomInputError):
        Crius(**params)
