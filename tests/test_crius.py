"""Crius policy: Cells, profiling delay, rescaling, anti-starvation, opportunistic execution."""

from __future__ import annotations

import numpy as np
import pytest

from loom.core.decisions import Migrate, Preempt, Resize, Resume, Start
from loom.core.protocols import POLICIES
from loom.errors import LoomInputError
from loom.hardware.clusters import load_cluster
from loom.placement.best_fit import BestFit
from loom.policies.crius import Crius
from loom.policies.fcfs import FCFS
from loom.sim.engine import Simulation
from loom.sim.estimator_speed import EstimatorSpeed
from loom.workload.job import JobSpec
from loom.workload.loaders import load_trace

N_JOBS = 60


def avg_jct(result) -> float:
    return float(np.mean([j.end_time - j.spec.submit_time for j in result.jobs]))


@pytest.fixture(scope="module")
def arena_runs():
    topo = load_cluster("arena-1280")
    specs = sorted(load_trace("arena-pai"), key=lambda s: s.submit_time)[:N_JOBS]
    crius = Crius(run_while_profiling=False, reuse_profiles=False)  # every job waits for its own profiling
    runs = {}
    for name, policy in (("fcfs", FCFS()), ("crius", crius)):
        runs[name] = Simulation(topo, specs, policy, BestFit(), EstimatorSpeed()).run()
    return runs, crius


def test_registered():
    assert POLICIES.get("crius") is Crius


def test_arena_pai_completes_and_beats_fcfs(arena_runs):
    runs, _ = arena_runs
    for result in runs.values():
        assert not result.rejected
        assert all(j.end_time is not None for j in result.jobs)
        assert len(result.jobs) == N_JOBS
    assert avg_jct(runs["crius"]) < avg_jct(runs["fcfs"])


def test_profiling_delay_recorded_and_respected(arena_runs):
    runs, crius = arena_runs
    result = runs["crius"]
    by_id = {j.job_id: j for j in result.jobs}
    starts = [(t, d) for t, d in result.decisions if isinstance(d, Start)]
    assert len(starts) == N_JOBS
    for t, d in starts:
        delay = crius.profiling_delay_s[d.job_id]
        admit = crius.cells_of(by_id[d.job_id]).admit_delay_s  # its Cells of ≤ N GPUs
        assert 0 < admit <= delay
        assert t >= by_id[d.job_id].spec.submit_time + admit - 1e-6
        assert "profiled" in d.reason and d.reason.startswith("crius: start")


def test_rescaling_charges_restart_delay(arena_runs):
    runs, crius = arena_runs
    rescales = [d for _, d in runs["crius"].decisions if isinstance(d, (Resize, Migrate))]
    assert rescales, "expected Crius to rescale or move some jobs"
    assert all(d.pause_s == crius.restart_delay_s for d in rescales)
    assert all("restart" in d.reason for d in rescales)


def job(jid: str, t: float, gpus: int, duration: float, gpu_type: str = "A100-80GB") -> JobSpec:
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, duration=duration, gpu_type=gpu_type,
                   gpu_types=(gpu_type,))


def small_trace() -> list[JobSpec]:
    # a (8 A100) runs; big (16 A100) arrives and must wait for a; small jobs keep arriving
    specs = [job("a", 0.0, 8, 5000.0), job("big", 10.0, 16, 1000.0)]
    specs += [job(f"s{i}", 100.0 + 300.0 * i, 4, 3000.0) for i in range(8)]
    return specs


def test_opportunistic_jobs_preempted_when_head_can_start(hetero):
    crius = Crius(starvation_s=1e9)
    result = Simulation(hetero, small_trace(), crius, BestFit()).run()
    assert all(j.end_time is not None for j in result.jobs)
    assert crius.stats["opportunistic_starts"] > 0
    a_end = next(j.end_time for j in result.jobs if j.job_id == "a")
    preempts = [(t, d) for t, d in result.decisions if isinstance(d, Preempt)]
    assert preempts and all("opportunistic" in d.reason for _, d in preempts)
    assert all(t == pytest.approx(a_end) for t, _ in preempts)
    big_start = next(t for t, d in result.decisions if isinstance(d, Start) and d.job_id == "big")
    assert big_start == pytest.approx(a_end)  # as soon as the held GPUs and a's are free
    assert any(isinstance(d, Resume) for _, d in result.decisions)  # the guests come back later


def test_starved_job_gets_priority_and_starts(hetero):
    crius = Crius(starvation_s=500.0, opportunistic=False)
    result = Simulation(hetero, small_trace(), crius, BestFit()).run()
    assert all(j.end_time is not None for j in result.jobs)
    big = next(j for j in result.jobs if j.job_id == "big")
    a_end = next(j.end_time for j in result.jobs if j.job_id == "a")
    assert big.first_start == pytest.approx(a_end)
    start = next(d for _, d in result.decisions if isinstance(d, Start) and d.job_id == "big")
    assert "starved" in start.reason
    # once starved (t > 510) nothing else starts on A100 before it
    others = [t for t, d in result.decisions if isinstance(d, (Start, Resume)) and d.job_id != "big"
              and 510.0 < t < big.first_start]
    assert not others


def model_job(jid: str, t: float, gpus: int, iterations: int = 20000) -> JobSpec:
    return JobSpec(job_id=jid, submit_time=t, gpus=gpus, gpu_type="A100-80GB", gpu_types=("A100-80GB",),
                   model="bert__760M", batch_size=128, iterations=iterations)


def test_idle_gpus_go_to_a_larger_cell_at_start(hetero):
    crius = Crius(profiling_s_per_cell=0.0)
    result = Simulation(hetero, [model_job("a", 0.0, 4)], crius, BestFit(), EstimatorSpeed()).run()
    start = next(d for _, d in result.decisions if isinstance(d, Start))
    assert start.allocation.total > 4  # 8 or 16 A100s rather than the 4 it asked for
    assert "idle GPUs" in start.reason and start.plan is not None and start.plan.world_size == start.allocation.total
    alone = Simulation(hetero, [model_job("a", 0.0, 4)], Crius(profiling_s_per_cell=0.0, max_scale=1), BestFit(),
                       EstimatorSpeed()).run()
    assert result.jobs[0].end_time < alone.jobs[0].end_time  # the larger Cell is faster


def test_new_job_admitted_by_shrinking_a_grown_one(hetero):
    crius = Crius(profiling_s_per_cell=0.0)
    specs = [model_job("a", 0.0, 8, iterations=200000), model_job("b", 1000.0, 8)]
    result = Simulation(hetero, specs, crius, BestFit(), EstimatorSpeed()).run()
    a_start = next(d for _, d in result.decisions if isinstance(d, Start) and d.job_id == "a")
    assert a_start.allocation.total == 16  # every A100, nobody else waiting
    shrink = [(t, d) for t, d in result.decisions if isinstance(d, Resize) and d.job_id == "a"]
    assert shrink and shrink[0][0] == 1000.0 and shrink[0][1].allocation.total == 8
    assert "made room for b" in shrink[0][1].reason and shrink[0][1].pause_s == crius.restart_delay_s
    b = next(j for j in result.jobs if j.job_id == "b")
    a = next(j for j in result.jobs if j.job_id == "a")
    assert b.first_start == 1000.0 < a.end_time  # not queued behind a
    b_start = next(d for _, d in result.decisions if isinstance(d, Start) and d.job_id == "b")
    assert "admitted after 1 rescale" in b_start.reason
    assert crius.stats["admitted_by_rescaling"] == 1


@pytest.mark.parametrize("params, field", [
    ({"max_scale": 0}, "max_scale"),
    ({"admit_depth": -1}, "admit_depth"),
    ({"admit_min_gain": float("inf")}, "admit_min_gain"),
    ({"search_depth": -1}, "search_depth"),
    ({"restart_delay_s": -5.0}, "restart_delay_s"),
    ({"profiling_s_per_cell": float("nan")}, "profiling_s_per_cell"),
    ({"starvation_s": 0}, "starvation_s"),
    ({"opportunistic": "yes"}, "opportunistic"),
    ({"max_candidates": 0}, "max_candidates"),
])
def test_bad_params(params, field):
    with pytest.raises(LoomInputError) as info:
        Crius(**params)
    assert field in str(info.value) or field in (getattr(info.value, "field", "") or "")


def test_cli_run_reports_crius_counters_profiling_and_latency(tmp_path):
    import json

    from typer.testing import CliRunner

    from loom.cli.main import app
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["simulate", "--trace", "arena-pai", "--cluster", "arena-1280", "--policy", "crius",
                                   "--speed-model", "estimator", "--limit", "20", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 20 and summary["crius_starts"] >= 20
    assert 0 < summary["crius_profiling_delay_s_median"] <= summary["crius_profiling_delay_s_max"]
    # by default a job being profiled runs as submitted where it fits, so few jobs wait for it
    assert summary["crius_profiling_starts"] > 0
    assert summary["avg_queue_s"] < summary["crius_profiling_delay_s_median"]
    assert 0 < summary["decision_ms_median"] <= summary["decision_ms_p99"]
