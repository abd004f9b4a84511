"""One plan rule for every policy (issue 23): decisions carry plans, a plan never outlives its
GPUs, `EstimatorSpeed(plans=...)` switches between "run what you decided" and "everyone gets
the best plan", baselines decide data-parallel plans, Sia pays for profiling, and
`PlanQuality` reports plan speed over job time."""

from __future__ import annotations

import pytest

from loom.core.decisions import Migrate, Resize, Start
from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.placement.best_fit import BestFit
from loom.policies.sia import Sia
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.sim.plan_quality import PlanQuality
from loom.workload.job import JobSpec

SLOW = ParallelPlan(dp=1, tp=1, pp=8, micro_batch=1, zero_stage=1)  # 8 stages of a bert: far from its best


def bert(jid: str = "a", t: float = 0.0, gpus: int = 8, iterations: int = 2000) -> JobSpec:
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, gpu_type="A100-80GB", gpu_types=("A100-80GB", "V100"),
                   model="bert__760M", batch_size=128, iterations=iterations)


class Scripted:
    """Start on 8 A100s with `plan`, then at t=100 migrate to the other A100 node (`move_plan`)."""

    name = "scripted"

    def __init__(self, plan: ParallelPlan | None, move_plan: ParallelPlan | None = None) -> None:
        self.plan, self.move_plan = plan, move_plan

    def schedule(self, ctx):
        from loom.core.decisions import Timer
        from loom.hardware.state import Allocation
        a0, a1 = ctx.topology.node_names.index("a0"), ctx.topology.node_names.index("a1")
        if ctx.pending:
            return [Start("a", Allocation((a0,), (8,)), "scripted start", self.plan), Timer(100.0, "move")]
        job = ctx.running.get("a")
        if job is not None and ctx.now >= 100.0 and job.allocation.nodes == (a0,):
            return [Migrate("a", Allocation((a1,), (8,)), "scripted move", 0.0, self.move_plan)]
        return []


def run(hetero, policy, **speed):
    quality = PlanQuality(EstimatorSpeed(**speed))
    result = Simulation(hetero, [bert()], policy, BestFit(), quality).run()
    return result, quality.job_time_average(result.decisions, result.jobs)


def test_decided_plan_is_priced_and_best_rule_ignores_it(hetero):
    slow, q_slow = run(hetero, Scripted(SLOW, SLOW))
    best, q_best = run(hetero, Scripted(SLOW, SLOW), plans="best")
    none, q_none = run(hetero, Scripted(None, None))
    assert slow.jobs[0].end_time > best.jobs[0].end_time == pytest.approx(none.jobs[0].end_time)
    assert q_slow < 0.9 and q_best == q_none == 1.0


def test_a_move_without_a_plan_drops_the_old_one(hetero):
    kept, q_kept = run(hetero, Scripted(SLOW, SLOW))
    dropped, q_dropped = run(hetero, Scripted(SLOW, None))
    assert dropped.jobs[0].plan is None and kept.jobs[0].plan == SLOW
    assert dropped.jobs[0].end_time < kept.jobs[0].end_time  # after the move it runs the best plan
    assert q_kept < q_dropped < 1.0  # slow for 100 s, then the best plan


def test_bad_plan_rule():
    with pytest.raises(LoomInputError) as info:
        EstimatorSpeed(plans="oracle")
    assert "plans" in str(info.value.field)


def test_sia_runs_data_parallel_plans_and_pays_profiling(hetero):
    sia = Sia(profiling_s=20.0)
    result = Simulation(hetero, [bert(gpus=4), bert("b", 5.0, 4)], sia, BestFit(), EstimatorSpeed()).run()
    starts = [(t, d) for t, d in result.decisions if isinstance(d, Start)]
    assert starts and starts[0][0] == 20.0  # an idle cluster opens a round once the job is profiled
    moves = [d for _, d in result.decisions if isinstance(d, (Start, Migrate, Resize))]
    assert all(d.plan is not None and d.plan.tp == d.plan.pp == 1 and d.plan.world_size == d.allocation.total
               for d in moves)
    assert all("runs data-parallel" in d.reason for d in moves)
    free = Simulation(hetero, [bert(gpus=4)], Sia(profiling_s=0.0), BestFit(), EstimatorSpeed()).run()
    assert next(t for t, d in free.decisions if isinstance(d, Start)) == 0.0


def test_sia_reuses_a_profile_of_the_same_shape(hetero):
    sia = Sia(profiling_s=20.0, round_s=10.0)
    specs = [bert(gpus=4), bert("b", 300.0, 4), bert("c", 300.0, 4)]
    specs[2] = JobSpec(job_id="c", submit_time=300.0, gpus=4, gpu_type="A100-80GB", model="bert__1.3B",
                       batch_size=128, iterations=2000)
    result = Simulation(hetero, specs, sia, BestFit(), EstimatorSpeed()).run()
    first = {d.job_id: t for t, d in reversed(result.decisions) if isinstance(d, Start)}
    assert first["a"] == 20.0 and first["b"] == 300.0  # b's shape was profiled for a
    assert first["c"] >= 320.0  # a new shape is profiled first
