"""Branch-and-bound plan search (`fastest_plan`): the same answer as pricing every plan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.perf import preset
from loom.perf.estimator import Estimator
from loom.perf.inputs import Hardware, Placement, PlanError, TrainingJob, check_plan
from loom.perf.presets import preset_names
from loom.perf.search import (
    Choices,
    any_plan_fits,
    candidate_plans,
    fastest_plan,
    search_plans,
)

CHOICES = (Choices(), Choices(vpp=1), Choices(tp=1, pp=1, vpp=1), Choices(zero=1), Choices(recompute="none"))


@st.composite
def searches(draw: st.DrawFn) -> tuple[TrainingJob, Hardware, int, Choices, Placement]:
    model = preset(draw(st.sampled_from(preset_names())))
    gpus = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 16, 32]))
    batch = draw(st.sampled_from([8, 32, 128, 256, 1000]))
    job = TrainingJob(model, -(-batch // gpus) * gpus, overlap_dp=draw(st.booleans()),
                      optimizer_offload=draw(st.booleans()))
    hardware = Hardware(draw(st.sampled_from(["A100-40GB", "V100", "A40", "H100", "A10"])),
                        gpus_per_node=draw(st.sampled_from([4, 8])))
    placement = draw(st.sampled_from([Placement(), Placement(2, 2, 3.0, 1.5), Placement(4, 1, 2.0, 1.0)]))
    return job, hardware, gpus, draw(st.sampled_from(CHOICES)), placement


@settings(max_examples=60, deadline=None)
@given(searches())
def test_fastest_plan_is_the_best_of_a_full_search(case):
    job, hardware, gpus, choices, placement = case
    full = search_plans(job, hardware, gpus, choices=choices, placement=placement, top=1, estimator=Estimator())
    fast = fastest_plan(job, hardware, gpus, choices=choices, placement=placement, estimator=Estimator())
    assert fast == full.best
    assert any_plan_fits(job, hardware, gpus, choices=choices, placement=placement,
                         estimator=Estimator()) == (full.best is not None)
    # or_unfit: when nothing fits, the plan of least iteration time (first among equals)
    unfit = fastest_plan(job, hardware, gpus, choices=choices, placement=placement, estimator=Estimator(),
                         or_unfit=True)
    if full.best is not None:
        assert unfit == full.best
    else:
        est = Estimator()
        every = [est.estimate(job, hardware, plan, placement) for plan in candidate_plans(job, hardware, gpus, choices)
                 if _valid(job, plan, gpus)]
        expected = min(every, key=lambda e: e.iteration_s, default=None)
        assert unfit == expected
        assert unfit is None or not unfit.feasible


@settings(max_examples=60, deadline=None)
@given(searches())
def test_floors_never_exceed_the_priced_time(case):
    """The bounds the search prunes with: a plan's floor is at most its iteration time, the
    bound on its shape (`any_variant`) at most the floor of each of the shape's ZeRO and
    recomputation variants, and `fits` is exactly the estimate's memory verdict."""
    job, hardware, gpus, choices, placement = case
    est = Estimator()
    plans = [p for p in candidate_plans(job, hardware, gpus, choices) if _valid(job, p, gpus)]
    floors = est.floors(job, hardware, plans, placement)
    shape_bound = dict(zip([_shape(p) for p in plans], est.floors(job, hardware, plans, placement, any_variant=True)))
    step = max(1, len(plans) // 300)  # MoE presets (ep searched) have thousands: check an even sample of them
    for plan, floor in list(zip(plans, floors))[::step]:
        estimate = Estimator().estimate(job, hardware, plan, placement)
        assert 0.0 < shape_bound[_shape(plan)] <= floor <= estimate.iteration_s * (1 + 1e-12)
        assert est.fits(job, hardware, plan, placement) == estimate.feasible


def _shape(plan):
    return plan.tp, plan.pp, plan.dp, plan.micro_batch, plan.virtual_stages, plan.cp, plan.ep


def test_fastest_plan_prices_far_fewer_plans_than_a_full_search():
    """What makes it worth having: on a comm-heavy MoE the bound skips nearly every plan."""

    class Counting(Estimator):
        priced = 0

        def price(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            Counting.priced += 1
            return super().price(*args, **kwargs)

    job, hardware = TrainingJob(preset("moe__2.4B"), 256), Hardware("A40", gpus_per_node=8)
    full = search_plans(job, hardware, 32, choices=Choices(vpp=1), estimator=Counting())
    every, Counting.priced = Counting.priced, 0
    assert fastest_plan(job, hardware, 32, choices=Choices(vpp=1), estimator=Counting()) == full.best
    assert every == full.considered and Counting.priced * 10 < every


def test_no_valid_plan_gives_none():
    job = TrainingJob(preset("llama2-7b"), 7)  # batch 7 on 2 GPUs: no data-parallel split divides it
    assert fastest_plan(job, Hardware("A100-40GB"), 2, choices=Choices(tp=1, pp=1), or_unfit=True) is None


def _valid(job: TrainingJob, plan, gpus: int) -> bool:  # type: ignore[no-untyped-def]
    try:
        check_plan(job, plan, gpus)
    except PlanError:
        return False
    return True


@pytest.mark.parametrize("model", ["bert__2.6B", "wide_resnet__2B"])
def test_estimator_speed_uses_the_same_plans(model):
    """The speed model's best plan (now found by branch and bound) is the full search's."""
    from loom.sim.estimator_speed import EstimatorSpeed

    speed = EstimatorSpeed()
    seconds, scale, plan = speed._best(model, 256, "V100", 16, 8)
    full = search_plans(TrainingJob(preset(model), 256), Hardware("V100", gpus_per_node=8), 16,
                        choices=Choices(vpp=1), top=1, estimator=Estimator()).best
    assert full is not None and (seconds, plan) == (full.iteration_s, full.plan) and scale == 1.0
