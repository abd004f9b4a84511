"""`loom simulate` and its run directory, through the command: runs are never overwritten
without --force, dropped and rejected jobs are always said, --json, --version, the summary
table's labels and units, and the status shown while the report is written."""

from __future__ import annotations

import io
import json
import re
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from typing import get_args

import pytest
from rich.console import Console
from typer.testing import CliRunner

import loom
from loom.cli import main as cli_main
from loom.cli.main import app
from loom.config import SimConfig

runner = CliRunner()
JOBS = "job_id,submit_time,gpus,duration,final_status\na,0,8,500,completed\nb,10,8,300,failed\nc,20,8,400,completed\n"
TOO_BIG = "job_id,submit_time,gpus,duration\na,0,8,100\nhuge,5,100000,100\n"


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text(JOBS)
    return path


def simulate(trace, *args: str):
    return runner.invoke(app, ["simulate", "--trace", f"csv:{trace}", "--cluster", "arnold-i", *args])


def one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def manifest(out) -> dict:
    return json.loads((out / "manifest.json").read_text())


# ------------------------------------------------------------------ 1. run directories
@pytest.mark.parametrize("via", ["--out", "config"])
def test_a_second_run_into_a_chosen_directory_is_refused(trace, tmp_path, via):
    out = tmp_path / "runs" / "easy"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"trace: csv:{trace}\ncluster: arnold-i\npolicy: easy\noutputs: {{dir: {out}, report: false}}\n")
    where = ["--out", str(out)] if via == "--out" else []
    first = runner.invoke(app, ["simulate", "--config", str(cfg), "-q", *where])
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, ["simulate", "--config", str(cfg), "--policy", "sjf", "-q", *where])
    assert second.exit_code == 2, second.output
    said = one_line(second.output)
    assert f"{out}: already holds a run (policy easy: summary.json" in said
    assert "--out DIR" in said and "--force" in said
    assert len(second.output.strip().splitlines()) == 1 and "Traceback" not in second.output
    assert manifest(out)["config"]["policy"]["name"] == "easy"  # the first run is untouched


def test_force_replaces_the_run_and_removes_its_stale_files(trace, tmp_path):
    out = tmp_path / "run"
    assert simulate(trace, "--out", str(out), "--no-report", "-q").exit_code == 0
    (out / "report.html").write_text("<html>the old run's report</html>")  # as a run with a report leaves it
    (out / "notes.txt").write_text("mine")  # not a run file: kept
    res = simulate(trace, "--out", str(out), "--policy", "sjf", "--no-report", "--no-decision-log", "--force", "-q")
    assert res.exit_code == 0, res.output
    assert not (out / "report.html").exists() and not (out / "decisions.jsonl").exists()
    assert (out / "notes.txt").read_text() == "mine"
    written = ["summary.json", "jobs.parquet", "manifest.json"]
    assert f"outputs in {out}: {', '.join(written)}" in one_line(res.output)
    assert manifest(out)["outputs"] == written and manifest(out)["config"]["policy"]["name"] == "sjf"


def test_the_default_directory_is_scratch_and_replaced(trace, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert simulate(trace, "--no-report", "-q").exit_code == 0
    res = simulate(trace, "--no-report", "--policy", "sjf", "-q")
    assert res.exit_code == 0, res.output
    assert "replacing the run in runs/latest (policy fcfs:" in one_line(res.stderr)
    assert manifest(tmp_path / "runs" / "latest")["config"]["policy"]["name"] == "sjf"


# ------------------------------------------------------------------ 2. --out naming a file
@pytest.mark.parametrize("sub", ["", "sub"])
def test_out_naming_a_file_is_one_clear_line(trace, tmp_path, sub):
    blocker = tmp_path / "afile"
    blocker.write_text("keep me")
    res = simulate(trace, "--out", str(blocker / sub if sub else blocker), "-q")
    assert res.exit_code == 2, res.output
    assert "existing file" in res.output and "--out DIR" in res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert blocker.read_text() == "keep me"


# ------------------------------------------------------------------ 3. dropped and rejected jobs
def test_jobs_recorded_as_failed_are_said_when_dropped(trace, tmp_path):
    out = tmp_path / "drop"
    res = simulate(trace, "--failures", "rate:0.01", "--no-report", "--out", str(out), "-q")
    assert res.exit_code == 0, res.output
    assert ("dropped 1 of 3 jobs: recorded as failed in the trace (recorded_failures: drop; "
            "--recorded-failures keep to replay them)") in one_line(res.stderr)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == 2 and summary["trace_jobs"] == 3
    assert summary["dropped"] == {"count": 1, "reasons": {"recorded as failed": 1}}


def test_recorded_failures_keep_replays_them(trace, tmp_path):
    out = tmp_path / "keep"
    res = simulate(trace, "--failures", "rate:0.01", "--recorded-failures", "keep", "--no-report", "--out", str(out),
                   "-q")
    assert res.exit_code == 0, res.output
    assert "dropped" not in res.stderr and "dropped before the run" not in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == 3 and summary["dropped"] == {"count": 0, "reasons": {}}
    assert manifest(out)["config"]["recorded_failures"] == "keep"


def test_recorded_failures_flag_takes_the_config_values(trace, tmp_path):
    assert cli_main.RECORDED_FAILURES == get_args(SimConfig.model_fields["recorded_failures"].annotation)
    bad = simulate(trace, "--failures", "rate:0.01", "--recorded-failures", "forget", "--out", str(tmp_path / "o"))
    assert bad.exit_code == 2 and "recorded_failures" in bad.output and "Traceback" not in bad.output
    alone = simulate(trace, "--recorded-failures", "keep", "--out", str(tmp_path / "o"))
    assert alone.exit_code == 2 and "--recorded-failures" in alone.output and "--failures" in alone.output


def test_the_limit_and_the_trace_format_s_skips_are_said(tmp_path):
    acme = tmp_path / "acme.csv"
    acme.write_text("job_id,gpu_num,type,state,submit_time,start_time,end_time\n"
                    "1,8,Pretrain,COMPLETED,2023-05-17 11:00:00,2023-05-17 11:00:10,2023-05-17 11:10:00\n"
                    "2,0,Other,COMPLETED,2023-05-17 11:01:00,2023-05-17 11:01:10,2023-05-17 11:02:00\n"
                    "3,8,SFT,COMPLETED,2023-05-17 11:02:00,2023-05-17 11:02:10,2023-05-17 11:12:00\n"
                    "4,8,SFT,COMPLETED,2023-05-17 11:03:00,2023-05-17 11:03:10,2023-05-17 11:13:00\n")
    out = tmp_path / "acme"
    res = runner.invoke(app, ["simulate", "--trace", f"acme:{acme}", "--cluster", "arnold-i", "--limit", "2",
                              "--no-report", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    said = one_line(res.stderr)
    assert "dropped 2 of 4 jobs: 1 cpu-only (rows the trace format skips" in said
    assert "1 after the first 2 by arrival (--limit" in said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dropped"] == {"count": 2, "reasons": {"cpu-only": 1, "beyond limit_jobs": 1}}
    assert summary["jobs"] + summary["dropped"]["count"] == summary["trace_jobs"] == 4


def test_rejected_jobs_are_counted_with_their_reasons(tmp_path):
    trace = tmp_path / "big.csv"
    trace.write_text(TOO_BIG)
    out = tmp_path / "big"
    res = simulate(trace, "--no-report", "--out", str(out), "-q")
    assert res.exit_code == 0, res.output
    assert "1 job(s) rejected; 1 of them like this one: asks for 100000 GPUs" in one_line(res.stderr)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rejected"] == 1 and summary["rejected_reasons"] == {"larger than the cluster": 1}


# ------------------------------------------------------------------ 4. --version
def test_version_comes_from_the_installed_package():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"loom {installed_version('loom-sched')}"


def test_version_falls_back_to_the_module_attribute(monkeypatch):
    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr("importlib.metadata.version", missing)
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"loom {loom.__version__}"


# ------------------------------------------------------------------ 5. --json
def test_json_prints_the_summary_alone_on_stdout(trace, tmp_path):
    out = tmp_path / "j"
    res = simulate(trace, "--json", "--no-report", "--limit", "2", "--out", str(out))  # no -q: progress too
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == json.loads((out / "summary.json").read_text())
    assert "outputs in" in res.stderr and "dropped 1 of 3 jobs" in res.stderr and "writing outputs" in res.stderr


# ------------------------------------------------------------------ 6. the summary table
def test_summary_table_has_labels_and_one_unit_format_per_kind(trace, tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    res = simulate(trace, "--no-report", "--out", str(tmp_path / "t"), "-q")
    assert res.exit_code == 0, res.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in res.stdout.splitlines() if line.count("│") == 3}
    assert not any("_" in label for label in rows)  # human labels, no raw keys
    duration = re.compile(r"^([\d,]+ s \(\d+\.\d (min|h|d)\)|\d+\.\d s|0\.\d{3} s)$")  # "2,043 s (34.0 min)"
    for label in ("JCT, mean", "JCT, median", "JCT, p99", "queueing delay, mean", "makespan", "simulation wall time"):
        assert duration.match(rows[label]), (label, rows[label])
    assert rows["makespan"] == "500 s (8.3 min)"  # a runs 0 → 500; b and c end before
    assert rows["simulation speed"].endswith(" events/s") and "(" not in rows["simulation speed"]
    assert rows["GPU utilisation"].endswith(" %") and rows["decision latency, p99"].endswith(" ms")
    assert rows["jobs simulated"] == "3" and "…" not in res.stdout


def test_tables_are_not_cut_at_80_columns_when_piped():
    # a fresh process: the console reads $COLUMNS when it is made (pytest-xdist's workers set it)
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    res = subprocess.run([sys.executable, "-m", "loom.cli.main", "clusters", "list"], env=env,
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert "…" not in res.stdout and max(len(line) for line in res.stdout.splitlines()) > 80


# ------------------------------------------------------------------ 7. status while writing the report
def test_writing_the_report_is_said_after_the_simulation(trace, tmp_path):
    res = simulate(trace, "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    assert "writing report.html…" in res.stderr
    assert (tmp_path / "r" / "report.html").is_file()
    quiet = simulate(trace, "--out", str(tmp_path / "q"), "--no-report")
    assert "writing report.html" not in quiet.stderr


def test_a_terminal_sees_a_spinner_after_the_bar(trace, tmp_path, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(cli_main, "err_console", Console(file=screen, force_terminal=True, width=120))
    res = simulate(trace, "--out", str(tmp_path / "tty"))
    assert res.exit_code == 0, res.output
    shown = screen.getvalue()
    assert "simulating" in shown and "writing report.html…" in shown
    assert shown.index("simulating") < shown.index("writing report.html…")


# ------------------------------------------------------------------ load scaling and sanity warnings
def test_load_and_repeat_scale_the_trace_and_are_recorded(trace, tmp_path):
    out = tmp_path / "scaled"
    res = simulate(trace, "--no-report", "--out", str(out), "-q", "--load", "2", "--repeat", "3", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["jobs"] == 9 and summary["load_scaling"] == {"load": 2.0, "repeat": 3}
    assert manifest(out)["config"]["load"] == 2.0 and manifest(out)["config"]["repeat"] == 3
    # arrivals 0, 5, 10 (gaps halved), copies every 15 s: the last copy's "c#3" arrives at 40 and runs 400 s
    import polars as pl

    jobs = pl.read_parquet(out / "jobs.parquet").sort("submit")
    assert jobs["job_id"].to_list()[-1] == "c#3" and jobs["submit"].to_list()[-1] == 40.0


@pytest.mark.parametrize("flags", [["--load", "0"], ["--repeat", "0"]])
def test_bad_scaling_flags_are_one_clear_line(trace, tmp_path, flags):
    res = simulate(trace, "--no-report", "--out", str(tmp_path / "bad"), "-q", *flags)
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_an_implausible_run_warns_on_the_terminal_and_in_the_summary(tmp_path):
    # two 1-GPU jobs of an hour, three days apart, on arnold-i's GPUs: utilisation far below 10%
    trace = tmp_path / "light.csv"
    trace.write_text("job_id,submit_time,gpus,duration\na,0,1,3600\nb,259200,1,3600\n")
    out = tmp_path / "light"
    res = simulate(trace, "--no-report", "--out", str(out), "-q")
    assert res.exit_code == 0, res.output
    assert "warning: GPU utilisation is" in one_line(res.stderr) and "--load X" in one_line(res.stderr)
    summary = json.loads((out / "summary.json").read_text())
    assert [w["code"] for w in summary["warnings"]] == ["low-utilization"]


def test_the_report_shows_the_warnings_first(tmp_path):
    trace = tmp_path / "light.csv"
    trace.write_text("job_id,submit_time,gpus,duration\na,0,1,3600\nb,259200,1,3600\n")
    out = tmp_path / "light"
    res = simulate(trace, "--out", str(out), "-q")
    assert res.exit_code == 0, res.output
    page = (out / "report.html").read_text()
    assert page.index("Read this first") < page.index("id='summary'") and "GPU utilisation is" in page


def test_a_config_field_the_run_refuses_is_located_in_the_file(trace, tmp_path):
    cfg = tmp_path / "l.yaml"
    cfg.write_text(f"trace: csv:{trace}\ncluster: arnold-i\nlaunch:\n  bogus: 1\n")
    res = runner.invoke(app, ["simulate", "--config", str(cfg), "--out", str(tmp_path / "o"), "-q"])
    assert res.exit_code == 2 and f"{cfg}:3: field 'launch': unknown setting(s) bogus" in one_line(res.output)
