"""Quota reservation with best-effort borrowing (`quota` policy) and per-VC fairness."""

from __future__ import annotations

import pytest
from conftest import job, write_file

from loom.config import SimConfig, load_config
from loom.core.decisions import Preempt
from loom.core.jobs import JobState
from loom.core.protocols import PLACERS, POLICIES
from loom.errors import LoomInputError
from loom.policies.quota import QuotaPolicy
from loom.report.fairness import fairness_index, jain_index, vc_fairness
from loom.run import build_simulation
from loom.sim.engine import Simulation
from loom.workload.job import JobClass


def simulate(topo, specs, **params):
    policy = POLICIES.get("quota")(**params)
    return Simulation(topo, specs, policy, PLACERS.get("best-fit")()).run()


def by_id(result):
    return {j.job_id: j for j in result.jobs}


def log(result):
    return [(t, type(d).__name__, d.job_id, d.reason) for t, d in result.decisions]


def be(jid, t, gpus, duration, vc, **kw):
    return job(jid, t, gpus, duration, vc=vc, job_class=JobClass.EVAL, **kw)


def test_registered_under_quota():
    assert POLICIES.get("quota") is QuotaPolicy


def test_guaranteed_jobs_never_exceed_quota(small_clos):
    specs = [job(f"a{i}", i, 8, 100, vc="A") for i in range(5)] + [job("b0", 0, 16, 50, vc="B")]
    result = simulate(small_clos, specs, quotas={"A": 16, "B": 48})
    jobs = by_id(result)
    assert all(j.state is JobState.FINISHED for j in result.jobs)
    # at every start instant, A's running guaranteed GPUs stay within 16 (the cluster had room for more)
    for t in {j.first_start for j in result.jobs}:
        in_use = sum(j.gpus for j in result.jobs if j.spec.vc == "A" and j.first_start <= t < j.end_time)
        assert in_use <= 16
    assert (jobs["a0"].first_start, jobs["a1"].first_start) == (0, 1)
    assert jobs["a2"].first_start == 100 and jobs["a3"].first_start == 101 and jobs["a4"].first_start == 200
    assert jobs["b0"].first_start == 0
    first = next(r for _, k, jid, r in log(result) if jid == "a1")
    assert first.startswith("quota: vc A uses 8/16 guaranteed GPUs; start a1 (8 GPUs)")


def test_best_effort_borrows_idle_gpus(small_clos):
    specs = [be("e1", 0, 48, 10, "B"), job("p", 0, 8, 10, vc="B", preemptible=True)]
    result = simulate(small_clos, specs, quotas={"A": 32, "B": 16})
    jobs = by_id(result)
    assert jobs["e1"].first_start == 0 and jobs["p"].first_start == 0  # preemptible → best-effort too
    reasons = {jid: r for _, _, jid, r in log(result)}
    assert "borrowing" in reasons["e1"] and "vc B at 0/16" in reasons["e1"]
    assert "borrowing" in reasons["p"]
    policy = QuotaPolicy(quotas={"A": 32, "B": 16})
    assert policy.is_best_effort(jobs["p"].spec) and policy.is_best_effort(jobs["e1"].spec)


def test_best_effort_within_own_quota_is_not_borrowing(small_clos):
    result = simulate(small_clos, [be("e1", 0, 16, 10, "B")], quotas={"A": 32, "B": 32})
    reason = result.decisions[0][1].reason
    assert "within its quota" in reason and "borrow" not in reason


def test_owner_preempts_most_recent_borrower_and_it_resumes(small_clos):
    specs = [
        be("own", 0, 32, 1000, "B"),  # within B's 32
        be("old", 1, 16, 1000, "B"),  # borrowing
        be("new", 2, 16, 100, "B"),  # borrowing, most recent
        job("g", 10, 16, 10, vc="A"),
    ]
    result = simulate(small_clos, specs, quotas={"A": 32, "B": 32})
    jobs = by_id(result)
    entries = log(result)
    at10 = [(k, jid) for t, k, jid, _ in entries if t == 10]
    assert at10 == [("Preempt", "new"), ("Start", "g")]  # the fewest (one), most recent borrower
    preempt = next(r for _, k, _, r in entries if k == "Preempt")
    assert preempt == "quota: preempt best-effort new of vc B borrowing vc A's quota for g"
    start_g = next(r for _, k, jid, r in entries if jid == "g")
    assert start_g.startswith("quota: vc A uses 0/32 guaranteed GPUs; start g (16 GPUs) after preempting 1")
    assert jobs["g"].first_start == 10 and jobs["g"].end_time == 20
    assert jobs["old"].preemptions == 0 and jobs["own"].preemptions == 0
    new = jobs["new"]
    assert new.preemptions == 1 and new.state is JobState.FINISHED
    resume = [(t, k) for t, k, jid, _ in entries if jid == "new" and k == "Resume"]
    assert resume == [(20, "Resume")]
    assert new.end_time == pytest.approx(20 + 92)  # 8 s done before the preemption, progress kept
    assert new.gpu_seconds == pytest.approx(16 * 100)


def test_own_best_effort_yields_to_own_guaranteed_job(small_clos):
    specs = [be("e", 0, 64, 100, "A"), job("g", 5, 8, 10, vc="A")]
    result = simulate(small_clos, specs, quotas={"A": 64})
    kinds = [(k, jid) for t, k, jid, _ in log(result) if t == 5]
    assert kinds == [("Preempt", "e"), ("Start", "g")]
    assert "to free vc A's quota for g" in result.decisions[1][1].reason
    assert by_id(result)["e"].state is JobState.FINISHED


def test_no_preemption_when_it_would_not_help(small_clos):
    # A's guaranteed job needs 48; only 16 GPUs are held by borrowers, 48 by B's guaranteed jobs
    specs = [job("b", 0, 48, 100, vc="B"), be("e", 1, 16, 100, "C"), job("g", 5, 48, 10, vc="A")]
    result = simulate(small_clos, specs, quotas={"A": 48, "B": 48})
    assert not any(isinstance(d, Preempt) for _, d in result.decisions)
    assert by_id(result)["g"].first_start == 100


def test_borrowing_pauses_while_an_owner_waits(small_clos):
    # g (A, within quota) waits for b; e would borrow the 16 free GPUs g is owed
    specs = [job("b", 0, 48, 100, vc="B"), job("g", 1, 32, 10, vc="A"), be("e", 2, 16, 10, "C")]
    result = simulate(small_clos, specs, quotas={"A": 32, "B": 48})
    jobs = by_id(result)
    assert jobs["g"].first_start == 100 and jobs["e"].first_start == 100


def test_unknown_vc_uses_default_quota(small_clos):
    specs = [job("z1", 0, 8, 10, vc="Z"), job("z2", 0, 8, 10, vc="Z"), job("n1", 0, 8, 10)]
    jobs = by_id(simulate(small_clos, specs, quotas={"A": 32}, default_quota=8))
    assert jobs["z1"].first_start == 0 and jobs["z2"].first_start == 10
    assert jobs["n1"].first_start == 0  # no VC: default quota as well
    stuck = by_id(simulate(small_clos, specs, quotas={"A": 32}))  # default 0: guaranteed jobs never start
    assert all(j.state is JobState.PENDING for j in stuck.values())


def test_priority_order_within_vc(small_clos):
    specs = [job("x", 0, 16, 10, vc="A"), job("lo", 1, 16, 10, vc="A"), job("hi", 2, 16, 10, vc="A", priority=3)]
    jobs = by_id(simulate(small_clos, specs, quotas={"A": 16}, order="priority"))
    assert jobs["hi"].first_start == 10 and jobs["lo"].first_start == 20


@pytest.mark.parametrize(("params", "field", "text"), [
    ({"quotas": {"A": -8}}, "policy.params.quotas.A", "negative"),
    ({"quotas": {"A": 8.5}}, "policy.params.quotas.A", "whole number"),
    ({"quotas": {"A": "8"}}, "policy.params.quotas.A", "whole number"),
    ({"quotas": {"A": True}}, "policy.params.quotas.A", "whole number"),
    ({"quotas": [8]}, "policy.params.quotas", "mapping"),
    ({}, "policy.params.quotas", "needs per-VC quotas"),
    ({"quotas": {"A": 8}, "default_quota": -1}, "policy.params.default_quota", "negative"),
    ({"quotas": {"A": 8}, "order": "lifo"}, "policy.params.order", "must be one of fcfs, priority"),
    ({"quotas": {"A": 8}, "best_effort_classes": ["evals"]}, "policy.params.best_effort_classes", "unknown job class"),
])
def test_bad_quota_config_names_the_field(params, field, text):
    with pytest.raises(LoomInputError, match=text) as exc:
        QuotaPolicy(**params)
    assert exc.value.field == field and field in str(exc.value)


def test_quota_file(tmp_path, small_clos):
    path = write_file(tmp_path, "quotas:\n  A: 16\n  103959: 8\n", "q.yaml")
    policy = QuotaPolicy(quota_file=str(path))
    assert policy.quotas == {"A": 16, "103959": 8}  # numeric VC names become strings
    bad = write_file(tmp_path, "A: -4\n", "bad.yaml")
    with pytest.raises(LoomInputError, match="negative") as exc:
        QuotaPolicy(quota_file=str(bad))
    assert exc.value.source == str(bad) and exc.value.field == "quotas.A"


def test_jain_index():
    assert jain_index([0.5, 0.5, 0.5]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert jain_index([1.0, 0.5]) == pytest.approx(0.9)
    assert jain_index([]) == 1.0
    with pytest.raises(ValueError):
        jain_index([-1.0])


def test_vc_fairness_equal_and_skewed(small_clos):
    equal = simulate(small_clos, [job("a", 0, 32, 100, vc="A"), job("b", 0, 32, 100, vc="B")],
                     quotas={"A": 32, "B": 32})
    rows = vc_fairness(equal, {"A": 32, "B": 32})
    assert [r["vc"] for r in rows] == ["A", "B"]
    assert all(r["normalized_share"] == pytest.approx(1.0) for r in rows)
    assert rows[0]["quota_share"] == rows[0]["guaranteed_share"] == 0.5
    assert fairness_index(rows) == pytest.approx(1.0)

    specs = [job("a", 0, 32, 100, vc="A"), job("b", 0, 8, 100, vc="B"), be("e", 0, 16, 50, "B"),
             job("g", 10, 24, 10, vc="C")]
    skewed = simulate(small_clos, specs, quotas={"A": 32, "B": 16, "C": 16}, default_quota=8)
    rows = {r["vc"]: r for r in vc_fairness(skewed, {"A": 32, "B": 16, "C": 16}, default_quota=8)}
    assert rows["B"]["best_effort_gpu_seconds"] == pytest.approx(16 * 50)
    assert rows["B"]["best_effort_preemptions"] == 0
    assert rows["C"]["unstarted"] == 1 and rows["C"]["normalized_share"] == 0.0  # 24 > C's 16: never starts
    assert rows["A"]["avg_queue_s"] == 0.0
    assert fairness_index(rows.values()) < 0.9


def test_fairness_counts_best_effort_preemptions(small_clos):
    specs = [be("new", 0, 64, 100, "B"), job("g", 10, 32, 10, vc="A")]
    result = simulate(small_clos, specs, quotas={"A": 32, "B": 0})
    rows = {r["vc"]: r for r in vc_fairness(result, {"A": 32, "B": 0})}
    assert rows["B"]["best_effort_preemptions"] == 1 and rows["B"]["normalized_share"] is None
    assert rows["A"]["guaranteed_gpu_seconds"] == pytest.approx(32 * 10)


def test_sim_config_with_quota_params(tmp_path):
    rows = ["job_id,submit_time,gpus,duration,vc,job_class"]
    rows += [f"a{i},{i},32,100,A,pretrain" for i in range(4)]
    rows += [f"b{i},{i},16,50,B,sft" for i in range(4)]
    rows += [f"e{i},{i},24,30,C,eval" for i in range(3)]
    trace = write_file(tmp_path, "\n".join(rows) + "\n", "trace.csv")
    config_path = write_file(tmp_path, (
        f"cluster: arnold-i\ntrace: csv:{trace}\n"
        "policy:\n  name: quota\n  params:\n    quotas: {A: 64, B: 32}\n    default_quota: 0\n"), "sim.yaml")
    config = load_config(config_path)
    assert isinstance(config, SimConfig) and config.policy.params["quotas"] == {"A": 64, "B": 32}
    result = build_simulation(config).run()
    jobs = by_id(result)
    assert all(j.state is JobState.FINISHED for j in result.jobs)
    assert [jobs[f"a{i}"].first_start for i in range(4)] == [0, 1, 100, 101]  # two at a time under 64
    # best-effort jobs of C (no quota) borrow the idle GPUs: 144 = 64 (A) + 32 (B) + 2 × 24, so e2 waits for e0
    assert [jobs[f"e{i}"].first_start for i in range(3)] == [0, 1, 30]
    assert [jobs[f"b{i}"].first_start for i in range(4)] == [0, 1, 50, 51]
    rows = vc_fairness(result, config.policy.params["quotas"])
    assert {r["vc"] for r in rows} == {"A", "B", "C"}

    bad = SimConfig(cluster="arnold-i", trace=f"csv:{trace}", policy={"name": "quota", "params": {"quotas": {"A": -1}}})
    with pytest.raises(LoomInputError, match="policy.params.quotas.A"):
        build_simulation(bad)


def test_quota_run_summary_reports_per_vc_fairness(tmp_path):
    from loom.run import run as run_config

    rows = ["job_id,submit_time,gpus,duration,vc,job_class"]
    rows += [f"a{i},{i},32,100,A,pretrain" for i in range(4)]
    rows += [f"b{i},{i},16,50,B,sft" for i in range(4)]
    trace = write_file(tmp_path, "\n".join(rows) + "\n", "trace.csv")
    config_path = write_file(tmp_path, (
        f"cluster: arnold-i\ntrace: csv:{trace}\noutputs: {{dir: {tmp_path / 'out'}, report: false}}\n"
        "policy:\n  name: quota\n  params:\n    quotas: {A: 64, B: 32}\n"), "sim.yaml")
    outputs = run_config(load_config(config_path))
    assert 0.0 < outputs.summary["quota_jain_index"] <= 1.0
    assert {row["vc"] for row in outputs.summary["quota_per_vc"]} >= {"A", "B"}
