"""bench/arena_side_by_side.py helpers that need neither Arena nor a simulation."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from loom.workload.job import JobSpec

_PATH = Path(__file__).resolve().parents[1] / "bench" / "arena_side_by_side.py"
_spec = importlib.util.spec_from_file_location("arena_side_by_side", _PATH)
assert _spec is not None and _spec.loader is not None
sbs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sbs)


def _job(i: int, t: float) -> JobSpec:
    return JobSpec(job_id=f"j{i}", submit_time=t, gpus=1, duration=10.0)


def test_subset_cuts_arrivals_like_arena_rounds() -> None:
    specs = [_job(0, 1000.0), _job(1, 1300.0), _job(2, 1301.0), _job(3, 1600.0)]
    subset, t0, horizon = sbs.arena_subset(specs, 1)
    assert [s.job_id for s in subset] == ["j0", "j1"] and t0 == 1000.0 and horizon == 1000.0
    subset, _, horizon = sbs.arena_subset(specs, 2)
    assert len(subset) == 4 and horizon == 1300.0
    subset, _, horizon = sbs.arena_subset(specs, 0)
    assert len(subset) == 4 and horizon is None


def test_parse_arena_log(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(
        "#          Event-stream scheduling round:  0               #\n"
        "[I] The following jobs are completed and ended: []\n"
        "#          Event-stream scheduling round:  7               #\n"
        "[I] The following jobs are completed and ended: ['job_0003', 'job_0010']\n"
    )
    assert sbs.parse_arena_log(log) == [(7, "job_0003"), (7, "job_0010")]


def test_reduction_finished_only_and_padded() -> None:
    crius = {"status": "ok", "jct_s": [10.0, 10.0, 10.0, 10.0]}
    other = {"status": "ok", "jct_s": [20.0, 20.0]}
    plain, padded = sbs.reduction(crius, other, max_jct=100.0)
    assert plain == pytest.approx(0.5)
    assert padded == pytest.approx((60.0 - 10.0) / 60.0)
    assert sbs.reduction(crius, {"status": "timeout"}, 100.0) is None


def test_table_marks_missing_runs() -> None:
    ok = {"status": "ok", "submitted": 2, "finished": 2, "avg_jct_s": 15.0, "makespan_s": 30.0,
          "wall_s": 4.0, "jct_s": [10.0, 20.0]}
    results = {"fcfs": {"arena": {"status": "timeout after 5 s (round 3)", "wall_s": 6.0}, "loom": ok},
               "gavel": {"arena": {**ok, "wall_s": 6.0}, "loom": ok}}
    fcfs, gavel = sbs.table(results).splitlines()[2:]
    assert "timeout after 5 s" in fcfs and "| 2/2 |" in fcfs and "×" not in fcfs
    assert gavel.count("| 2/2 |") == 1 and "| 1.5× |" in gavel


def test_table_gives_process_and_loop_ratios() -> None:
    arena = {"status": "ok", "submitted": 2, "finished": 2, "avg_jct_s": 15.0, "makespan_s": 30.0,
             "wall_s": 12.0, "jct_s": [10.0, 20.0]}
    loom = {**arena, "wall_s": 0.5, "process_wall_s": 3.0, "warm": {"wall_s": 0.25}}
    head, _, row = sbs.table({"fcfs": {"arena": arena, "loom": loom}}).splitlines()
    cells = dict(zip([c.strip() for c in head.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["Arena process s"] == "12.0" and cells["Loom process s"] == "3.0"
    assert cells["**Arena / Loom, process / process**"] == "4.0×"
    assert cells["Loom loop s"] == "0.5" and cells["Arena / Loom, process / loop"] == "24.0×"
    assert cells["Arena / Loom, process / warm loop"] == "48.0×"


def test_repeated_takes_medians_and_keeps_every_run() -> None:
    runs = [{"wall_s": 3.0, "process_wall_s": 9.0, "x": 1}, {"wall_s": 1.0, "process_wall_s": 5.0, "x": 2},
            {"wall_s": 2.0, "process_wall_s": 4.0, "x": 3}]
    out = sbs.repeated(runs, ("wall_s", "process_wall_s"))
    assert out["wall_s"] == 2.0 and out["process_wall_s"] == 5.0 and out["x"] == 3
    assert out["wall_s_runs"] == [3.0, 1.0, 2.0]


def test_loom_stops_at_horizon_with_the_same_cut_figures() -> None:
    specs = [_job(0, 0.0), JobSpec(job_id="long", submit_time=10.0, gpus=1, duration=1000.0), _job(2, 20.0)]
    cut = sbs.run_loom("fcfs", specs, 0.0, 200.0, None, to_completion=False)
    full = sbs.run_loom("fcfs", specs, 0.0, 200.0, None, to_completion=True)
    assert cut["stopped_at_horizon"] and not full["stopped_at_horizon"]
    for key in ("finished", "avg_jct_s", "makespan_s"):
        assert cut[key] == full[key]
    assert cut["finished"] == 2 and full["all"]["finished"] == 3


def test_loom_worker_process_times_the_whole_process_and_the_loop() -> None:
    out = sbs.run_loom_process("fcfs", 3, "estimator", Path("."), to_completion=False)
    assert out["status"] == "ok" and out["submitted"] >= 1
    assert 0.0 < out["wall_s"] < out["process_wall_s"]
