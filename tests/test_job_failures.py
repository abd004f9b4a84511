"""Job-level failures (Acme §5 taxonomy): `loom.workload.job_failures`."""

import math
from dataclasses import replace

import pytest

from loom.errors import LoomInputError
from loom.workload.generate import generate
from loom.workload.job import FinalStatus, JobClass, JobSpec
from loom.workload.job_failures import (
    KINDS,
    AcmeFailureModel,
    FailurePlan,
    sample_failures,
    summarise,
)


@pytest.fixture(scope="module")
def kalos30():
    return generate("acme-kalos", 30, seed=0, outcomes="would-be")


@pytest.fixture(scope="module")
def summary(kalos30):
    return summarise(sample_failures(kalos30, AcmeFailureModel(), seed=0), kalos30)


def test_overall_fail_share_matches_scheduler_trace(summary):
    # [CS] Kalos fail_rate_gpu 0.397 (Seren 0.429)
    assert abs(summary["fail_share"] - 0.40) < 0.05


def test_infrastructure_few_failures_most_gpu_time(summary):
    assert abs(summary["share_by_kind"]["infrastructure"] - 0.11) < 0.04
    assert summary["gpu_time_share_by_kind"]["infrastructure"] >= 0.75
    assert summary["share_by_kind"]["script"] == max(summary["share_by_kind"].values())
    assert math.isclose(sum(summary["share_by_kind"].values()), 1.0)
    assert math.isclose(sum(summary["gpu_time_share_by_kind"].values()), 1.0)


def test_user_failures_early_infrastructure_mid_run(summary):
    med = summary["median_fraction_by_kind"]
    assert med["script"] < 0.2 and med["framework"] < 0.2
    assert 0.2 < med["infrastructure"] < 0.8


def test_eval_rarely_fails_in_log_sample_variant(kalos30):
    s = summarise(sample_failures(kalos30, AcmeFailureModel.log_sample(), seed=0), kalos30)
    assert abs(s["fail_share_by_class"][JobClass.EVAL.value] - 0.067) < 0.03


def test_plans_well_formed(kalos30):
    by_id = {j.job_id: j for j in kalos30}
    plans = sample_failures(kalos30, seed=0)
    assert plans
    for jid, ps in plans.items():
        spec = by_id[jid]
        assert ps and all(p.job_id == jid and p.kind in KINDS for p in ps)
        times = [p.at_progress_s for p in ps]
        assert times == sorted(times) and 0 < times[0] and times[-1] < spec.duration
        terminal = [i for i, p in enumerate(ps) if not p.recoverable]
        assert terminal in ([], [len(ps) - 1])  # at most one, and nothing after it
    # several recoverable failures on some long pretraining job
    assert any(sum(p.recoverable for p in ps) >= 2 for ps in plans.values())


def test_deterministic_per_seed(kalos30):
    a = sample_failures(kalos30, seed=3)
    assert a == sample_failures(kalos30, seed=3)
    assert a != sample_failures(kalos30, seed=4)


def test_recorded_failures_not_injected_by_default():
    specs = [JobSpec(f"j{i}", 0.0, 8, duration=36000.0, job_class=JobClass.DEBUG, final_status=st)
             for i, st in enumerate([FinalStatus.FAILED, FinalStatus.CANCELLED] * 50 + [FinalStatus.COMPLETED] * 100)]
    model = AcmeFailureModel(fail_probability={"unknown": 1.0})
    plans = sample_failures(specs, model, seed=0)
    assert len(plans) == 100 and all(int(jid[1:]) >= 100 for jid in plans)
    everything = sample_failures(specs, model, seed=0, inject_into=list(FinalStatus))
    assert len(everything) == 200


def test_recorded_trace_gets_injections_only_in_completed_jobs():
    specs = generate("acme-kalos", 3, seed=1)
    status = {j.job_id: j.final_status for j in specs}
    plans = sample_failures(specs, seed=0)
    assert plans and all(status[jid] == FinalStatus.COMPLETED for jid in plans)


def test_no_failures_with_zero_rates(kalos30):
    model = AcmeFailureModel(fail_probability={"unknown": 0.0}, infra_rate_per_gpu_hour=0.0,
                             hang_rate_per_gpu_hour=0.0)
    assert sample_failures(kalos30, model, seed=0) == {}
    assert sample_failures([], seed=0) == {}


@pytest.mark.parametrize("kwargs, field", [
    ({"fail_probability": {"unknown": 1.5}}, "fail_probability"),
    ({"fail_probability": {"eval": 0.1}}, "fail_probability"),
    ({"fail_probability": {"unknown": 0.1, "training": 0.2}}, "fail_probability"),
    ({"framework_share": -0.1}, "framework_share"),
    ({"script_frac": (0.0, 2.0)}, "script_frac"),
    ({"framework_frac": (1.0,)}, "framework_frac"),
    ({"infra_rate_per_gpu_hour": float("nan")}, "infra_rate_per_gpu_hour"),
    ({"hang_rate_per_gpu_hour": -1e-5}, "hang_rate_per_gpu_hour"),
])
def test_bad_parameters_name_the_field(kwargs, field):
    with pytest.raises(LoomInputError) as err:
        replace(AcmeFailureModel(), **kwargs)
    assert err.value.field == field and field in str(err.value)


def test_bad_plan():
    with pytest.raises(LoomInputError, match="kind"):
        FailurePlan("j", "oom", 1.0)  # type: ignore[arg-type]
    with pytest.raises(LoomInputError, match="at_progress_s"):
        FailurePlan("j", "script", -1.0)


def test_summarise_splits_gpu_time_between_failures():
    spec = JobSpec("p", 0.0, 100, duration=1000.0, job_class=JobClass.PRETRAIN)
    other = JobSpec("e", 0.0, 1, duration=100.0, job_class=JobClass.EVAL)
    plans = {"p": [FailurePlan("p", "infrastructure", 300.0), FailurePlan("p", "hang", 400.0),
                   FailurePlan("p", "script", 500.0)]}
    s = summarise(plans, [spec, other])
    assert s["fail_share"] == 0.5 and s["fail_share_by_class"] == {"eval": 0.0, "pretrain": 1.0}
    assert s["gpu_time_share_by_kind"] == {"infrastructure": 0.6, "framework": 0.0, "script": 0.2, "hang": 0.2}
    assert s["median_fraction_by_kind"]["script"] == 0.5 and math.isnan(s["median_fraction_by_kind"]["framework"])
    with pytest.raises(LoomInputError):
        summarise({"missing": [FailurePlan("missing", "script", 1.0)]}, [spec])
