"""The `launch:` config section and `loom simulate --launch`: modelled launch latency and failures
through the public paths (the CLI and `loom.run.run`), and the summary's set-up figures."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from loom.cli.main import app
from loom.config import load_config
from loom.run import run

runner = CliRunner()

# arnold-i: 18 nodes × 8 GPUs. Four classes, no contention: every job starts on arrival.
TRACE = ("job_id,submit_time,gpus,duration,job_class\n"
         "pre,0,64,1000,pretrain\n"
         "ev,10,8,200,eval\n"
         "sft,20,16,500,sft\n"
         "dbg,30,8,50,debug\n")
# two whole-cluster jobs, back to back: the second waits for the first's launch and run
SERIAL = "job_id,submit_time,gpus,duration\nfirst,0,144,100\nsecond,10,144,100\n"
# many small jobs, so that launches fail now and then
MANY = "job_id,submit_time,gpus,duration,job_class\n" + "".join(
    f"j{i},{30 * i},8,{300 + 10 * i},{('eval', 'sft', 'debug')[i % 3]}\n" for i in range(40))


def _simulate(tmp_path, trace_text, *args, name="run"):
    trace = tmp_path / f"{name}.csv"
    trace.write_text(trace_text)
    out = tmp_path / name
    res = runner.invoke(app, ["simulate", "--trace", f"csv:{trace}", "--cluster", "arnold-i", "--no-report", "-q",
                              "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    jobs = pl.read_parquet(out / "jobs.parquet")
    return json.loads((out / "summary.json").read_text()), {r["job_id"]: r for r in jobs.iter_rows(named=True)}


# ------------------------------------------------------------------ (a) errors
@pytest.mark.parametrize("section, expected", [
    ("launch:\n  latency_s:\n    eval: soon\n", "launch.latency_s.eval"),
    ("launch:\n  latency_s:\n    eval: -5\n", "launch.latency_s.eval"),
    ("launch:\n  latency_s:\n    evaluation: 60\n", "launch.latency_s.evaluation"),
    ("launch:\n  latency_s: [60]\n", "launch.latency_s"),
    ("launch:\n  latncy_s: {eval: 60}\n", "latncy_s"),
    ("launch:\n  profile: azure\n", "launch.profile"),
    ("launch: azure\n", "launch.profile"),
    ("launch:\n  failure_probability: 1.5\n", "launch.failure_probability"),
    ("launch:\n  default_s: .inf\n", "launch.default_s"),
    ("launch:\n  seed: [1]\n", "launch.seed"),
    ("launch: 60\n", "launch"),
])
def test_bad_launch_section_is_a_clear_error(tmp_path, section, expected):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"cluster: arnold-i\ntrace: csv:{trace}\noutputs: {{dir: {tmp_path / 'o'}, report: false}}\n"
                   + section)
    res = runner.invoke(app, ["simulate", "--config", str(cfg), "-q"])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())  # rich wraps long lines
    assert f"field '{expected}" in said or (expected == "latncy_s" and "unknown setting(s) latncy_s" in said)
    assert "Traceback" not in res.output


def test_bad_launch_flag_is_a_clear_error(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    res = runner.invoke(app, ["simulate", "--trace", f"csv:{trace}", "--cluster", "arnold-i", "-q",
                              "--out", str(tmp_path / "o"), "--launch", "slow"])
    assert res.exit_code == 2, res.output
    assert "--launch" in res.output and "unknown launch profile 'slow'" in res.output
    assert "Traceback" not in res.output


# ------------------------------------------------------------------ (b) latency
def test_launch_acme_adds_a_minute_to_every_class(tmp_path):
    off, jobs_off = _simulate(tmp_path, TRACE, name="off")
    on, jobs_on = _simulate(tmp_path, TRACE, "--launch", "acme", name="on")
    assert off["avg_setup_s"] == 0 and off["launch_failures"] == 0
    assert on["avg_setup_s"] == 60 and on["launch_failures"] == 0 and on["finished"] == 4
    for job_id, before in jobs_off.items():
        after = jobs_on[job_id]
        assert before["setup_s"] == 0 and after["setup_s"] == 60
        assert after["start"] == before["start"]  # GPUs committed at once; the launch takes the minute
        assert after["end"] == before["end"] + 60
    by_class = pl.DataFrame(list(jobs_on.values())).group_by("job_class").agg(pl.col("setup_s").mean())
    assert dict(by_class.iter_rows()) == {"pretrain": 60.0, "eval": 60.0, "sft": 60.0, "debug": 60.0}


def test_a_queued_job_waits_for_the_launch_before_it(tmp_path):
    _, off = _simulate(tmp_path, SERIAL, name="off")
    _, on = _simulate(tmp_path, SERIAL, "--launch", "acme", name="on")
    assert (off["first"]["end"], off["second"]["start"], off["second"]["end"]) == (100, 100, 200)
    assert (on["first"]["end"], on["second"]["start"], on["second"]["end"]) == (160, 160, 320)
    assert on["second"]["queue_s"] == off["second"]["queue_s"] + 60


def test_per_class_latencies_through_run(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cluster: arnold-i\ntrace: csv:{trace}\noutputs: {{dir: {tmp_path / 'o'}, report: false}}\n"
                   "launch:\n  profile: acme\n  latency_s: {eval: 90, debug: 0}\n")
    outputs = run(load_config(cfg))
    setup = {j.job_id: j.setup_s for j in outputs.result.jobs}
    assert setup == {"pre": 60.0, "ev": 90.0, "sft": 60.0, "dbg": 0.0}
    assert outputs.summary["avg_setup_s"] == pytest.approx(210 / 4)
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["config"]["launch"] == {"profile": "acme", "latency_s": {"eval": 90, "debug": 0}}


def test_zero_latency_section_and_launch_none_reproduce_instant_launches(tmp_path):
    _, jobs = _simulate(tmp_path, MANY, name="base")
    trace = tmp_path / "base.csv"
    for name, section, flags in (("zero", "launch: {}\n", []), ("flag-none", "launch: acme\n", ["--launch", "none"]),
                                 ("str-none", "launch: none\n", [])):
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(f"cluster: arnold-i\ntrace: csv:{trace}\noutputs: {{dir: {tmp_path / name}, report: false}}\n"
                       + section)
        res = runner.invoke(app, ["simulate", "--config", str(cfg), "-q", *flags])
        assert res.exit_code == 0, res.output
        other = pl.read_parquet(tmp_path / name / "jobs.parquet")
        assert other.select("job_id", "start", "end", "setup_s").rows() == [
            (r["job_id"], r["start"], r["end"], r["setup_s"]) for r in jobs.values()]


def test_launch_flag_keeps_the_section_s_other_fields(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cluster: arnold-i\ntrace: csv:{trace}\nlaunch: {{latency_s: {{eval: 5}}}}\n"
                   "interruptions: null\n")
    loaded = load_config(cfg, {"launch.profile": "acme", "interruptions.checkpoint_mode": "sync"})
    assert loaded.launch == {"latency_s": {"eval": 5}, "profile": "acme"}
    assert loaded.interruptions == {"checkpoint_mode": "sync"}  # a null section turned on by a flag


# ------------------------------------------------------------------ (c) failures
def test_launch_failures_are_counted_and_every_job_finishes(tmp_path):
    trace = tmp_path / "many.csv"
    trace.write_text(MANY)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cluster: arnold-i\ntrace: csv:{trace}\nseed: 3\noutputs: {{dir: {tmp_path / 'o'}, report: false}}\n"
                   "launch: {profile: acme, failure_probability: 0.3}\n")
    outputs = run(load_config(cfg))
    s, result = outputs.summary, outputs.result
    assert s["finished"] == s["jobs"] == 40 and s["unfinished"] == 0
    modelled = [r for _, _, r in result.record.failed_decisions if "modelled launch failure" in r]
    assert s["launch_failures"] == len(modelled) > 0
    attempts = {j.job_id: round(j.setup_s / 60) for j in result.jobs}
    assert all(j.setup_s == 60 * attempts[j.job_id] for j in result.jobs)  # whole failed launches counted
    assert sum(attempts.values()) == 40 + s["launch_failures"]
    assert s["avg_setup_s"] == pytest.approx(60 * (40 + s["launch_failures"]) / 40)
    for job in result.jobs:  # the run is its recorded duration after the last (successful) launch
        assert job.end_time == pytest.approx(job.first_start + 60 + job.spec.duration)
    again = run(load_config(cfg, {"outputs.dir": str(tmp_path / "again")})).summary
    assert again["launch_failures"] == s["launch_failures"]  # deterministic for a seed
