"""Plan searches' answers on disk (`loom.perf.plan_cache`)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import loom.perf.plan_cache as plan_cache_module
from loom.cli.main import app
from loom.core.plan import ParallelPlan
from loom.errors import LoomInputError
from loom.perf import preset
from loom.perf.comm import BusBandwidthComm
from loom.perf.estimator import Estimator
from loom.perf.inputs import Hardware, TrainingJob
from loom.perf.plan_cache import ENV, PlanCache
from loom.perf.search import Choices, fastest_plan, search_plans


class Counting(Estimator):
    """Counts plans priced: zero means the answer came from the cache."""

    priced = 0

    def price(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        Counting.priced += 1
        return super().price(*args, **kwargs)


JOB, HW = TrainingJob(preset("bert__2.6B"), 256), Hardware("V100", gpus_per_node=8)


def test_a_cached_answer_is_the_searched_one_without_searching(tmp_path):
    cache = PlanCache(tmp_path / "plans.sqlite")
    Counting.priced = 0
    cold = fastest_plan(JOB, HW, 16, choices=Choices(vpp=1), estimator=Counting(plan_cache=cache))
    assert Counting.priced > 0 and (cache.hits, cache.misses, len(cache)) == (0, 1, 1)
    Counting.priced = 0
    again = PlanCache(tmp_path / "plans.sqlite")  # another process opening the same file
    warm = fastest_plan(JOB, HW, 16, choices=Choices(vpp=1), estimator=Counting(plan_cache=again))
    assert Counting.priced == 0 and again.hits == 1
    assert warm == cold == search_plans(JOB, HW, 16, choices=Choices(vpp=1), estimator=Estimator()).best


def test_no_plan_is_cached_too(tmp_path):
    cache = PlanCache(tmp_path / "plans.sqlite")
    huge = TrainingJob(preset("llama2-70b"), 8)  # 70B on one V100: nothing fits
    assert fastest_plan(huge, HW, 1, estimator=Estimator(plan_cache=cache)) is None
    assert cache.get(next(iter(_keys(cache)))) == (True, None)
    Counting.priced = 0
    assert fastest_plan(huge, HW, 1, estimator=Counting(plan_cache=cache)) is None and Counting.priced == 0


def test_any_input_change_is_a_different_entry(tmp_path):
    cache = PlanCache(tmp_path / "plans.sqlite")
    est = Estimator(plan_cache=cache)
    fastest_plan(JOB, HW, 16, estimator=est)
    for job, hw, gpus, choices in [(TrainingJob(preset("bert__2.6B"), 512), HW, 16, Choices()),
                                   (JOB, Hardware("V100", gpus_per_node=4), 16, Choices()),
                                   (JOB, HW, 8, Choices()), (JOB, HW, 16, Choices(vpp=1))]:
        before = cache.misses
        fastest_plan(job, hw, gpus, choices=choices, estimator=est)
        assert cache.misses == before + 1
    assert len(cache) == 5


def test_new_code_or_calibration_never_reads_old_answers(tmp_path, monkeypatch):
    cache = PlanCache(tmp_path / "plans.sqlite")
    key = cache.key("fastest_plan", JOB, HW, 16)
    cache.put(key, ParallelPlan(dp=16))
    monkeypatch.setattr(plan_cache_module, "_FINGERPRINT", "edited estimator")
    assert cache.key("fastest_plan", JOB, HW, 16) != key
    from dataclasses import replace
    est = Estimator(plan_cache=cache)
    tuned = Estimator(calibration=replace(est.calibration, gemm_efficiency=0.5), plan_cache=cache)
    fastest_plan(JOB, HW, 16, estimator=est)
    misses = cache.misses
    fastest_plan(JOB, HW, 16, estimator=tuned)
    assert cache.misses == misses + 1


def test_the_environment_variable_turns_it_on_for_default_estimators(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "env.sqlite"))
    assert Estimator().plan_cache is not None
    assert Estimator().plan_cache is Estimator().plan_cache  # one connection per file and process
    assert Estimator(comm=BusBandwidthComm(Estimator().calibration)).plan_cache is None  # custom models: not keyed
    monkeypatch.delenv(ENV)
    assert Estimator().plan_cache is None


def test_an_unopenable_cache_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LoomInputError, match="plan cache"):
        PlanCache(blocker / "plans.sqlite")
    res = CliRunner().invoke(app, ["simulate", "--trace", "philly", "--cluster", "philly", "--limit", "5",
                                   "--plan-cache", str(blocker / "plans.sqlite"), "-q"])
    assert res.exit_code != 0 and "plan cache" in res.output and "Traceback" not in res.output


def test_simulate_with_a_plan_cache_gives_the_same_run(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    cache = tmp_path / "plans.sqlite"
    summaries = []
    for run in ("cold", "warm"):
        out = tmp_path / run
        res = CliRunner().invoke(app, ["simulate", "--trace", "arena-philly", "--cluster", "arena-1280", "--policy",
                                       "fcfs", "--speed-model", "estimator", "--limit", "30", "--out", str(out),
                                       "--plan-cache", str(cache), "-q", "--no-report"])
        assert res.exit_code == 0, res.output
        summary = json.loads((out / "summary.json").read_text())
        summaries.append({k: v for k, v in summary.items() if "wall" not in k and "per_s" not in k and "ms" not in k})
        monkeypatch.delenv(ENV, raising=False)  # the flag set it for the process; the next run sets it again
    assert summaries[0] == summaries[1]
    assert len(PlanCache(cache)) > 0


def _keys(cache: PlanCache) -> list[str]:
    return [row[0] for row in cache._db.execute("SELECT key FROM plans")]


def test_experiment_workers_share_the_plan_cache(tmp_path, monkeypatch):
    """`loom experiment --plan-cache`: the runs (separate worker processes) fill one file."""
    import yaml

    monkeypatch.delenv(ENV, raising=False)
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"trace": "arena-philly", "cluster": "arena-1280", "speed_model": "estimator",
                                   "limit_jobs": 10, "outputs": {"report": False},
                                   "grid": {"policies": ["fcfs", "easy"]}}))
    cache = tmp_path / "shared.sqlite"
    res = CliRunner().invoke(app, ["experiment", str(exp), "--out", str(tmp_path / "out"), "--workers", "2",
                                   "--plan-cache", str(cache)])
    monkeypatch.delenv(ENV, raising=False)
    assert res.exit_code == 0, res.output
    assert len(PlanCache(cache)) > 0
