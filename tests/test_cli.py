"""The `loom` command through its public interface (typer's runner)."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from loom.cli.main import app

runner = CliRunner()

TRACE = """#job id,arrival time (sec),topology,shape,size,duration (sec)
0,0.0,CLOS,8,8,100.0
1,10.0,CLOS,8+8,16,50.0
2,10.0,CLOS,1,1,0.0
3,20.0,CLOS,8+8+8+8+8+8+8+8+8+8+8+8+8+8+8+8+8+8,144,30.0
4,25.0,CLOS,8,300,30.0
"""


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(TRACE)
    return path


def test_simulate_writes_all_outputs(trace, tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(app, ["simulate", "--trace", f"rfold:{trace}", "--cluster", "arnold-i", "--policy", "easy",
                              "--placer", "gpu-packing", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == 5 and summary["finished"] == 4 and summary["rejected"] == 1
    for key in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "p99_queue_s", "makespan_s",
                "gpu_utilization", "sim_wall_s", "events_per_s", "decision_ms_median", "decision_ms_p99"):
        assert key in summary
    # by hand (every figure is checked the same way in test_metric_values.py): jobs 0-2 start on
    # arrival; job 3 needs all 144 GPUs and waits for job 0 (ends at 100), then runs 100-130.
    # JCT 100, 50, 0, 110 (sorted 0 50 100 110); queueing 0, 0, 0, 80
    assert summary["avg_jct_s"] == pytest.approx(260 / 4) and summary["p50_jct_s"] == pytest.approx(75.0)
    assert summary["p99_jct_s"] == pytest.approx(100 + 0.97 * 10)  # rank 0.99 × 3 = 2.97
    assert summary["avg_queue_s"] == pytest.approx(20.0) and summary["p99_queue_s"] == pytest.approx(0.97 * 80)
    assert summary["makespan_s"] == 130.0
    # GPU-seconds 8 × 100 + 16 × 50 + 1 × 0 + 144 × 30 = 5920 of 144 × 130
    assert summary["busy_gpu_seconds"] == 5920.0
    assert summary["gpu_utilization"] == pytest.approx(5920 / (144 * 130))
    jobs = pl.read_parquet(out / "jobs.parquet")
    assert jobs.height == 5
    assert {"queue_s", "jct_s", "nodes", "core_spanned", "minipod_spanned", "leaf_spanned", "preemptions"} <= set(
        jobs.columns)
    big = jobs.filter(pl.col("job_id") == "3").row(0, named=True)
    assert big["nodes"] == 18 and big["minipod_spanned"] == 3 and big["start"] == 100.0
    rejected = jobs.filter(pl.col("job_id") == "4").row(0, named=True)
    assert rejected["state"] == "rejected" and "300" in rejected["reason"]
    decisions = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    assert [d["decision"] for d in decisions] == ["start"] * 4
    assert all(d["reason"] for d in decisions)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 0 and manifest["config"]["policy"]["name"] == "easy"
    assert manifest["loom_version"]


def test_simulate_says_why_jobs_were_rejected(tmp_path):
    """Work-only traces need a speed model that derives time; the command says so, and an
    empty run still writes its report."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["simulate", "--trace", "arena-philly", "--cluster", "arena-1280", "--policy",
                              "gavel-arena", "--limit", "5", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # rich wraps long lines
    assert "5 job(s) rejected; 5 of them like this one: no duration" in said
    assert "--speed-model estimator" in said
    assert (out / "report.html").is_file()
    assert json.loads((out / "summary.json").read_text())["rejected"] == 5


def test_config_file_with_flag_overrides(trace, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cluster: arnold-i\ntrace: rfold:{trace}\npolicy: sjf\nseed: 3\n"
                   f"outputs:\n  dir: {tmp_path / 'fromfile'}\n  decision_log: false\n")
    out = tmp_path / "override"
    res = runner.invoke(app, ["simulate", "--config", str(cfg), "--policy", "fcfs", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["policy"]["name"] == "fcfs" and manifest["seed"] == 3
    assert not (out / "decisions.jsonl").exists()


@pytest.mark.parametrize(
    "content, expected",
    [
        ("policy: fcfs\nseeed: 1\n", "seeed"),
        ("round_interval_s: -5\n", "round_interval_s"),
        ("policy: [oops\n", "line"),
        ("outputs:\n  dir: x\n  extra: 1\n", "outputs.extra"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, content, expected):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(content)
    res = runner.invoke(app, ["simulate", "--config", str(cfg), "-q"])
    assert res.exit_code == 2
    assert str(cfg) in res.output and expected in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--policy", "fifo"], "unknown policy 'fifo'"),
        (["--placer", "bestfit"], "did you mean best-fit"),
        (["--cluster", "nowhere"], "unknown cluster 'nowhere'"),
        (["--trace", "rfold:/does/not/exist.csv"], "trace file not found"),
        (["--trace", "csvv:/x.csv"], "unknown trace format 'csvv'"),
    ],
)
def test_unknown_names_are_clear_errors(trace, tmp_path, args, expected):
    base = ["simulate", "--trace", f"rfold:{trace}", "--cluster", "arnold-i", "--out", str(tmp_path / "o"), "-q"]
    res = runner.invoke(app, base + args)
    assert res.exit_code == 2, res.output
    assert expected in res.output and "Traceback" not in res.output


def test_malformed_trace_row_names_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(TRACE.replace("10.0,CLOS,1,1,0.0", "10.0,CLOS,1,one,0.0"))
    res = runner.invoke(app, ["simulate", "--trace", f"rfold:{bad}", "--cluster", "arnold-i", "-q",
                              "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert f"{bad}, line 4, field 'size': not an integer: 'one'" in res.output


def test_clusters_list_and_show():
    res = runner.invoke(app, ["clusters", "list"])
    assert res.exit_code == 0 and "philly" in res.output and "arnold-iii" in res.output
    res = runner.invoke(app, ["clusters", "show", "arnold-ii", "--json"])
    info = json.loads(res.output)
    assert info["nodes"] == 438 and info["gpus"] == 3504
    assert [t["switches"] for t in info["tiers"]] == [1, 5, 30]
    res = runner.invoke(app, ["clusters", "show", "philly"])
    assert "P40" in res.output and "rack" in res.output


def test_plugins_lists_registries():
    res = runner.invoke(app, ["plugins"])
    assert res.exit_code == 0
    for name in ("fcfs", "easy", "sjf", "priority", "best-fit", "gpu-packing", "rfold", "loom.policies"):
        assert name in res.output


def test_example_config_is_valid():
    from pathlib import Path

    from loom.config import load_config

    cfg = load_config(Path(__file__).parents[1] / "examples" / "philly-easy.yaml")
    assert cfg.policy.name == "easy" and cfg.failures[0].node == "m100"


LONG_TRACE = "#job id,arrival time (sec),topology,shape,size,duration (sec)\n" + "".join(
    f"{i},{600.0 * i},CLOS,8+8,16,{40_000.0 + 500 * i}\n" for i in range(6))


def test_simulate_with_failures_checkpoints_and_recovery(tmp_path):
    trace = tmp_path / "long.csv"
    trace.write_text(LONG_TRACE)
    out = tmp_path / "faults"
    res = runner.invoke(app, ["simulate", "--trace", f"rfold:{trace}", "--cluster", "arnold-i", "--failures",
                              "rate:0.5", "--checkpoint", "sync", "--checkpoint-interval", "30m", "--recovery",
                              "topology", "--spares", "1", "--no-report", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 6
    assert summary["recoveries"] >= 1 and summary["gpu_hours_lost_to_failures"] > 0
    assert summary["gpu_hours_checkpointing"] > 0 and 0 < summary["goodput_fraction"] < 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["interruptions"]["checkpoint_interval_s"] == 1800.0
    assert manifest["config"]["recovery"] == {"replacement": "topology", "spares_per_minipod": 1}


@pytest.mark.parametrize("args,expected", [
    (["--checkpoint-interval", "soon"], "--checkpoint-interval"),
    (["--checkpoint", "weekly"], "checkpoint_mode"),
    (["--failures", "rate:lots"], "failures"),
    (["--failures", "/no/such/faults.json"], "failures"),
    (["--recovery", "pray"], "recovery.replacement"),
    (["--job-failures", "gremlins"], "job_failures"),
])
def test_bad_failure_settings_are_clear_errors(trace, tmp_path, args, expected):
    res = runner.invoke(app, ["simulate", "--trace", f"rfold:{trace}", "--cluster", "arnold-i", "-q",
                              "--out", str(tmp_path / "x"), *args])
    assert res.exit_code == 2, res.output
    assert expected in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("policy,expected_jobs", [("drop", 2), ("keep", 3)])
def test_recorded_failures_are_not_counted_twice_when_node_failures_are_injected(tmp_path, policy, expected_jobs):
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_time,gpus,duration,final_status\n"
                     "a,0,8,5000,completed\nb,10,8,300,failed\nc,20,8,4000,completed\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"trace: csv:{trace}\ncluster: arnold-i\nfailures_from: 'rate:0.01'\n"
                   f"recorded_failures: {policy}\noutputs: {{dir: {tmp_path / 'out'}, report: false}}\n")
    res = runner.invoke(app, ["simulate", "--config", str(cfg), "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["jobs"] == expected_jobs
