"""Reservation for planned pretraining jobs (Arnold Algorithm 1) and its baselines."""

from __future__ import annotations

import pytest

from loom.core.protocols import PLACERS
from loom.errors import LoomInputError
from loom.hardware.clos import clos
from loom.policies.reservation import ReservationPolicy
from loom.sim.engine import Simulation
from loom.workload.job import JobSpec

ARRIVAL = 4 * 3600.0


@pytest.fixture
def cluster():
    return clos("c", minipods=2, nodes=8, gpus_per_node=8, gpu_type="H800", nodes_per_leaf=2)


def workload(preemptible_long: bool = False) -> list[JobSpec]:
    """A 32-GPU pretraining job announced 4 h ahead, and jobs that would sit on its nodes."""
    jobs = [JobSpec("llm", ARRIVAL, 32, 3600.0, announce_time=0.0, model="arnold-24b-dense")]
    # short jobs: finish well before the arrival
    jobs += [JobSpec(f"short{i}", 60.0 + i, 8, 1800.0) for i in range(6)]
    # long jobs: would run across the arrival
    jobs += [JobSpec(f"long{i}", 120.0 + i, 8, 10 * 3600.0, preemptible=preemptible_long) for i in range(6)]
    return jobs


def run(cluster, mode: str, specs: list[JobSpec]):
    policy = ReservationPolicy(mode=mode)
    result = Simulation(cluster, specs, policy, PLACERS.get("best-fit")(), round_interval=600.0).run()
    return policy, {j.job_id: j for j in result.jobs}, result


def test_predicted_backfill_keeps_the_reservation_and_uses_it_meanwhile(cluster):
    policy, jobs, _ = run(cluster, "predict", workload())
    assert policy.stats.violations == 0
    assert jobs["llm"].first_start - ARRIVAL <= 600.0  # within one scheduling interval
    assert policy.stats.inside_starts > 0  # short jobs ran on reserved nodes before the arrival
    assert all(j.end_time is not None for j in jobs.values())


def test_strict_reservation_idles_reserved_nodes(cluster):
    predict, _, _ = run(cluster, "predict", workload())
    strict, jobs, _ = run(cluster, "strict", workload())
    assert strict.stats.violations == 0 and strict.stats.inside_starts == 0
    assert jobs["llm"].first_start - ARRIVAL <= 600.0
    def busy_before(policy):
        return sum(b for t, b, _, _ in policy.timeline if t < ARRIVAL) / max(1, sum(1 for t, *_ in policy.timeline
                                                                                    if t < ARRIVAL))
    assert busy_before(predict) > busy_before(strict)


def test_best_effort_reservation_is_violated(cluster):
    """Without prediction, long non-preemptible jobs sit on the reserved nodes at
    the arrival: violations, settled by substitution or manual preemption."""
    policy, jobs, result = run(cluster, "best-effort", workload())
    assert policy.stats.violations > 0
    manual = [d for _, d in result.decisions if type(d).__name__ == "Preempt" and "violation" in d.reason]
    swapped = set(next(d for _, d in result.decisions if type(d).__name__ == "Start" and d.job_id == "llm")
                  .allocation.nodes) != set(next(d for _, d in result.decisions
                                                 if type(d).__name__ == "Reserve").nodes)
    assert manual or swapped
    assert jobs["llm"].first_start - ARRIVAL <= 600.0


def test_preemptible_jobs_may_use_reserved_nodes_and_are_preempted_at_arrival(cluster):
    policy, jobs, _ = run(cluster, "predict", workload(preemptible_long=True))
    assert policy.stats.violations == 0
    assert policy.stats.preempted_at_arrival > 0
    assert jobs["llm"].first_start - ARRIVAL <= 600.0
    assert any(j.preemptions for j in jobs.values() if j.job_id.startswith("long"))


def test_reserved_start_carries_the_aligned_plan(cluster):
    _, _, result = run(cluster, "predict", workload())
    starts = [d for _, d in result.decisions if type(d).__name__ == "Start" and d.job_id == "llm"]
    assert starts and starts[0].plan is not None and starts[0].plan.world_size == 32


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(LoomInputError, match="mode"):
        ReservationPolicy(mode="hope")


def test_energy_charges_idle_gpus(cluster):
    from loom.report.energy import energy, gpu_power

    _, _, strict = run(cluster, "strict", workload())
    _, _, predict = run(cluster, "predict", workload())
    idle_w, board = gpu_power()
    assert idle_w == 60 and board["H800"] == 700
    for result in (strict, predict):
        e = energy(result)
        assert result.failed_gpu_seconds == 0  # no failures: every GPU-second is busy or idle
        # every job runs its duration: llm 32 × 3600 + six short 8 × 1800 + six long 8 × 36000 GPU-s
        busy_gpu_s = 32 * 3600 + 6 * 8 * 1800 + 6 * 8 * 36000  # 1,929,600
        assert result.busy_gpu_seconds == busy_gpu_s
        # 64 H800s from the first arrival to the last finish; the GPU-seconds no job held draw 60 W each
        idle_gpu_s = 64 * (result.end_time - result.start_time) - busy_gpu_s
        assert idle_gpu_s > 0
        assert e["energy_idle_kwh"] == pytest.approx(idle_gpu_s * 60 / 3.6e6)
        assert e["energy_busy_kwh"] == pytest.approx(busy_gpu_s * 700 / 3.6e6)
        assert e["energy_kwh"] == pytest.approx((busy_gpu_s * 700 + idle_gpu_s * 60) / 3.6e6)


def test_report_draws_the_reservation_as_a_gantt_chart(cluster):
    from loom.report.decision_log import decision_frame
    from loom.report.gantt import gantt_figure, occupancy, reservation_rows
    from loom.report.metrics import job_records

    _, jobs, result = run(cluster, "predict", workload())
    decisions = decision_frame(result.decisions, cluster)
    info = reservation_rows(decisions)
    assert info is not None and info["job"] == "llm" and len(info["nodes"]) == 4
    intervals = occupancy(decisions, info["nodes"], result.end_time)
    assert any(job == "llm" for _, job, _, _ in intervals)
    png = gantt_figure(decisions, job_records(result))
    assert png is not None and png[:4] == b"\x89PNG"


def test_example_config_runs_on_a_generated_kalos_trace(tmp_path):
    from pathlib import Path

    from loom.config import load_config
    from loom.run import run as run_config
    from loom.workload.generate import generate, write_csv

    trace = tmp_path / "kalos.csv"
    write_csv(generate("acme-kalos", 1.0, 0, scale=3.0), trace)
    example = Path(__file__).parents[1] / "examples" / "kalos-reserve.yaml"
    cfg = load_config(example, {"trace": f"csv:{trace}", "outputs.dir": str(tmp_path / "out"),
                                "outputs.report": False})
    outputs = run_config(cfg)
    assert outputs.summary["finished"] + outputs.summary["unfinished"] == outputs.summary["jobs"]
    assert outputs.summary["energy_kwh"] > 0
    assert outputs.summary["reserve_violations"] >= 0 and "reserve_start_delay_s" in outputs.summary


def test_reservation_moves_off_nodes_whose_jobs_now_run_past_the_arrival(cluster):
    """A predictor that underestimates long jobs lets them in; as they overrun
    their prediction, the reservation is moved to nodes that became free."""
    specs = [JobSpec("llm", ARRIVAL, 32, 3600.0, announce_time=0.0)]
    specs += [JobSpec(f"fill{i}", 60.0, 8, 2 * 3600.0) for i in range(4)]
    specs += [JobSpec(f"long{i}", 120.0, 8, 10 * 3600.0) for i in range(2)]
    policy = ReservationPolicy(mode="predict")
    result = Simulation(cluster, specs, policy, PLACERS.get("best-fit")(), round_interval=600.0,
                        runtime_estimate=lambda job: ((job.spec.duration or 0.0) - job.progress) / 10).run()
    releases = [d for _, d in result.decisions if type(d).__name__ == "Release" and "re-plan" in d.reason]
    assert releases, "the reservation should have been re-planned"
    assert policy.stats.violations == 0
    llm = next(j for j in result.jobs if j.job_id == "llm")
    assert llm.first_start - ARRIVAL <= 600.0
    assert all(j.preemptions == 0 for j in result.jobs)
