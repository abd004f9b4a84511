"""The `sla` policy (Singularity-style tiers) and the SLA-attainment metric."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import job

from loom.core.decisions import Preempt, Resize, Start, Timer
from loom.core.jobs import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.errors import LoomInputError
from loom.policies.sla import SlaTiers
from loom.report.sla import sla_attainment
from loom.sim.engine import Simulation
from loom.workload.job import JobClass
from loom.workload.tiers import TierRule, min_devices, valid_sizes


def run(topo, specs, policy: SlaTiers):
    return Simulation(topo, specs, policy, PLACERS.get("best-fit")()).run()


def held_over_time(result) -> dict[str, list[tuple[float, int]]]:
    out: dict[str, list[tuple[float, int]]] = {}
    for t, d in result.decisions:
        if isinstance(d, Preempt):
            out.setdefault(d.job_id, []).append((t, 0))
        elif hasattr(d, "allocation"):
            out.setdefault(d.job_id, []).append((t, d.allocation.total))
    return out


def rows(result, rule: TierRule) -> dict[str, dict]:
    return {r["tier"]: r for r in sla_attainment(result, rule)}


def surge():
    """Basic jobs fill the 64-GPU cluster, a standard job runs, then premium jobs arrive."""
    specs = [job(f"b{i}", i, 16, 1000, priority=0) for i in range(2)]
    specs += [job("b8", 2, 8, 1000, priority=0), job("b8x", 3, 8, 1000, priority=0)]
    specs += [job("s0", 5, 16, 1000, priority=1)]
    specs += [job("p0", 100, 32, 200, priority=2), job("p1", 110, 16, 200, priority=2)]
    return specs


def test_registered_and_defaults():
    assert POLICIES.get("sla") is SlaTiers
    p = SlaTiers()
    assert p.rule.fractions == {"premium": 1.0, "standard": 0.5, "basic": 0.0}
    assert p.min_resize_interval_s == 300


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"premium": 1.5}, "policy.params.premium"),
    ({"standard": -0.1}, "policy.params.standard"),
    ({"basic": "x"}, "policy.params.basic"),
    ({"tier_by": "user"}, "policy.params.tier_by"),
    ({"tiers_map": {"a": "gold"}}, "policy.params.tiers_map.a"),
    ({"tiers_map": ["premium"]}, "policy.params.tiers_map"),
    ({"default_tier": "gold"}, "policy.params.default_tier"),
    ({"min_resize_interval_s": -1}, "policy.params.min_resize_interval_s"),
    ({"pause_s": float("nan")}, "policy.params.pause_s"),
])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(LoomInputError) as err:
        SlaTiers(**kwargs)
    assert err.value.field == field


def test_tier_rules_and_sizes():
    rule = TierRule()
    assert [rule.tier(job("x", 0, 8, 1, priority=p)) for p in (3, 2, 1, 0, -1)] == [
        "premium", "premium", "standard", "basic", "basic"]
    by_class = TierRule(tier_by="job_class", tiers_map={"pretrain": "premium", "eval": "standard"})
    assert by_class.tier(job("x", 0, 8, 1, job_class=JobClass.PRETRAIN)) == "premium"
    assert by_class.tier(job("x", 0, 8, 1, job_class=JobClass.EVAL)) == "standard"
    assert by_class.tier(job("x", 0, 8, 1, job_class=JobClass.DEBUG)) == "basic"
    by_vc = TierRule(tier_by="vc", tiers_map={"prod": "premium"}, default_tier="standard")
    assert by_vc.tier(job("x", 0, 8, 1, vc="prod")) == "premium"
    assert by_vc.tier(job("x", 0, 8, 1, vc="lab")) == "standard"
    assert TierRule(tiers_map={"5": "standard"}).tier(job("x", 0, 8, 1, priority=5)) == "standard"
    # default plan: ZeRO-1 sharded within a node, so at most 8 devices are needed
    assert min_devices(job("x", 0, 32, 1)) == 8 and min_devices(job("x", 0, 4, 1)) == 4
    assert valid_sizes(job("x", 0, 32, 1)) == [8, 16, 24, 32]
    assert rule.guarantee(job("s", 0, 32, 1, priority=1)) == 16
    assert rule.guarantee(job("s", 0, 24, 1, priority=1)) == 16  # 12 rounds up to a valid size
    assert rule.guarantee(job("s", 0, 8, 1, priority=1)) == 8  # unshrinkable: its whole request
    assert rule.guarantee(job("b", 0, 32, 1)) == 0


def test_surge_premium_starts_at_once_and_lower_tiers_yield(small_clos):
    policy = SlaTiers()
    specs = surge()
    result = run(small_clos, specs, policy)
    jobs = {j.job_id: j for j in result.jobs}
    held = held_over_time(result)
    assert all(j.state is JobState.FINISHED for j in result.jobs)
    for p in ("p0", "p1"):  # at once, at full size, never touched
        assert jobs[p].first_start == jobs[p].spec.submit_time
        assert held[p] == [(jobs[p].spec.submit_time, jobs[p].spec.gpus)]
        assert jobs[p].resizes == jobs[p].preemptions == 0
    assert all(g >= 8 for t, g in held["s0"])  # standard keeps ≥ 50% of 16
    basic = [jobs[b] for b in ("b0", "b1", "b8", "b8x")]
    assert sum(b.resizes + b.preemptions for b in basic) > 0
    assert all(b.end_time > 1000 + b.spec.submit_time for b in basic if b.resizes or b.preemptions)
    for t, d in result.decisions:  # nothing below min devices; only lower tiers yield, with reasons
        if isinstance(d, Resize):
            assert d.allocation.total >= min_devices(jobs[d.job_id].spec)
        if isinstance(d, (Resize, Preempt)) and d.reason.startswith("sla"):
            assert policy.tier(jobs[d.job_id]) != "premium" and "premium job p" in d.reason
    r = rows(result, policy.rule)
    assert r["premium"]["attainment"] == 1.0 and r["premium"]["met_99"] == 1.0
    assert r["standard"]["attainment"] == 1.0
    assert r["basic"]["attainment"] < 1.0 and r["basic"]["held_share"] < 1.0


def test_shrunk_basic_jobs_grow_back_after_the_interval(small_clos):
    specs = [job(f"b{i}", i, 16, 2000, priority=0) for i in range(4)]
    specs.append(job("p", 100, 16, 100, priority=2))
    policy = SlaTiers()
    result = run(small_clos, specs, policy)
    log = [(t, d) for t, d in result.decisions if isinstance(d, (Resize, Timer))]
    shrinks = [(t, d.job_id, d.allocation.total) for t, d in log if isinstance(d, Resize) and t == 100]
    assert shrinks == [(100, "b3", 8), (100, "b2", 8)]  # youngest first, only as far as needed
    grows = [(t, d.job_id, d.allocation.total) for t, d in log if isinstance(d, Resize) and t > 100]
    assert grows == [(400, "b2", 16), (400, "b3", 16)]  # p ended at 200; held back to 100 + 300 s
    assert any(isinstance(d, Timer) and d.at == 400 for _, d in log)
    eager = run(small_clos, specs, SlaTiers(min_resize_interval_s=0))
    assert [(t, d.job_id) for t, d in eager.decisions if isinstance(d, Resize) and t > 100] == [
        (200, "b2"), (200, "b3")]


def test_standard_keeps_half_when_premium_needs_more(small_clos):
    specs = [job("s", 0, 32, 1000, priority=1), job("b", 1, 32, 1000, priority=0),
             job("p", 50, 48, 100, priority=2)]
    policy = SlaTiers()
    result = run(small_clos, specs, policy)
    at_50 = [(type(d).__name__, d.job_id, getattr(d, "allocation", None)) for t, d in result.decisions if t == 50]
    assert [(k, j) for k, j, _ in at_50] == [("Preempt", "b"), ("Resize", "s"), ("Start", "p")]
    assert at_50[1][2].total == 16
    r = rows(result, policy.rule)
    assert r["premium"]["attainment"] == 1.0 and r["standard"]["attainment"] == 1.0
    assert r["basic"]["attainment"] < 1.0


def test_equal_tiers_never_take_from_each_other(small_clos):
    specs = [job("a", 0, 64, 100, priority=1), job("b", 1, 32, 100, priority=1)]
    result = run(small_clos, specs, SlaTiers())
    assert [type(d) for _, d in result.decisions] == [Start, Start]
    assert result.decisions[1][0] == 100  # waited for a to finish


def test_unshrinkable_jobs_are_preempted_not_shrunk(small_clos):
    specs = [job(f"b{i}", 0, 8, 1000, priority=0) for i in range(8)] + [job("p", 10, 8, 10, priority=2)]
    result = run(small_clos, specs, SlaTiers())
    assert not any(isinstance(d, Resize) for _, d in result.decisions)
    assert [d.job_id for t, d in result.decisions if isinstance(d, Preempt)] == ["b7"]


def test_no_contention_everyone_attains(small_clos):
    specs = [job("p", 0, 16, 100, priority=2), job("s", 0, 16, 100, priority=1), job("b", 5, 32, 100)]
    policy = SlaTiers()
    result = run(small_clos, specs, policy)
    assert not any(isinstance(d, (Resize, Preempt)) for _, d in result.decisions)
    for r in sla_attainment(result, policy.rule):
        assert (r["jobs"], r["attainment"], r["met_99"], r["held_share"]) == (1, 1.0, 1.0, 1.0)


def test_attainment_accepts_a_tier_rule_and_reports_empty_tiers(small_clos):
    result = run(small_clos, [job("b", 0, 8, 10)], SlaTiers())
    r = rows(result, TierRule())
    assert r["basic"]["jobs"] == 1 and r["premium"] == {
        "tier": "premium", "fraction": 1.0, "jobs": 0, "attainment": None, "met_99": None, "held_share": None}


# -- random scenarios: every decision the policy makes can be applied, in order ----------------
from hypothesis import given
from hypothesis import strategies as st
from simharness import PROPERTY_SETTINGS, check_accounting, clusters, traces


@st.composite
def sla_scenarios(draw):
    topo = draw(clusters(False))
    specs = draw(traces(topo))
    return topo, specs, draw(st.sampled_from(["priority", "job_class"]))


@PROPERTY_SETTINGS
@given(sla_scenarios())
def test_random_surges_apply_cleanly_and_every_job_ends(case):
    """Shrinks keep a subset of the job's own GPUs, so a round's decisions apply in any order
    (a shrink once relied on GPUs freed by a later preemption of another victim)."""
    from loom.perf.interruptions import InterruptionModel

    topo, specs, tier_by = case
    specs = [replace(s, job_class=JobClass.EVAL if s.priority >= 2 else JobClass.DEBUG) for s in specs]
    policy = SlaTiers(tier_by=tier_by, tiers_map={"eval": "premium"} if tier_by == "job_class" else None)
    sim = Simulation(topo, specs, policy, PLACERS.get("best-fit")(), interruptions=InterruptionModel())
    result = sim.run()
    check_accounting(sim.ctx, sim.jobs)
    assert all(j.state in (JobState.FINISHED, JobState.REJECTED) for j in result.jobs)


def test_memoised_job_facts_follow_the_plan():
    """Per-job facts are memoised, but recomputed when the job's plan changes."""
    from loom.core.jobs import Job
    from loom.core.plan import ParallelPlan

    p = SlaTiers()
    j = Job(job("s", 0, 32, 1, priority=1), 0)
    assert (p.tier(j), p.guarantee(j), p.floor(j)) == ("standard", 16, 16)
    assert p.rule.guarantee(j.spec, j.plan) == p.guarantee(j)
    j.plan = ParallelPlan(dp=2, tp=8, pp=2)  # 32 ranks on at least 16 devices
    assert p.facts(j).sizes == valid_sizes(j.spec, j.plan) == [16, 32]
    j.plan = ParallelPlan(dp=1, tp=8, pp=4)  # 32 model-parallel shards: only its whole request
    assert (p.guarantee(j), p.floor(j)) == (32, 32) == (p.rule.guarantee(j.spec, j.plan), 32)


def test_inelastic_control_only_orders_the_queue(small_clos):
    result = run(small_clos, surge(), SlaTiers(elastic=False))
    jobs = {j.job_id: j for j in result.jobs}
    assert all(j.state is JobState.FINISHED for j in result.jobs)
    assert not any(isinstance(d, (Resize, Preempt)) for _, d in result.decisions)
    assert all(d.allocation.total == jobs[d.job_id].spec.gpus for _, d in result.decisions if isinstance(d, Start))
    assert jobs["p0"].first_start > jobs["p0"].spec.submit_time  # premium waits: nobody yields
    with pytest.raises(LoomInputError, match="elastic"):
        SlaTiers(elastic="no")
